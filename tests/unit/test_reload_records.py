"""Every load of the grants file is recorded whole: the file's SHA-256, its text and every change,
in as many adjacent records as it takes, numbered (part, parts) so an auditor sees none is
missing; `mcpd grants at TIME` rebuilds the file in force at any time from those records."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from pathlib import Path

from click.testing import CliRunner

from mcpd.admin.audit.filters import record_time
from mcpd.admin.cli import main
from mcpd.common.audit.records import MAX_VALUE_CHARS
from mcpd.common.audit.writer import AuditLog
from mcpd.policy.grants_reload import PolicyHolder
from tests.support.reload import rewrite


def big_grants(n: int = 200, expiry_for: int = 199) -> str:
    """``n`` users, one rule each; user ``expiry_for`` (the last) has an expiry and a deny."""
    out = ["# a big site: one rule per user\nusers:\n"]
    for i in range(n):
        extra = (', expires: "2031-05-06T07:08:09Z", deny: [/srv/u199/private]' if i == expiry_for else "")
        out.append(f"  user{i:03d}:\n    privileged:\n      tools:\n"
                   f"        files/read: {{allowed: true, paths: [/srv/u{i:03d}, /var/log/app{i:03d}]{extra}}}\n")
    return "".join(out)


def reloads(path: Path) -> list[list[dict]]:
    """The reload record sets of the log, each a list of its records."""
    sets: list[list[dict]] = []
    for rec in (json.loads(x) for x in path.read_text().splitlines()):
        if rec["event"] == "reload":
            if rec["part"] == 1:
                sets.append([])
            sets[-1].append(rec)
    return sets


def test_a_200_rule_file_is_recorded_whole_with_its_digest(tmp_path: Path) -> None:
    grants, log_path = tmp_path / "mcp-sudo.yaml", tmp_path / "audit.jsonl"
    rewrite(grants, "users: {}\n")
    with AuditLog(str(log_path), syslog=False) as log:
        holder = PolicyHolder(str(grants), owner_uid=os.geteuid(), audit=log)
        text = big_grants()
        rewrite(grants, text)
        result = holder.reload()
    assert result.ok and len(result.summary) > 1000
    parts = reloads(log_path)[-1]
    assert len(parts) > 2 and [r["part"] for r in parts] == list(range(1, len(parts) + 1))
    assert all(r["parts"] == len(parts) and r["changes"] == len(result.summary) for r in parts)
    seqs = [r["seq"] for r in parts]
    assert seqs == list(range(seqs[0], seqs[0] + len(parts)))  # adjacent: nothing in between
    assert all(r["sha256"] == hashlib.sha256(grants.read_bytes()).hexdigest() for r in parts)
    assert "".join(r.get("grants_text", "") for r in parts) == grants.read_text()
    changes = "".join(r.get("changes_text", "") for r in parts).split("\n")
    assert changes == result.summary
    assert "users.user199 files/read expires never -> 2031-05-06T07:08:09Z" not in changes  # (a new rule: added)
    assert "users.user199 files/read expires 2031-05-06T07:08:09Z added" in changes
    assert "users.user199 files/read deny /srv/u199/private added" in changes
    assert all(len(v) <= MAX_VALUE_CHARS for r in parts for v in r.values() if isinstance(v, str))
    assert "... and" in parts[0]["reason"] and parts[0]["reason"].endswith("in changes_text)")
    assert parts[1]["reason"] == "(continued)"


def test_a_failed_reload_records_every_error(tmp_path: Path) -> None:
    grants, log_path = tmp_path / "mcp-sudo.yaml", tmp_path / "audit.jsonl"
    rewrite(grants, "users: {}\n")
    with AuditLog(str(log_path), syslog=False) as log:
        holder = PolicyHolder(str(grants), owner_uid=os.geteuid(), audit=log)
        rewrite(grants, big_grants().replace("allowed: true", "allowed: maybe"))
        result = holder.reload()
    assert not result.ok and len(result.errors) == 200
    failed = [json.loads(x) for x in log_path.read_text().splitlines() if '"reload_failed"' in x]
    assert [r["part"] for r in failed] == list(range(1, len(failed) + 1)) and "grants_text" not in failed[0]
    assert "".join(r.get("errors_text", "") for r in failed).split("\n") == result.errors
    attempted = big_grants().replace("allowed: true", "allowed: maybe")  # and what was attempted, whole
    assert "".join(r.get("grants_text", "") for r in failed) == attempted
    assert {r["sha256"] for r in failed} == {hashlib.sha256(attempted.encode()).hexdigest()}


def grants_at(log: Path, when: str, *more: str) -> tuple[int, str]:
    out = CliRunner().invoke(main, ["grants", "at", when, "--log", str(log), *more])
    return out.exit_code, out.output


def grants_at_split(log: Path, when: str, *more: str) -> tuple[int, str, str]:
    """``(exit code, standard output, standard error)`` of ``mcpd grants at``."""
    out = CliRunner().invoke(main, ["grants", "at", when, "--log", str(log), *more])
    return out.exit_code, out.stdout, out.stderr


def test_grants_at_rebuilds_the_file_in_force_at_any_time(tmp_path: Path) -> None:
    grants, log_path = tmp_path / "mcp-sudo.yaml", tmp_path / "audit.jsonl"
    first, second = "users: {}\n", big_grants()
    rewrite(grants, first)
    with AuditLog(str(log_path), syslog=False) as log:
        holder = PolicyHolder(str(grants), owner_uid=os.geteuid(), audit=log)
        rewrite(grants, "users: [broken\n")
        holder.reload()  # failed: the first stays in force
        rewrite(grants, second)
        holder.reload()
    sets = reloads(log_path)
    assert len(sets) == 2
    t1, t2 = (record_time(s[0]) for s in sets)
    assert t1 is not None and t2 is not None

    def at(when: datetime.datetime) -> tuple[int, str, str]:
        return grants_at_split(log_path, when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))

    code, body, err = at(t1)  # the file exactly on standard output: its line numbers are the records'
    head = err.splitlines()
    assert code == 0 and body == first, body + err
    assert head[0].startswith(f"# {grants} in force at ") and f"until {t2:%Y-%m-%dT%H:%M:%SZ}" in head[0]
    assert head[1].startswith(f"# sha256 {hashlib.sha256(first.encode()).hexdigest()} ")
    code, body, err = at(t2 + datetime.timedelta(days=1))
    assert code == 0 and body == second and "still the last load recorded" in err
    code, body, err = at(t1 - datetime.timedelta(seconds=1))
    assert code == 1 and "no load of the grants file at or before" in err and body == ""
    code, body, err = grants_at_split(log_path, "2999-01-01", "--changes")
    assert code == 0 and body == second and "#   users.user199 files/read expires 2031-05-06T07:08:09Z added" in err


def test_grants_at_refuses_a_load_with_a_part_missing(tmp_path: Path) -> None:
    grants, log_path = tmp_path / "mcp-sudo.yaml", tmp_path / "audit.jsonl"
    rewrite(grants, big_grants())
    with AuditLog(str(log_path), syslog=False) as log:
        PolicyHolder(str(grants), owner_uid=os.geteuid(), audit=log)
    lines = log_path.read_text().splitlines(keepends=True)
    log_path.write_text("".join(lines[:2] + lines[3:]))  # part 3 gone
    code, out = grants_at(log_path, "2999-01-01")
    assert code == 1 and "is not whole: parts [1, 2, 4" in out, out
