"""Records an auditor can prove (docs/REFERENCE.md §7), with the real daemon: the policy
process's chained audit log across a real logrotate run with the shipped configuration, ``mcpd
audit verify`` over it, and tampering caught at the right line. Root only (the helper runs as root)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FRONT_ENV
from tests.support.audit import REPO, call, logrotate, mcpd, wait_for_record
from tests.support.privsep_fixture import PrivsepDaemon, privsep_daemon  # noqa: F401  (fixture)

pytestmark = pytest.mark.root


def test_shipped_logrotate_uses_create_never_copytruncate() -> None:
    lines = [ln.split("#")[0].split() for ln in (REPO / "etc" / "logrotate.d" / "mcpd").read_text().splitlines()]
    words = [w for ln in lines for w in ln]
    assert "create" in words and "copytruncate" not in words and "delaycompress" in words


def test_chain_of_a_real_run_with_rotation_in_the_middle_verifies(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    for principal in ("alice", "bob", "alice"):
        call(d, principal, d.log_file, privileged=True)
    before = d.audit_path.read_bytes().splitlines(keepends=True)
    assert len(before) >= 3
    logrotate(d)
    rotated = d.audit_path.with_name(d.audit_path.name + ".1")
    assert rotated.read_bytes().splitlines(keepends=True)[-len(before):] == before
    assert d.audit_path.stat().st_size == 0 and (d.audit_path.stat().st_mode & 0o777) == 0o600
    for principal in ("alice", "bob"):
        call(d, principal, d.log_file, privileged=True)
    after = d.audit_path.read_bytes().splitlines(keepends=True)
    first = json.loads(after[0])
    assert first["prev"] == hashlib.sha256(before[-1]).hexdigest()
    assert first["seq"] == json.loads(before[-1])["seq"] + 1
    total = len(rotated.read_bytes().splitlines()) + len(after)
    out = mcpd("audit", "verify", str(rotated), str(d.audit_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{total} records" in out.stdout
    by_config = mcpd("audit", "verify", "--config", str(d.config_path))  # the rotated set, found by itself
    assert by_config.returncode == 0 and f"{total} records" in by_config.stdout, by_config.stdout + by_config.stderr


def _tampered(d: PrivsepDaemon, tmp_path: Path, change: Any) -> tuple[Path, Path]:
    rotated = d.audit_path.with_name(d.audit_path.name + ".1")
    old, new = tmp_path / "audit.jsonl.1", tmp_path / "audit.jsonl"
    shutil.copyfile(rotated, old)
    lines = d.audit_path.read_bytes().splitlines(keepends=True)
    new.write_bytes(b"".join(change(lines)))
    return old, new


@pytest.mark.root_may_skip("it tampers with the log the rotation test of this module rotated; run alone, there is none")
@pytest.mark.parametrize("kind,change,line", [
    ("edited", lambda ls: [ls[0].replace(b'"event":"', b'"event":"x', 1)] + ls[1:], 1),
    ("deleted", lambda ls: ls[:1] + ls[2:], 2),
    ("reordered", lambda ls: [ls[1], ls[0]] + ls[2:], 1),
    ("truncated", lambda ls: ls[:-1] + [ls[-1][:-20]], -1),
])
def test_tampering_with_a_real_log_is_named_at_its_line(privsep_daemon: PrivsepDaemon, tmp_path: Path, kind: str,
                                                         change: Any, line: int) -> None:
    d = privsep_daemon
    rotated = d.audit_path.with_name(d.audit_path.name + ".1")
    if not rotated.exists():
        pytest.skip("needs the rotation test of this module first")
    while len(d.audit_path.read_bytes().splitlines()) < 4:
        call(d, "alice", d.log_file, privileged=True)
    old, new = _tampered(d, tmp_path, change)
    count = len(new.read_bytes().splitlines())
    out = mcpd("audit", "verify", str(old), str(new))
    assert out.returncode == 1
    assert out.stdout.startswith(f"{new}:{count if line == -1 else line}: {kind}"), out.stdout


def test_privileged_record_carries_route_and_token_id_never_the_token(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    call(d, "alice", d.log_file, privileged=True)
    rec = [r for r in d.audit() if r["event"] == "accept" and r.get("user") == "alice"][-1]
    assert rec["route"] == "privileged" and rec["token_id"] == d.tokens["alice"].split("_")[1]
    text = d.audit_text()
    assert all(token not in text and token.split("_", 2)[2] not in text for token in d.tokens.values())


def test_reload_record_describes_reauth_deny_and_expires_changes(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    before = len(d.audit())
    grants = d.default_grants()
    rule = next(iter(grants["users"].values()))["privileged"]["tools"]["files/read"]
    rule.update(reauth_after="5m", deny=[str(d.app / "private")], expires="2099-01-01T00:00:00Z")
    try:
        d.write_grants(grants)
        rec = wait_for_record(d, lambda r: r["event"] == "reload" and r["seq"] > before and "reauth" in r["reason"])
        where = f"users.{d.accounts['alice'].name} files/read"
        for part in (f"{where} reauth_after 300s added", f"{where} deny {d.app}/private added",
                     f"{where} expires never -> 2099-01-01T00:00:00Z"):
            assert part in rec["reason"], rec["reason"]
        rule["reauth_after"] = "10m"
        d.write_grants(grants)
        rec = wait_for_record(d, lambda r: r["event"] == "reload" and "300s -> 600s" in r["reason"])
        assert rec["reason"] == f"{where} reauth_after 300s -> 600s"
    finally:
        d.write_grants(d.default_grants())
        wait_for_record(d, lambda r: r["event"] == "reload" and "reauth_after 600s removed" in r["reason"])


FLOOD = r"""
import socket, struct, sys
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    s.sendall(struct.pack("!I", 8) + b"not json")
    s.settimeout(10)
    s.recv(1)
    s.close()
