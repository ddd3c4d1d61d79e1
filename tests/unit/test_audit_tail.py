"""`mcpd audit tail`: readable lines by default, raw JSON with --json, filters by user, decision,
path glob and time, and --follow (through rotation)."""

from __future__ import annotations

import datetime
import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mcpd.admin.audit.commands import audit
from mcpd.admin.audit.filters import Filter, parse_time
from mcpd.common.audit.writer import AuditLog


def fill(path: Path) -> None:
    with AuditLog(str(path), syslog=False) as log:
        log.record("accept", user="alice", os_user="alice", route="privileged", tool="files/read",
                   requested_path="/var/log/../log/syslog", resolved_path="/var/log/syslog", decision="accept",
                   reason="granted", bytes=120, token_id="0123456789ab")
        log.record("reject", user="bob", os_user="bob", route="privileged", tool="files/read",
                   requested_path="/etc/shadow", resolved_path="/etc/shadow", decision="reject",
                   reason="no grant covers this path")
        log.record("accept", user="ops", os_user="carol", route="privileged", tool="files/list",
                   requested_path="/var/log", resolved_path="/var/log", decision="accept", reason="granted", bytes=7)
        log.record("reload", grants_file="/etc/mcpd/mcp-sudo.yaml", decision="loaded", reason="no changes")


def run(path: Path, *args: str) -> list[str]:
    out = CliRunner().invoke(audit, ["tail", "--file", str(path), *args])
    assert out.exit_code == 0, out.output
    return out.output.splitlines()


def test_tail_is_readable_by_default(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    fill(path)
    lines = run(path)
    assert len(lines) == 4
    first = lines[0]
    for part in ("alice", "privileged", "files/read", "/var/log/../log/syslog -> /var/log/syslog", "accept",
                 "granted", "120"):
        assert part in first, first
    assert first[:19].count(":") == 2 and first[10] == " "  # "YYYY-MM-DD HH:MM:SS"
    assert "ops(carol)" in lines[2]  # principal and account when they differ
    assert "reload" in lines[3] and "no changes" in lines[3]
    assert "prev" not in "".join(lines) and not any(line.startswith("{") for line in lines)


def test_tail_json_prints_the_raw_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    fill(path)
    assert run(path, "--json", "-n", "2") == path.read_text().splitlines()[-2:]
    assert run(path, "--json", "--user", "bob") == [path.read_text().splitlines()[1]]


@pytest.mark.parametrize("args,users", [
    (["--user", "alice"], ["alice"]),
    (["--user", "carol"], ["ops"]),  # the OS account matches too
    (["--decision", "reject"], ["bob"]),
    (["--path", "/var/log/*"], ["alice"]),
    (["--path", "/var/log*"], ["alice", "ops"]),
    (["--path", "/etc/*", "--decision", "accept"], []),
    (["--since", "1h"], ["alice", "bob", "ops", None]),
    (["--until", "2000-01-01"], []),
    (["--since", "2000-01-01T00:00:00Z", "-n", "1"], [None]),
])
def test_tail_filters(tmp_path: Path, args: list[str], users: list[str | None]) -> None:
    path = tmp_path / "a.jsonl"
    fill(path)
    got = [json.loads(line).get("user") for line in run(path, "--json", *args)]
    assert got == users


def test_time_filter_bounds_are_inclusive() -> None:
    rec = {"time": "2026-12-01T06:00:00.000000Z"}
    at = parse_time("2026-12-01T06:00:00Z")
    assert Filter(since=at, until=at).match(rec)
    assert not Filter(since=at + datetime.timedelta(microseconds=1)).match(rec)
    assert not Filter(since=at).match({"event": "x"})  # no time: not shown under a time filter


def test_bad_time_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    fill(path)
    out = CliRunner().invoke(audit, ["tail", "--file", str(path), "--since", "yesterday-ish"])
    assert out.exit_code == 2 and "ISO 8601" in out.output


def test_tail_follow_filters_and_goes_through_rotation(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    log = AuditLog(str(path), syslog=False)
    log.record("accept", user="alice", decision="accept", bytes=1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcpd.admin.cli", "audit", "tail", "-n", "5", "--follow", "--user", "alice",
         "--file", str(path)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        buf, step = b"", 0
        for _ in range(300):  # bounded: at most ~30 s
            if select.select([proc.stdout], [], [], 0.1)[0]:
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
            seen = buf.decode().splitlines()
            if len(seen) == 1 and step == 0:
                log.record("accept", user="bob", decision="accept", bytes=2)  # filtered out
                log.record("reject", user="alice", decision="reject", bytes=3)
                step = 1
            elif len(seen) == 2 and step == 1:
                os.rename(path, str(path) + ".1")
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
                log.record("accept", user="alice", decision="accept", bytes=4)  # in the new file
                step = 2
            elif len(seen) >= 3:
                break
        seen = buf.decode().splitlines()
        assert len(seen) == 3, seen
        assert [line.rsplit(None, 1)[-1] for line in seen] == ["1", "3", "4"]
        assert all("alice" in line for line in seen)
    finally:
        proc.kill()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
        log.close()
