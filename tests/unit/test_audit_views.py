"""What an auditor reads is what happened: every readable view (`audit tail`, `--access`,
`replay`, the front's refusal log line) escapes what a client sent, so a path holding a newline
and a crafted suffix, an ESC or a bidi override forges no line; `--json` stays JSON; `tail` reads
the rotated files too; `--decision reject` lists every refusal; replay counts only calls whose
outcome would differ."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mcpd.admin.audit.commands import audit, replay_diffs
from mcpd.admin.audit.filters import Filter
from mcpd.admin.audit.logfiles import read_lines
from mcpd.admin.audit.views import human
from mcpd.common.audit.records import REFUSED_AT_OPEN
from mcpd.common.audit.writer import AuditLog
from mcpd.common.grantmatch import DENIED, NO_GRANT, REAUTH
from mcpd.front import refused
from mcpd.policy.grants import parse_policy

FAKE = "2026-01-01 00:00:00  admin          privileged   files/read     /etc/shadow  accept  granted  1234"
#: a path any principal may send: a newline and a crafted line, a terminal escape (cursor up,
#: clear line), a right-to-left override, a line separator
FORGED = f"/srv/app/x\n{FAKE}\x1b[1A\x1b[2K\u202etxt.exe\u2028{FAKE}"
BAD = ("\n", "\r", "\x1b", "\u202e", "\u2028")
USER = "nosuchuser-views"


def no_forged_line(output: str, records: int) -> None:
    """``output`` has exactly ``records`` lines, none of them the fake one, and no character that
    moves the cursor, reorders or breaks a line."""
    lines = output.splitlines()
    assert len(lines) == records, lines
    assert not any(line.startswith(FAKE[:19]) for line in lines), lines
    assert not any(ch in line for line in lines for ch in BAD)
    assert "\\x0a" in output and "\\x1b" in output and "\\u202e" in output and "\\u2028" in output


def history(path: Path) -> None:
    with AuditLog(str(path), syslog=False) as log:
        log.record("reject", user=USER, os_user=USER, route="privileged", tool="files/read", requested_path=FORGED,
                   resolved_path=FORGED, decision="reject", reason=NO_GRANT, outcome="PERMISSION_DENIED")
        log.record("accept", user=USER, os_user=USER, route="privileged", tool="files/read", requested_path=FORGED,
                   resolved_path=FORGED, decision="accept", reason="granted", bytes=3)


def test_tail_escapes_a_forged_path(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    history(path)
    out = CliRunner().invoke(audit, ["tail", "--file", str(path)])
    assert out.exit_code == 0
    no_forged_line(out.output, 2)
    assert f"{USER:<14} privileged" in out.output.splitlines()[0]


def test_tail_access_escapes_a_forged_path(tmp_path: Path) -> None:
    path = tmp_path / "access.jsonl"
    history(path)
    config = tmp_path / "mcpd.yaml"
    config.write_text(yaml.safe_dump({"access_log": str(path)}))
    out = CliRunner().invoke(audit, ["tail", "--access", "--config", str(config)])
    assert out.exit_code == 0
    no_forged_line(out.output, 2)


def test_tail_json_stays_one_json_line_per_record(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    history(path)
    with open(path, "ab") as f:  # a line some other tool wrote, raw bidi and C1 inside a JSON string
        f.write(json.dumps({"event": "x", "requested_path": "/a\u202e\x85b"}, ensure_ascii=False).encode() + b"\n")
    out = CliRunner().invoke(audit, ["tail", "--file", str(path), "--json"])
    lines = out.output.splitlines()
    assert len(lines) == 3 and [json.loads(x).get("requested_path") for x in lines] == [FORGED, FORGED, "/a\u202e\x85b"]
    assert out.output.isascii() and not any(ch in out.output for ch in ("\x1b", "\x85", "\u202e"))
    assert lines[:2] == path.read_text().splitlines()[:2]  # the writer's own bytes, as verify hashes them


def test_replay_escapes_a_forged_path(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the grants file must be root's, as the helper requires")
    path = tmp_path / "audit.jsonl"
    history(path)
    grants = tmp_path / "mcp-sudo.yaml"
    grants.write_text(f"users:\n  {USER}: {{privileged: {{tools: {{files/read: {{allowed: true, paths: [/srv]}}}}}}}}\n")
    os.chmod(grants, 0o600)
    out = CliRunner().invoke(audit, ["replay", "--log", str(path), "--file", str(grants)])
    assert out.exit_code == 0, out.output
    no_forged_line(out.output, 3)  # the record, its verdict, the count
    assert "was refused (no grant covers this path), now allowed" in out.output


def test_human_escapes_every_field() -> None:
    rec = {"time": "2026-01-01T00:00:00\n", "event": "accept", "user": "a\x1b", "os_user": "b\u202e",
           "route": "r\n", "tool": "t\r", "requested_path": "/p\n", "resolved_path": "/q\n", "decision": "d\n",
           "reason": "why\n", "outcome": "O\n", "bytes": "1\n", "pid": "2\n"}
    line = human(rec)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\u202e" not in line


def test_the_front_refusal_log_line_uses_the_one_escape_rule() -> None:
    assert refused.clean(FORGED, 1000) == refused.printable(FORGED)
    assert refused.clean("/a\u202eb" * 100, 10) == "/a\\u202eb/a\\u202eb/a…"  # cut first, then escaped


def rotated_history(path: Path) -> None:
    """Three files as logrotate leaves them (create, compress, delaycompress): .2.gz, .1, live."""
    with AuditLog(str(path), syslog=False) as log:
        for i, user in enumerate(["bob", "alice", "alice", "bob", "alice", "carol", "alice", "alice"]):
            log.record("accept", user=user, os_user=user, tool="files/read", requested_path=f"/srv/{i}",
                       decision="accept", reason="granted")
            if i in (2, 5):
                for n in (1, 2):  # (.1 -> .2 first)
                    older = path.with_name(f"{path.name}.{n}")
                    if older.exists():
                        with open(older, "rb") as f, gzip.open(path.with_name(f"{path.name}.{n + 1}.gz"), "wb") as g:
                            shutil.copyfileobj(f, g)
                        older.unlink()
                        break
                os.rename(path, path.with_name(path.name + ".1"))
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def tail_paths(path: Path, *args: str) -> list[str]:
    out = CliRunner().invoke(audit, ["tail", "--file", str(path), "--json", *args])
    assert out.exit_code == 0, out.output
    return [json.loads(x).get("requested_path") for x in out.output.splitlines()]


def test_tail_reads_the_rotated_files_newest_last(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    rotated_history(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2.gz"]
    assert len(path.read_text().splitlines()) == 3  # its rotate record, and two records
    assert tail_paths(path, "-n", "5", "--event", "accept") == ["/srv/3", "/srv/4", "/srv/5", "/srv/6", "/srv/7"]
    assert tail_paths(path, "-n", "5") == ["/srv/4", "/srv/5", None, "/srv/6", "/srv/7"]  # a rotate record between
    assert tail_paths(path, "-n", "100", "--event", "accept") == [f"/srv/{i}" for i in range(8)]
    assert tail_paths(path, "--user", "bob") == ["/srv/0", "/srv/3"]
    assert tail_paths(path, "--user", "carol", "-n", "1") == ["/srv/5"]
    assert tail_paths(path, "--path", "/srv/[01]") == ["/srv/0", "/srv/1"]


def test_decision_reject_lists_refusals_at_open_too(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        for decision, reason in (("accept", "granted"), ("reject", NO_GRANT), (REFUSED_AT_OPEN, "symlink in path")):
            log.record("accept" if decision == "accept" else "reject", user="a", tool="files/read",
                       requested_path=f"/srv/{decision}", decision=decision, reason=reason, outcome="PERMISSION_DENIED")
    assert tail_paths(path, "--decision", "reject") == ["/srv/reject", f"/srv/{REFUSED_AT_OPEN}"]
    assert tail_paths(path, "--decision", REFUSED_AT_OPEN) == [f"/srv/{REFUSED_AT_OPEN}"]
    readable = CliRunner().invoke(audit, ["tail", "--file", str(path), "-n", "1"]).output
    assert f'{REFUSED_AT_OPEN}  "symlink in path" [PERMISSION_DENIED]' in readable


def test_replay_counts_only_calls_whose_outcome_would_differ(tmp_path: Path) -> None:
    """Refused then and refused now is no difference, whatever the two reasons: a refusal for
    freshness, at open (the grants allowed it), or by a deny, under grants that now refuse it."""
    path = tmp_path / "audit.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        for event, decision, reason, p in (("accept", "accept", "granted", "/srv/served"),
                                           ("reject", "reject", REAUTH, "/srv/stale"),
                                           ("reject", REFUSED_AT_OPEN, "symlink in path", "/srv/link"),
                                           ("reject", REFUSED_AT_OPEN, "file has several hard links", "/srv/hard"),
                                           ("reject", "reject", DENIED, "/srv/denied"),
                                           ("reject", "reject", NO_GRANT, "/etc/hosts")):
            log.record(event, user=USER, os_user=USER, route="privileged", tool="files/read", requested_path=p,
                       resolved_path=p, decision=decision, reason=reason)

    def diffs(text: str) -> list[tuple[str, bool]]:
        got = replay_diffs(parse_policy(text), read_lines([str(path)]), Filter())
        return [(rec["requested_path"], today.allowed) for rec, today in got]

    rule = f"users:\n  {USER}: {{privileged: {{tools: {{files/read: {{allowed: true, paths: [%s]}}}}}}}}\n"
    assert diffs(rule % "/nowhere") == [("/srv/served", False)]  # the refusals stay refusals
    assert diffs(rule % "/srv") == [("/srv/denied", True)]  # refused by the grants then, allowed now
    assert diffs(rule % "/srv, /etc") == [("/srv/denied", True), ("/etc/hosts", True)]


def test_tail_filters_oauth_calls_by_issuer_subject_client_and_jti(tmp_path: Path) -> None:
    """docs/REFERENCE.md §5.4: an OAuth call's record names the person and the agent; ``audit tail``
    filters on them and shows them escaped (a forged sub cannot make a second line)."""
    path = tmp_path / "audit.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        for sub, client in (("alice", "agent-a"), (f"bob{FORGED}", "agent-b")):
            log.record("accept", user=f"corp:{sub[:3]}", os_user=USER, route="privileged", tool="files/read",
                       requested_path="/srv/x", decision="accept", reason="granted", iss="https://idp.example",
                       sub=sub, client=client, act="bot < agent", jti=f"j-{client}")
        log.record("accept", user=USER, os_user=USER, route="privileged", tool="files/read",
                   requested_path="/srv/x", decision="accept", reason="granted")
    run = CliRunner().invoke
    out = run(audit, ["tail", "--file", str(path), "--sub", "alice"])
    assert out.exit_code == 0 and len(out.output.splitlines()) == 1
    assert "sub=alice  client=agent-a  act=\"bot < agent\"  jti=j-agent-a" in out.output
    assert len(run(audit, ["tail", "--file", str(path), "--iss", "https://idp.example"]).output.splitlines()) == 2
    assert run(audit, ["tail", "--file", str(path), "--client", "agent-b", "--jti", "j-agent-a"]).output == ""
    forged = run(audit, ["tail", "--file", str(path), "--client", "agent-b"]).output
    assert len(forged.splitlines()) == 1 and not any(ch in forged.rstrip("\n") for ch in BAD)
