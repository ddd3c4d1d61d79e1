"""The auditor is told the truth, with the real daemon (the root helper, its policy process, real
accounts, a real logrotate): a forged path forges no line in any view; a call root's opener
refuses is a reject in every view; a 200-rule grants file is recorded whole and `mcpd grants at`
rebuilds it; `audit tail` reads across a rotation, which is no loss; a tail cut off the live log
is caught by `verify` with the missing range, recorded as an alert, and its numbers are never
reused. Root only. The cut is the module's last test: the log stays broken after it."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mcpd.common.audit.chain import LOST_TAIL
from mcpd.common.audit.records import REFUSED_AT_OPEN
from tests.support.audit import call, logrotate, mcpd, wait_for_load, wait_for_record
from tests.support.privsep_fixture import PrivsepDaemon, privsep_daemon  # noqa: F401  (fixture)

pytestmark = pytest.mark.root

FAKE = "2026-01-01 00:00:00  admin          privileged   files/read     /etc/shadow  accept  granted  1234"
BAD = ("\n", "\r", "\x1b", "\u202e", "\u2028")


def forged(base: Path) -> str:
    """A path any principal may send: a newline and a crafted line, terminal escapes (cursor up,
    clear the line), a right-to-left override, a line separator."""
    return f"{base}/x\n{FAKE}\x1b[1A\x1b[2K\u202etxt.exe\u2028{FAKE}"


def one_escaped_line(out: subprocess.CompletedProcess[str], lines: int = 1) -> list[str]:
    assert out.returncode == 0, out.stdout + out.stderr
    got = out.stdout.rstrip("\n").split("\n")
    assert len(got) == lines, got
    assert not any(line.startswith(FAKE[:19]) for line in got)
    assert not any(ch in line for line in got for ch in BAD), got
    assert "\\x0a" in out.stdout and "\\x1b[1A" in out.stdout and "\\u202e" in out.stdout
    return got


def history(d: PrivsepDaemon) -> list[dict[str, Any]]:
    rotated = d.audit_path.with_name(d.audit_path.name + ".1")
    older = [json.loads(x) for x in rotated.read_text().splitlines()] if rotated.exists() else []
    return older + d.audit()


def test_a_forged_path_forges_no_line_in_any_view(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    conf = ("--config", str(d.config_path))
    path = forged(d.app)
    res = call(d, "bob", path, privileged=True)  # bob has no grant at all
    assert res["structuredContent"]["error"]["code"] == "PERMISSION_DENIED"
    call(d, "alice", forged(d.srv), privileged=False)  # the front's access log
    rec = [r for r in d.audit() if r.get("user") == "bob" and r.get("tool") == "files/read"][-1]
    assert rec["requested_path"] == path and rec["decision"] == "reject"

    line = one_escaped_line(mcpd("audit", "tail", "--user", "bob", "--decision", "reject", "-n", "1", *conf))[0]
    assert "bob" in line and "privileged" in line and "no grant covers this path" in line
    one_escaped_line(mcpd("audit", "tail", "--access", "--user", "alice", "-n", "1", *conf))
    raw = mcpd("audit", "tail", "--json", "--user", "bob", "-n", "1", *conf)
    assert json.loads(raw.stdout)["requested_path"] == path and raw.stdout.isascii()

    widened = d.default_grants()
    widened["users"][d.accounts["bob"].name] = widened["users"][d.accounts["alice"].name]
    d.write_grants(widened, hup=False)  # the file only: replay re-decides under it, the daemon is not told
    try:
        replay = mcpd("audit", "replay", "--user", "bob", *conf)
    finally:
        d.write_grants(d.default_grants(), hup=False)
    got = one_escaped_line(replay, 3)  # the record, its verdict, the count
    assert "was refused (no grant covers this path), now allowed" in got[1]
    assert got[2] == "1 past privileged call would be decided differently today"


def test_refusals_at_open_are_rejects_in_every_view(privsep_daemon: PrivsepDaemon) -> None:
    """A symlink to /etc/shadow and a hard link to a root-only file, both inside alice's granted
    folder: root's opener refuses them; every view says so, with the reason."""
    d = privsep_daemon
    conf = ("--config", str(d.config_path))
    link, hard = d.app / "shadow-link", d.app / "hard"
    os.symlink("/etc/shadow", link)
    os.link(d.secret, hard)
    try:
        for path, reason in ((link, "symlink in path"), (hard, "file has several hard links")):
            res = call(d, "alice", path, privileged=True)
            err = res["structuredContent"]["error"]
            assert err["code"] == "PERMISSION_DENIED" and err["details"]["reason"] == reason
            rec = [r for r in d.audit() if r.get("requested_path") == str(path)][-1]
            assert (rec["event"], rec["decision"], rec["reason"], rec["outcome"]) == (
                "reject", REFUSED_AT_OPEN, reason, "PERMISSION_DENIED")
            assert rec["grant"] and f"paths {d.app}" in rec["grant"] and rec["bytes"] == 0
    finally:
        link.unlink()
        hard.unlink()
    tail = mcpd("audit", "tail", "--user", "alice", "--decision", "reject", "-n", "2", *conf)
    lines = tail.stdout.splitlines()
    assert tail.returncode == 0 and len(lines) == 2, tail.stdout
    assert str(link) in lines[0] and f'{REFUSED_AT_OPEN}  "symlink in path" [PERMISSION_DENIED]' in lines[0]
    assert str(hard) in lines[1] and f'{REFUSED_AT_OPEN}  "file has several hard links" [PERMISSION_DENIED]' in lines[1]
    plain = mcpd("audit", "tail", "--user", "alice", "-n", "2", *conf).stdout
    assert "accept" not in plain and plain.count(REFUSED_AT_OPEN) == 2

    narrowed = d.default_grants()  # alice loses the folder: served reads change, the refusals do not
    next(iter(narrowed["users"].values()))["privileged"]["tools"]["files/read"]["deny"] = [str(d.app)]
    for grants in (narrowed, d.default_grants()):
        d.write_grants(grants, hup=False)
        try:
            replay = mcpd("audit", "replay", "--user", "alice", *conf)
        finally:
            d.write_grants(d.default_grants(), hup=False)
        assert replay.returncode == 0, replay.stdout + replay.stderr
        assert str(link) not in replay.stdout and str(hard) not in replay.stdout, replay.stdout
        assert "was refused" not in replay.stdout


