"""`mcpd audit replay`: past privileged calls re-decided against today's grants; exactly those
whose decision would now differ are listed, with the rule that decides today."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from mcpd.admin.audit.commands import audit, replay_diffs
from mcpd.admin.audit.filters import Filter, parse_time
from mcpd.admin.audit.logfiles import read_lines
from mcpd.common.audit.writer import AuditLog
from mcpd.common.grantmatch import NO_GRANT, REAUTH
from mcpd.policy.grants import parse_policy

USER, OTHER = "nosuchuser-replay", "someone-else"  # no OS accounts: no groups, the users: table alone decides


def grants(*paths: str, deny: tuple[str, ...] = ()) -> str:
    """USER gets ``paths`` minus ``deny``; OTHER always keeps /srv."""
    return (f"users:\n  {USER}:\n    privileged:\n      tools:\n        files/read:\n"
            f"          allowed: true\n          paths: {list(paths)}\n          deny: {list(deny)}\n"
            f"  {OTHER}: {{privileged: {{tools: {{files/read: {{allowed: true, paths: [/srv]}}}}}}}}\n")


def past(path: Path) -> None:
    """A history written under grants('/srv'): reads of /srv/a, /srv/b allowed, /etc refused."""
    with AuditLog(str(path), syslog=False) as log:
        def call(event: str, p: str, reason: str, resolved: str | None = None, user: str = USER) -> None:
            log.record(event, user=user, os_user=user, route="privileged", tool="files/read", requested_path=p,
                       resolved_path=resolved or p, decision=event, reason=reason)

        call("accept", "/srv/a/x", "granted")
        call("accept", "/srv/b/y", "granted")
        call("accept", "/srv/a/../b/z", "granted", "/srv/b/z")
        call("reject", "/etc/hosts", NO_GRANT)
        call("reject", "/srv/a/x", REAUTH)  # refused for freshness only: the grant covered it
        call("accept", "/srv/b/y", "granted", user=OTHER)
        log.record("reject", tool="files/read", decision="reject", reason="invalid token")  # no grant consulted
        log.record("reload", decision="loaded", reason="no changes")


def diffs(tmp_path: Path, text: str, **flt: str) -> list[tuple[str, bool, str | None]]:
    log = tmp_path / "audit.jsonl"
    if not log.exists():
        past(log)
    out = replay_diffs(parse_policy(text), read_lines([str(log)]), Filter(**flt))
    return [(rec["requested_path"], today.allowed, today.rule) for rec, today in out]


def test_same_grants_nothing_differs(tmp_path: Path) -> None:
    assert diffs(tmp_path, grants("/srv")) == []


def test_narrowing_lists_exactly_the_calls_now_refused(tmp_path: Path) -> None:
    got = diffs(tmp_path, grants("/srv/a"))
    assert [(p, a) for p, a, _ in got] == [("/srv/b/y", False), ("/srv/a/../b/z", False)]
    denied = diffs(tmp_path, grants("/srv", deny=("/srv/a",)))
    assert [(p, a) for p, a, _ in denied] == [("/srv/a/x", False)]  # the read; its refusal for freshness stays refused
    assert all(rule and "deny /srv/a" in rule for _, _, rule in denied)


def test_widening_lists_exactly_the_calls_now_allowed(tmp_path: Path) -> None:
    got = diffs(tmp_path, grants("/srv", "/etc"))
    assert got == [("/etc/hosts", True, f"users.{USER} files/read paths /etc (mcp-sudo.yaml:7)")]


def test_filters_by_user_and_time(tmp_path: Path) -> None:
    assert diffs(tmp_path, grants("/srv/a"), user=OTHER) == []
    assert diffs(tmp_path, grants("/srv/a"), user=USER) != []
    assert diffs(tmp_path, grants("/srv/a"), since=parse_time("2999-01-01")) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the grants file must be root's, as the helper requires")
def test_replay_command_prints_each_difference_and_a_count(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    past(log)
    grants_file = tmp_path / "mcp-sudo.yaml"
    grants_file.write_text(grants("/srv/a"))
    os.chmod(grants_file, 0o600)
    out = CliRunner().invoke(audit, ["replay", "--log", str(log), "--file", str(grants_file)])
    assert out.exit_code == 0, out.output
    assert "was allowed, now refused: no grant covers this path; rule: (no grant)" in out.output
    assert out.output.count("was allowed, now refused") == 2
    assert out.output.rstrip().endswith("2 past privileged calls would be decided differently today")
