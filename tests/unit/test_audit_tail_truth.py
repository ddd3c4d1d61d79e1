"""`audit tail` and `audit replay` say when what they show is out of order or repeated; the audit
log's tail also shows the privileged calls only the front recorded; logins are found as logins,
refused ones too, under the login route; kernel refusals on the unprivileged route are refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml
from click.testing import CliRunner

from mcpd.admin.audit.commands import audit
from mcpd.common.audit.records import REFUSED_BY_OS
from mcpd.common.audit.writer import AuditLog


def write(path: Path, n: int, start: int = 0) -> None:
    with AuditLog(str(path), syslog=False) as log:
        for i in range(start, start + n):
            log.record("accept", user="alice", os_user="alice", tool="files/read", requested_path=f"/srv/f{i}",
                       decision="accept", reason="granted", bytes=i)


def test_tail_and_replay_warn_about_records_copied_back_over_newer_ones(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write(path, 10)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines + lines[3:6]))  # records 4..6 again at the end
    out = CliRunner().invoke(audit, ["tail", "--file", str(path), "-n", "5"])
    assert out.exit_code == 0 and len(out.stdout.splitlines()) == 5
    assert "warning: 1 record of" in out.stderr and "out of order or repeated" in out.stderr, out.stderr
    assert "run mcpd audit verify" in out.stderr
    grants = tmp_path / "mcp-sudo.yaml"
    grants.write_text("users: {}\n")
    os.chmod(grants, 0o644)
    replay = CliRunner().invoke(audit, ["replay", "--log", str(path), "--file", str(grants), "--any-owner"])
    assert "warning: 1 record of the audit log out of order or repeated" in replay.stderr, replay.output
    clean = tmp_path / "clean.jsonl"
    write(clean, 3)
    out = CliRunner().invoke(audit, ["tail", "--file", str(clean)])
    assert out.exit_code == 0 and out.stderr == ""


def test_the_audit_logs_tail_shows_privileged_calls_only_the_front_recorded(tmp_path: Path) -> None:
    audit_log, access_log = tmp_path / "audit" / "audit.jsonl", tmp_path / "access" / "access.jsonl"
    config = tmp_path / "mcpd.yaml"
    config.write_text(yaml.safe_dump({"audit_log": str(audit_log), "access_log": str(access_log)}))
    with AuditLog(str(audit_log), syslog=False) as a, AuditLog(str(access_log), syslog=False) as b:
        a.record("reject", user="bob", tool="files/read", route="privileged", requested_path="/srv/1",
                 decision="reject", reason="no grant covers this path", outcome="PERMISSION_DENIED")
        b.record("access", user="bob", tool="files/read", route="privileged", requested_path="/srv/x\x00y",
                 decision="reject", reason="path contains a NUL byte", outcome="INVALID_ARGUMENT")
        b.record("access", user="bob", tool="files/read", route="unprivileged", requested_path="/srv/3",
                 decision="reject", reason="path must be absolute", outcome="INVALID_ARGUMENT")
        a.record("reject", user="bob", tool="files/read", route="privileged", requested_path="/srv/4",
                 decision="reject", reason="no grant covers this path", outcome="PERMISSION_DENIED")
    out = CliRunner().invoke(audit, ["tail", "--config", str(config), "--decision", "reject"])
    got = out.stdout.splitlines()
    assert out.exit_code == 0 and len(got) == 3, out.output
    assert "/srv/1" in got[0] and "/srv/x\\x00y" in got[1] and got[1].endswith("[access log]") and "/srv/4" in got[2]
    only = CliRunner().invoke(audit, ["tail", "--config", str(config), "--access", "--decision", "reject"])
    assert len(only.stdout.splitlines()) == 2 and "[access log]" not in only.stdout


def test_logins_are_found_as_logins_refused_ones_too_on_the_login_route(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        log.record("reject", tool="login", os_user="alice", peer="10.0.0.1", decision="reject",
                   reason="pam: Authentication failure")  # as older daemons recorded a refused login
        log.record("login", tool="login", route="login", user="alice", os_user="t29alice", peer="10.0.0.1",
                   decision="reject", reason="pam: Authentication failure")
        log.record("login", tool="login", route="login", user="alice", os_user="t29alice", peer="10.0.0.1",
                   decision="accept", reason="pam: Success", token_id="0123456789ab")
        log.record("reject", user="alice", tool="files/read", route="privileged", requested_path="/x",
                   decision="reject", reason="no grant covers this path")
    out = CliRunner().invoke(audit, ["tail", "--file", str(path), "--event", "login"])
    got = out.stdout.splitlines()
    assert len(got) == 3 and all(line.split()[3] == "login" for line in got), got  # the route column
    by_principal = CliRunner().invoke(audit, ["tail", "--file", str(path), "--event", "login", "--user", "alice"])
    assert len(by_principal.stdout.splitlines()) == 3
    by_account = CliRunner().invoke(audit, ["tail", "--file", str(path), "--user", "t29alice"])
    assert len(by_account.stdout.splitlines()) == 2


def test_a_kernel_refusal_on_the_unprivileged_route_is_listed_as_a_refusal(tmp_path: Path) -> None:
    path = tmp_path / "access.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        for decision, outcome in (("accept", None), (REFUSED_BY_OS, "PERMISSION_DENIED")):
            log.record("access", user="alice", tool="files/read", route="unprivileged",
                       requested_path=f"/srv/{decision}", decision=decision,
                       reason="the OS account's own permissions", outcome=outcome)
    out = CliRunner().invoke(audit, ["tail", "--file", str(path), "--decision", "reject", "--json"])
    assert [json.loads(x)["requested_path"] for x in out.stdout.splitlines()] == [f"/srv/{REFUSED_BY_OS}"]


def test_the_access_logs_loss_alert_names_the_access_log(tmp_path: Path) -> None:
    from mcpd.front.access import AccessLog

    path = tmp_path / "access.jsonl"
    front = AccessLog(str(path))
    try:
        for i in range(3):
            front.log.record("access", user="alice", requested_path=f"/srv/{i}")
        lines = path.read_bytes().splitlines(keepends=True)
        path.write_bytes(b"".join(lines[:-1]))  # its last record cut while the front runs
        front.log.record("access", user="alice", requested_path="/srv/3")
    finally:
        front.log.close()
    alert = [json.loads(x) for x in path.read_text().splitlines()][-2]
    assert alert["reason"] == "the access log lost records its writer had written", alert
    shown = CliRunner().invoke(audit, ["tail", "--file", str(path), "--event", "alert"]).stdout
    assert '"the access log lost records its writer had written": 1 record (seq 3); the log ended at seq 2' in shown