"""


def test_spawns_exits_kills_and_an_alert_flood_are_recorded(privsep_daemon: PrivsepDaemon) -> None:
    from mcpd.common.audit.alerts import ALERT_BURST

    d = privsep_daemon
    call(d, "alice", d.app, privileged=False, tool="files/list")
    rotated = d.audit_path.with_name(d.audit_path.name + ".1")
    older = [json.loads(x) for x in rotated.read_text().splitlines()] if rotated.exists() else []
    spawn = [r for r in older + d.audit() if r["event"] == "spawn" and r.get("user") == "alice"][-1]
    assert spawn["token_id"] == d.tokens["alice"].split("_")[1] and spawn["os_user"] == d.accounts["alice"].name
    victim = d.workers("alice")[0]
    os.kill(victim, signal.SIGKILL)  # a worker that dies by itself: the helper notices and records it
    wait_for_record(d, lambda r: r["event"] == "exit" and r.get("pid") == victim)
    seq = d.audit()[-1]["seq"]
    flood = 4 * ALERT_BURST
    subprocess.run(["setpriv", f"--reuid={d.service.pw_uid}", f"--regid={d.service.pw_gid}", "--clear-groups",
                    sys.executable, "-I", "-c", FLOOD, str(d.socket_path), str(flood)], check=True, timeout=120)
    new = [r for r in d.audit() if r["seq"] > seq and r["event"] == "alert"]
    assert 1 <= len(new) <= ALERT_BURST and all(r["reason"].startswith("malformed frame") for r in new)
    call(d, "alice", d.app, privileged=False, tool="files/list")  # a worker again
    live = set(d.workers("alice"))
    d.kill_helper(signal.SIGTERM)  # a clean stop: held-back counts written, workers killed and recorded
    try:
        recs = [r for r in d.audit() if r["seq"] > seq]
        flood_recs = [r for r in recs if r["event"] == "alert" and r["reason"] == new[0]["reason"]]
        assert sum(r.get("suppressed", 1) for r in flood_recs) == flood
        killed = {r["pid"] for r in recs if r["event"] == "kill" and r["reason"] == "the daemon stopping"}
        assert live and live <= killed
        assert mcpd("audit", "verify", "--config", str(d.config_path)).returncode == 0
    finally:
        d.start_helper()


def history(d: PrivsepDaemon) -> list[dict[str, Any]]:
    rotated = d.audit_path.with_name(d.audit_path.name + ".1")
    older = [json.loads(x) for x in rotated.read_text().splitlines()] if rotated.exists() else []
    return older + d.audit()


def replayed(d: PrivsepDaemon, grants: dict[str, Any]) -> list[str]:
    """The paths `mcpd audit replay --user alice` lists under ``grants`` (the file only: no reload)."""
    d.write_grants(grants, hup=False)
    try:
        out = mcpd("audit", "replay", "--user", "alice", "--config", str(d.config_path))
    finally:
        d.write_grants(d.default_grants(), hup=False)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1].startswith(f"{(len(lines) - 1) // 2} past privileged call")
    return [lines[i].split("files/read", 1)[1].split()[0] for i in range(0, len(lines) - 1, 2)]


def test_replay_lists_exactly_what_a_narrowed_or_widened_grant_changes(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    evil = d.srv / "app-evil" / "x"
    for path in (d.log_file, evil, d.app / "missing.txt"):
        call(d, "alice", path, privileged=True)
    past = [r for r in history(d) if r.get("user") == "alice" and r.get("tool") == "files/read"]
    was_allowed = [r["resolved_path"] for r in past if r["event"] == "accept" and r["resolved_path"] == str(d.log_file)]
    was_refused = [r["resolved_path"] for r in past if r["event"] == "reject" and r["resolved_path"] == str(evil)]
    assert was_allowed and was_refused
    narrowed = d.default_grants()
    rule = next(iter(narrowed["users"].values()))["privileged"]["tools"]["files/read"]
    rule["deny"] = [str(d.log_file)]
    assert replayed(d, narrowed) == was_allowed
    widened = d.default_grants()
    next(iter(widened["users"].values()))["privileged"]["tools"]["files/read"]["paths"].append(str(evil.parent))
    assert replayed(d, widened) == was_refused
    assert replayed(d, d.default_grants()) == []


SPEC_FIELDS = ("user", "token_id", "os_user", "peer", "session", "route", "tool", "requested_path", "resolved_path",
               "decision", "reason", "outcome", "bytes", "duration_ms")
PUBLIC_TEXT = "public words for everyone\n"


def call_records(d: PrivsepDaemon) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the helper's call records, the front's access records) so far."""
    access = [json.loads(x) for x in d.access_path.read_text().splitlines()] if d.access_path.exists() else []
    return [r for r in d.audit() if r["event"] in ("accept", "reject") and r.get("route") == "privileged"], access


