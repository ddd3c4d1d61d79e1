"""The audit trail as an auditor reads it, with the real daemon (the root helper, its policy
process, the front, real accounts, a real logrotate): fields padded with spaces forge no column;
kernel refusals, failed logins, unknown tools, calls refused before routing and logins the front
refuses are all recorded, as what they are, where the views find them; a restart is no policy
change; an expired rule is named; a failed reload keeps what was attempted; a find says what it
looked for; and `verify` fails when history was deleted or opens with the writer's loss alert.
Root only. The last tests delete history: the log stays broken after them."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import ssl
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpd.client.api import Client, RPCError
from tests.support.audit import CALL_TIMEOUT, call, mcpd, wait_for_record
from tests.support.privsep_fixture import PrivsepDaemon, privsep_daemon  # noqa: F401  (fixture)
from tests.support.rootonly import root_prerequisite

REFUSED_BY_OS = "refused_by_os"  # (mcpd.common.audit.records.REFUSED_BY_OS)

pytestmark = pytest.mark.root


def conf(d: PrivsepDaemon) -> tuple[str, str]:
    return ("--config", str(d.config_path))


def access(d: PrivsepDaemon) -> list[dict[str, Any]]:
    return [json.loads(x) for x in d.access_path.read_text().splitlines()] if d.access_path.exists() else []


def call_args(d: PrivsepDaemon, principal: str, tool: str, args: dict[str, Any]) -> Any:
    async def go() -> Any:
        async with Client(d.url, d.tokens[principal], d.cacert, timeout=CALL_TIMEOUT) as c:
            try:
                return await c.call_tool(tool, args, check=False)
            except RPCError as exc:
                return exc

    return asyncio.run(go())


def post_login(d: PrivsepDaemon, body: Any) -> int:
    with httpx.Client(verify=ssl.create_default_context(cafile=d.cacert), timeout=30) as c:
        return c.post(d.url + "/login", json=body).status_code


def test_spaces_and_long_fields_forge_no_column(privsep_daemon: PrivsepDaemon) -> None:
    """bob (no grant) asks for a path that reads like an accepted call, padded with components of
    250 spaces so that the real decision would sit 3,000 columns to the right; and, with no
    token, a login whose account name reads like a privileged call."""
    d = privsep_daemon
    fake = f"/x  accept  granted  25  rule: users.{d.accounts['alice'].name} files/read paths {d.app} (mcp-sudo.yaml:3)"
    path = fake + "".join("/" + " " * 250 for _ in range(12))
    res = call(d, "bob", path, privileged=True)
    assert res["structuredContent"]["error"]["code"] == "PERMISSION_DENIED"
    line = mcpd("audit", "tail", "--user", "bob", "-n", "1", *conf(d)).stdout.rstrip("\n")
    assert len(line) < 500, len(line)
    assert f'"{fake}' in line and f"\u2026[{len(path)} chars]" in line  # one quoted field, shortened, its length
    after = line.split(f"\u2026[{len(path)} chars]", 1)[1]
    assert after.startswith('  reject  "no grant covers this path" [PERMISSION_DENIED]'), line

    user = f"alice({d.accounts['alice'].name}) privileged   files/read     /etc/shadow  accept"[:64]
    assert post_login(d, {"user": user, "password": "x"}) == 401
    rec = wait_for_record(d, lambda r: r.get("tool") == "login" and r.get("os_user") == user)
    assert rec["event"] == "login" and rec["decision"] == "reject"
    shown = mcpd("audit", "tail", "--event", "login", "-n", "1", *conf(d)).stdout
    assert f'"{user}"' in shown and "  login  " in shown, shown


def test_a_kernel_refusal_on_the_unprivileged_route_is_a_refusal(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    res = call(d, "alice", d.log_file, privileged=False)  # root's 0600 file: alice's own account may not
    assert res["structuredContent"]["error"]["code"] == "PERMISSION_DENIED"
    rec = [r for r in access(d) if r.get("requested_path") == str(d.log_file)][-1]
    assert (rec["route"], rec["decision"], rec["outcome"]) == ("unprivileged", REFUSED_BY_OS, "PERMISSION_DENIED")
    tail = mcpd("audit", "tail", "--access", "--decision", "reject", "--json", *conf(d))
    assert str(d.log_file) in [json.loads(x).get("requested_path") for x in tail.stdout.splitlines()]


def test_failed_logins_are_logins_found_by_principal_on_the_login_route(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    account = d.accounts["alice"].name
    assert post_login(d, {"user": account, "password": "not her password"}) == 401
    rec = wait_for_record(d, lambda r: r.get("tool") == "login" and r.get("os_user") == account)
    assert (rec["event"], rec["decision"], rec["user"], rec["route"]) == ("login", "reject", "alice", "login")
    for flt in (("--user", "alice"), ("--user", account)):
        shown = mcpd("audit", "tail", "--event", "login", *flt, "-n", "1", *conf(d)).stdout.split()
        assert shown[3] == "login" and shown[6] == "reject", shown  # the route, the decision


def test_calls_refused_before_routing_and_by_the_front_leave_a_record_the_views_find(
        privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    res = call_args(d, "bob", "files/nope", {"path": "/etc/shadow", "privileged": True})
    assert isinstance(res, RPCError) and res.rpc_code == -32602
    rec = [r for r in access(d) if r.get("tool") == "files/nope"][-1]
    assert (rec["route"], rec["decision"], rec["reason"]) == ("privileged", "reject", "unknown tool")

    res = call(d, "bob", f"{d.app}/x\x00y", privileged=True)  # refused by the front: never routed
    assert res["structuredContent"]["error"]["code"] == "INVALID_ARGUMENT"
    assert not any(r.get("requested_path") == f"{d.app}/x\x00y" for r in d.audit())
    shown = mcpd("audit", "tail", "--user", "bob", "--decision", "reject", "-n", "2", *conf(d)).stdout.splitlines()
    assert "files/nope" in shown[0] and shown[0].endswith("[access log]"), shown  # from the audit log's own view
    assert "/x\\x00y" in shown[1] and shown[1].endswith("[access log]"), shown

    assert post_login(d, {"user": "u", "password": "p", "extra": 1}) == 400  # the front answers it alone
    rec = [r for r in access(d) if r.get("event") == "login"][-1]
    assert (rec["decision"], rec["outcome"], rec["reason"]) == ("reject", "HTTP_400", "malformed login request")


def test_a_find_records_what_it_looked_for(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    call_args(d, "alice", "files/find", {"root": str(d.app), "name": "*.key", "type": "file", "max_depth": 2,
                                         "privileged": True})
    rec = wait_for_record(d, lambda r: r.get("tool") == "files/find" and r.get("find_name") == "*.key")
    assert (rec["find_type"], rec["max_depth"], rec["requested_path"]) == ("file", 2, str(d.app))
    call_args(d, "alice", "files/find", {"root": "/tmp", "name": "my secrets*"})
    rec = [r for r in access(d) if r.get("tool") == "files/find"][-1]
    assert rec["find_name"] == "my secrets*" and rec["route"] == "unprivileged"
    shown = mcpd("audit", "tail", "--access", "-n", "1", *conf(d)).stdout
    assert 'name="my secrets*"' in shown, shown


def test_a_refusal_by_an_expired_rule_names_the_rule(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    grants = d.default_grants()
    next(iter(grants["users"].values()))["privileged"]["tools"]["files/read"]["expires"] = "2020-01-01T00:00:00Z"
    seq = d.audit()[-1]["seq"]
    d.write_grants(grants)
    try:
        wait_for_record(d, lambda r: r["event"] == "reload" and r["seq"] > seq and "2020-01-01" in r["reason"])
        call(d, "alice", d.log_file, privileged=True)
        rec = [r for r in d.audit() if r.get("requested_path") == str(d.log_file) and r["event"] == "reject"][-1]
        assert rec["reason"] == "no grant covers this path"
        assert f"files/read paths {d.app}" in rec["grant"] and "expired 2020-01-01T00:00:00Z" in rec["grant"], rec
    finally:
        seq = d.audit()[-1]["seq"]
        d.write_grants(d.default_grants())
        wait_for_record(d, lambda r: r["event"] == "reload" and r["seq"] > seq)


def test_a_failed_reload_records_what_was_attempted(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    broken = "users:\n  x: [unclosed\n"
    seq = d.audit()[-1]["seq"]
    d.write_grants(broken)
    try:
        rec = wait_for_record(d, lambda r: r["event"] == "reload_failed" and r["seq"] > seq)
        parts = [r for r in d.audit() if r["event"] == "reload_failed" and r["seq"] >= rec["seq"] - rec["part"] + 1]
        assert "".join(r.get("grants_text", "") for r in parts) == broken
        assert rec["sha256"] == __import__("hashlib").sha256(broken.encode()).hexdigest()
        shown = mcpd("audit", "tail", "--event", "reload_failed", "-n", "1", *conf(d)).stdout
        assert "sha256 ?" not in shown and f"sha256 {rec['sha256'][:12]}" in shown, shown
    finally:
        seq = d.audit()[-1]["seq"]
        d.write_grants(d.default_grants())
        wait_for_record(d, lambda r: r["event"] == "reload" and r["seq"] > seq)


def test_a_restart_with_the_same_grants_file_is_no_policy_change(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    seq = d.audit()[-1]["seq"]
    d.kill_helper(signal.SIGTERM)
    d.start_helper()
    rec = wait_for_record(d, lambda r: r["event"] == "reload" and r["seq"] > seq and r["part"] == 1)
    assert rec["load"] == "start" and rec["changes"] == 0, rec
    assert rec["reason"] == "daemon start: the same file as the last load" and rec["previous_sha256"] == rec["sha256"]
    shown = mcpd("audit", "tail", "--event", "reload", "-n", "2", *conf(d)).stdout.splitlines()
    assert "  start  " in shown[0] and '"daemon start: the same file as the last load"' in shown[0], shown


def logrotate_with(d: PrivsepDaemon, keeps: int) -> Path:
    """Run the real logrotate on the audit log (forced), its shipped block with ``rotate keeps``;
    returns the configuration used."""
    root_prerequisite(shutil.which("logrotate") is not None, "logrotate is not installed (apt-get install logrotate)")
    shipped = (Path(__file__).resolve().parents[2] / "etc" / "logrotate.d" / "mcpd").read_text()
    block = shipped.split("/var/log/mcpd/audit.jsonl", 1)[1].split("}", 1)[0]
    text = f"{d.audit_path}{block.replace('rotate 104', f'rotate {keeps}')}}}\n"
    path = d.state_dir / f"logrotate-{keeps}.conf"
    path.write_text(text)
    os.chmod(path, 0o644)
    proc = subprocess.run(["logrotate", "-f", "-s", str(d.state_dir / "logrotate.state"), str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return path


def test_deleted_history_fails_verify_and_logrotates_retention_does_not(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    rotated = d.audit_path.with_name(d.audit_path.name + ".1")
    call(d, "alice", d.log_file, privileged=True)
    conf_two = logrotate_with(d, 2)
    call(d, "alice", d.log_file, privileged=True)
    assert json.loads(d.audit_path.read_text().splitlines()[0])["event"] == "rotate"
    whole = mcpd("audit", "verify", *conf(d), "--logrotate", str(conf_two))
    assert whole.returncode == 0 and "chain whole (seq 1.." in whole.stdout, whole.stdout + whole.stderr
    first_kept = json.loads(d.audit_path.read_text().splitlines()[0])["seq"]
    hidden = rotated.with_name(rotated.name + ".hidden")
    os.rename(rotated, hidden)  # the only file of seq 1..first_kept-1 gone, as `rm audit.jsonl.1` would do
    try:
        out = mcpd("audit", "verify", *conf(d), "--logrotate", str(conf_two))
        assert out.returncode == 1, out.stdout
        assert f"missing: {first_kept - 1} records (seq 1..{first_kept - 1}) before this line" in out.stdout
        assert "it would still keep file 1, so they were removed by other means" in out.stdout
        allowed = mcpd("audit", "verify", *conf(d), "--since-seq", str(first_kept))
        assert allowed.returncode == 0 and f"as --since-seq {first_kept} allows" in allowed.stdout, allowed.stdout
    finally:
        os.rename(hidden, rotated)
    call(d, "alice", d.log_file, privileged=True)
    conf_one = logrotate_with(d, 1)  # rotate 1: logrotate itself removes the oldest file now
    call(d, "alice", d.log_file, privileged=True)
    assert not d.audit_path.with_name(d.audit_path.name + ".2").exists()
    out = mcpd("audit", "verify", *conf(d), "--logrotate", str(conf_one))
    assert out.returncode == 0 and "were removed by logrotate's retention: it keeps 1 rotated files" in out.stdout, \
        out.stdout + out.stderr


def test_a_log_that_opens_with_the_writers_loss_alert_fails_verify(privsep_daemon: PrivsepDaemon) -> None:
    """Stop the daemon, delete every log file but keep the head state, start it again."""
    d = privsep_daemon
    d.kill_helper(signal.SIGTERM)
    last = d.audit()[-1]["seq"]
    for p in d.audit_path.parent.iterdir():
        p.unlink()
    d.start_helper()
    alert = wait_for_record(d, lambda r: r["event"] == "alert" and r.get("missing_to") == last)
    out = mcpd("audit", "verify", *conf(d))
    assert out.returncode == 1, out.stdout
    assert f"lost: its writer recorded that records were lost: records up to seq {last}" in out.stdout
    assert f"missing: {alert['seq'] - 1} records (seq 1..{alert['seq'] - 1}) before this line" in out.stdout
    shown = mcpd("audit", "tail", "--event", "alert", *conf(d)).stdout
    assert "?" not in shown and "where the loss begins is not known" in shown, shown
