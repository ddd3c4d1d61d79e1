"""A daemon's start is told apart from a reload: its load record says ``load: start`` and counts
its changes from the last load recorded (the same file: no change at all), not from nothing; and
an audit log removed with its head state while the daemon's other state remains is an alert."""

from __future__ import annotations

import json
import os
from pathlib import Path

from click.testing import CliRunner

from mcpd.admin.audit.commands import audit
from mcpd.common.audit.head import HEAD_FILE
from mcpd.common.audit.writer import AuditLog
from mcpd.policy.grants_reload import LAST_LOAD, PolicyHolder
from tests.support.reload import rewrite

RULES = "users:\n  alice:\n    privileged:\n      tools:\n        files/read: {allowed: true, paths: [/srv/a]}\n"


def start(grants: Path, log_path: Path, state: int) -> PolicyHolder:
    """One daemon start: its audit log (keeping its head in ``state``) and its first load."""
    log = AuditLog(str(log_path), syslog=False, head_dir=state)
    holder = PolicyHolder(str(grants), owner_uid=os.geteuid(), audit=log, state_dir=state)
    log.close()
    return holder


def loads(log_path: Path) -> list[dict]:
    return [r for r in map(json.loads, log_path.read_text().splitlines()) if r["event"] == "reload" and r["part"] == 1]


def test_a_restart_with_the_same_grants_file_is_no_change(tmp_path: Path) -> None:
    grants, log_path = tmp_path / "mcp-sudo.yaml", tmp_path / "audit.jsonl"
    (tmp_path / "state").mkdir(mode=0o700)
    state = os.open(tmp_path / "state", os.O_RDONLY | os.O_DIRECTORY)
    try:
        rewrite(grants, RULES)
        start(grants, log_path, state)  # the first start ever: everything is new
        start(grants, log_path, state)  # a restart, the file untouched
        rewrite(grants, RULES.replace("/srv/a]", "/srv/a, /srv/b]"))
        start(grants, log_path, state)  # a restart after an edit made while it was stopped
    finally:
        os.close(state)
    first, same, edited = loads(log_path)
    assert [r["load"] for r in (first, same, edited)] == ["start"] * 3
    assert first["reason"].startswith("daemon start: no earlier load known, so everything is new: users.alice added")
    assert "previous_sha256" not in first
    assert same["reason"] == "daemon start: the same file as the last load" and same["changes"] == 0
    assert same["previous_sha256"] == same["sha256"] == first["sha256"]
    assert edited["reason"] == "daemon start: 1 change since the last load: users.alice files/read paths /srv/b added"
    assert edited["previous_sha256"] == first["sha256"] != edited["sha256"] and edited["changes"] == 1
    shown = CliRunner().invoke(audit, ["tail", "--file", str(log_path), "--event", "reload"]).stdout.splitlines()
    firsts = [line for line in shown if "[part 1 of" in line]
    assert len(firsts) == 3 and all("  start " in line for line in shown), shown
    assert '"daemon start: the same file as the last load"' in firsts[1], shown


def test_a_reload_is_a_reload_and_counts_from_the_policy_it_replaces(tmp_path: Path) -> None:
    grants, log_path = tmp_path / "mcp-sudo.yaml", tmp_path / "audit.jsonl"
    rewrite(grants, RULES)
    with AuditLog(str(log_path), syslog=False) as log:
        holder = PolicyHolder(str(grants), owner_uid=os.geteuid(), audit=log)
        rewrite(grants, RULES.replace("true", "false"))
        holder.reload()
    started, reloaded = loads(log_path)
    assert (started["load"], reloaded["load"]) == ("start", "reload")
    assert reloaded["reason"] == "users.alice files/read allowed true -> false"
    assert reloaded["previous_sha256"] == started["sha256"]


def test_logs_and_head_removed_while_the_daemon_had_run_is_an_alert(tmp_path: Path) -> None:
    """Root deletes the audit log and the head: numbering starts at 1 again, but the daemon's own
    state (its last load) shows it ran before, and the first record says so."""
    grants, log_path = tmp_path / "mcp-sudo.yaml", tmp_path / "audit.jsonl"
    (tmp_path / "state").mkdir(mode=0o700)
    state = os.open(tmp_path / "state", os.O_RDONLY | os.O_DIRECTORY)
    try:
        rewrite(grants, RULES)
        start(grants, log_path, state)
        assert (tmp_path / "state" / LAST_LOAD).read_text() == RULES
        log_path.unlink()
        (tmp_path / "state" / HEAD_FILE).unlink()
        start(grants, log_path, state)
    finally:
        os.close(state)
    recs = [json.loads(x) for x in log_path.read_text().splitlines()]
    assert recs[0]["seq"] == 1 and recs[0]["event"] == "alert"
    assert recs[0]["reason"].startswith("the audit log and its head state are gone, though this daemon ran before")
    assert recs[1]["event"] == "reload" and recs[1]["reason"] == "daemon start: the same file as the last load"