def one_new(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any] | None:
    assert len(after) - len(before) <= 1, after[len(before):]
    return after[-1] if len(after) > len(before) else None


@pytest.mark.parametrize("privileged", [False, True])
def test_every_call_leaves_exactly_one_record_with_every_field(privsep_daemon: PrivsepDaemon, privileged: bool) -> None:
    d = privsep_daemon
    public = d.app / "public.txt" if privileged else d.srv / "public.txt"
    public.write_text(PUBLIC_TEXT)
    os.chmod(public, 0o600 if privileged else 0o644)
    call(d, "alice", public, privileged=privileged)  # a worker is up: its spawn record is no call record
    calls, access = call_records(d)
    res = call(d, "alice", public, privileged=privileged)
    assert not res.get("isError") and PUBLIC_TEXT in res["content"][0]["text"]
    calls2, access2 = call_records(d)
    helper_rec, front_rec = one_new(calls, calls2), one_new(access, access2)
    rec = helper_rec if privileged else front_rec
    assert rec is not None and (front_rec if privileged else helper_rec) is None  # one record, on its route's log
    assert set(SPEC_FIELDS) <= set(rec), set(SPEC_FIELDS) - set(rec)
    assert rec["route"] == ("privileged" if privileged else "unprivileged")
    assert rec["user"] == "alice" and rec["os_user"] == d.accounts["alice"].name
    assert rec["token_id"] == d.tokens["alice"].split("_")[1] and rec["peer"].startswith("127.0.0.1:")
    assert rec["tool"] == "files/read" and rec["requested_path"] == rec["resolved_path"] == str(public)
    assert rec["decision"] == "accept" and rec["outcome"] is None and rec["bytes"] == len(PUBLIC_TEXT)
    assert isinstance(rec["duration_ms"], float) and len(rec["session"]) == 32
    for text in (d.audit_text(), d.access_path.read_text()):
        assert PUBLIC_TEXT.strip() not in text
        leaked = [line for line in text.splitlines() for t in d.tokens.values() if t.split("_", 2)[2] in line]
        assert not leaked, leaked[:3]