def big_grants(d: PrivsepDaemon, n: int = 200) -> str:
    """alice's rules, then ``n - 1`` more users (the last with an expiry and a deny)."""
    rule = d.default_grants()["users"][d.accounts["alice"].name]["privileged"]["tools"]["files/read"]
    out = [f"users:\n  {d.accounts['alice'].name}:\n    privileged:\n      tools:\n"
           f"        files/read: {{allowed: true, paths: [{rule['paths'][0]}]}}\n"
           f"        files/list: {{allowed: true, paths: [{rule['paths'][0]}]}}\n"]
    for i in range(1, n):
        extra = ', expires: "2031-05-06T07:08:09Z", deny: [/srv/late/private]' if i == n - 1 else ""
        out.append(f"  later{i:03d}:\n    privileged:\n      tools:\n"
                   f"        files/read: {{allowed: true, paths: [/srv/u{i:03d}]{extra}}}\n")
    return "".join(out)


def test_a_200_rule_reload_is_recorded_whole_and_grants_at_rebuilds_it(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    conf = ("--config", str(d.config_path))
    before = d.grants_path.read_text()
    wait_for_load(d, before)  # the tests before restore the file without SIGHUP: let that land first
    seq = d.audit()[-1]["seq"]
    text = big_grants(d)
    digest = hashlib.sha256(text.encode()).hexdigest()
    d.write_grants(text, hup=False)  # the policy process sees the new file within a second (no SIGHUP: one reload)
    last: dict[str, Any] = {"seq": seq}
    try:
        last = wait_for_record(d, lambda r: r["event"] == "reload" and r["seq"] > seq and r["sha256"] == digest
                               and r["part"] == r["parts"])
        parts = [r for r in d.audit() if r["event"] == "reload" and r.get("sha256") == digest]
        assert [r["part"] for r in parts] == list(range(1, last["parts"] + 1)) and last["parts"] > 2
        assert [r["seq"] for r in parts] == list(range(parts[0]["seq"], last["seq"] + 1))
        assert "".join(r.get("grants_text", "") for r in parts) == text
        changes = "".join(r.get("changes_text", "") for r in parts).split("\n")
        assert len(changes) == parts[0]["changes"] and "users.later199 files/read expires 2031-05-06T07:08:09Z added" in changes
        now = mcpd("grants", "at", "2999-01-01", *conf)  # the file alone on stdout: its line numbers are the records'
        assert now.returncode == 0 and now.stdout == text, now.stdout[:500] + now.stderr
        assert f"# sha256 {digest} " in now.stderr
        loaded = datetime.datetime.fromisoformat(parts[0]["time"].replace("Z", "+00:00"))
        earlier = mcpd("grants", "at", (loaded - datetime.timedelta(microseconds=1)).isoformat(), *conf)
        assert earlier.returncode == 0 and earlier.stdout == before, earlier.stdout + earlier.stderr
    finally:
        d.write_grants(before, hup=False)
        wait_for_record(d, lambda r: r["event"] == "reload" and r.get("sha256") == hashlib.sha256(
            before.encode()).hexdigest() and r["seq"] > last["seq"] and r["part"] == r["parts"])


def test_tail_reads_across_a_real_logrotate_which_is_no_loss(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    conf = ("--config", str(d.config_path))
    for principal in ("alice", "bob", "bob", "bob"):  # (alice's worker is up: her next call is one record)
        call(d, principal, d.log_file, privileged=True)
    logrotate(d)  # the shipped etc/logrotate.d/mcpd, forced: create, as mcpd-policy
    assert d.audit_path.stat().st_size == 0
    call(d, "alice", d.log_file, privileged=True)
    assert [r["event"] for r in d.audit()] == ["rotate", "accept"]  # the new file says which file of the log it is
    tail = mcpd("audit", "tail", "-n", "5", *conf)
    assert tail.returncode == 0 and len(tail.stdout.splitlines()) == 5, tail.stdout
    assert "alice" in tail.stdout.splitlines()[-1]
    bob = mcpd("audit", "tail", "--user", "bob", "--decision", "reject", "--json", *conf)  # all in FILE.1
    assert [json.loads(x)["requested_path"] for x in bob.stdout.splitlines()][-3:] == [str(d.log_file)] * 3
    d.kill_helper(signal.SIGTERM)  # and rotated while stopped: the next start finds its last record in FILE.1
    logrotate(d)
    d.start_helper()
    call(d, "alice", d.log_file, privileged=True)
    assert not any(r["event"] == "alert" and r["reason"] == LOST_TAIL for r in history(d))
    verified = mcpd("audit", "verify", *conf)
    assert verified.returncode == 0 and "its end is where its writer left it" in verified.stdout, verified.stdout


def cut_last(path: Path, n: int) -> list[dict[str, Any]]:
    lines = path.read_bytes().splitlines(keepends=True)
    with open(path, "r+b") as f:
        f.truncate(sum(map(len, lines[:-n])))
    return [json.loads(x) for x in lines[-n:]]


def test_a_tail_cut_off_the_live_log_is_caught_and_no_number_is_reused(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    conf = ("--config", str(d.config_path))
    while len(d.audit()) < 6:
        call(d, "alice", d.log_file, privileged=True)
    gone = cut_last(d.audit_path, 2)  # while the daemon runs
    first, last = gone[0]["seq"], gone[-1]["seq"]
    caught = mcpd("audit", "verify", *conf)
    assert caught.returncode == 1, caught.stdout
    assert f"truncated: 2 records (seq {first}..{last}) missing: the log ends at seq {first - 1}" in caught.stdout
    call(d, "alice", d.log_file, privileged=True)
    alert = wait_for_record(d, lambda r: r["event"] == "alert" and r.get("reason") == LOST_TAIL)
    assert (alert["seq"], alert["missing_from"], alert["missing_to"]) == (last + 1, first, last)
    after = [r for r in d.audit() if r["seq"] > alert["seq"]]
    assert after and after[0]["seq"] == last + 2 and after[0]["event"] == "accept"
    assert len({r["seq"] for r in history(d)}) == len(history(d))  # no number twice
    found = mcpd("audit", "verify", *conf)
    assert found.returncode == 1 and f"lost: 2 records (seq {first}..{last}) missing before this line" in found.stdout
    assert "FAILED" in found.stdout

    d.kill_helper(signal.SIGTERM)  # cut while stopped: the policy process finds it on start
    gone = cut_last(d.audit_path, 1)
    d.start_helper()
    alert = wait_for_record(d, lambda r: r["event"] == "alert" and r.get("missing_to") == gone[0]["seq"])
    assert alert["seq"] == gone[0]["seq"] + 1 and alert["missing_from"] == gone[0]["seq"]