def test_refused_and_kernel_denied_calls_are_recorded_by_the_front(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    _, access = call_records(d)
    res = call(d, "alice", d.log_file, privileged=False)  # root's 0600 file: the kernel says no
    assert res["structuredContent"]["error"]["code"] == "PERMISSION_DENIED"
    _, access2 = call_records(d)
    rec = one_new(access, access2)
    assert rec is not None and rec["decision"] == "refused_by_os" and rec["outcome"] == "PERMISSION_DENIED"
    res = call(d, "alice", "relative/path", privileged=True)  # refused before any route
    assert res.get("isError")
    calls3, access3 = call_records(d)
    rec = one_new(access2, access3)
    assert rec is not None and rec["decision"] == "reject" and rec["outcome"] == "INVALID_ARGUMENT"
    assert rec["route"] == "privileged" and rec["requested_path"] == "relative/path"
    verified = mcpd("audit", "verify", "--access", "--config", str(d.config_path))
    assert verified.returncode == 0 and f"{len(access3)} records" in verified.stdout, verified.stdout
    tail = mcpd("audit", "tail", "--access", "-n", "1", "--config", str(d.config_path))
    assert "relative/path" in tail.stdout and "reject" in tail.stdout and "unprivileged" not in tail.stdout


def test_front_refuses_to_start_without_its_access_log(tmp_path: Path) -> None:
    from mcpd.admin import certs

    pki = certs.make_pki(tmp_path, ["127.0.0.1"])
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    config = tmp_path / "mcpd.yaml"
    config.write_text(json.dumps({"listen": {"host": "127.0.0.1", "port": 1}, "helper_socket": "",
                                  "tls": {"cert": str(pki.server_cert), "key": str(pki.server_key)},
                                  "users_file": "users.yaml", "state_dir": ".",
                                  "access_log": str(blocker / "access.jsonl")}))
    proc = subprocess.run([sys.executable, "-m", "mcpd.front.server", "--config", str(config)],
                          capture_output=True, text=True, timeout=60, env=FRONT_ENV)
    assert proc.returncode == 78 and "access_log" in proc.stderr


def test_access_log_rotated_by_the_shipped_file_as_the_service_user_verifies(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    call(d, "alice", d.app, privileged=False, tool="files/list")
    before = d.access_path.read_bytes().splitlines(keepends=True)
    logrotate(d, audit=d.state_dir / "no-such-audit.jsonl", access=d.access_path)
    rotated = d.access_path.with_name(d.access_path.name + ".1")
    st = d.access_path.stat()
    assert rotated.read_bytes().splitlines(keepends=True) == before
    assert st.st_size == 0 and (st.st_uid, st.st_mode & 0o777) == (d.service.pw_uid, 0o600)
    call(d, "alice", d.app, privileged=False, tool="files/list")
    first = json.loads(d.access_path.read_bytes().splitlines(keepends=True)[0])
    assert first["prev"] == hashlib.sha256(before[-1]).hexdigest() and first["event"] == "rotate"
    out = mcpd("audit", "verify", "--access", "--config", str(d.config_path))
    assert out.returncode == 0 and f"{len(before) + 2} records" in out.stdout, out.stdout + out.stderr
