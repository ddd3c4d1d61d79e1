"""docs/REFERENCE.md §7.2: the policy process's audit log is a hash chain, across rotation, and
`mcpd audit verify` proves it whole or names the first broken line (edited, deleted, reordered,
truncated)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mcpd.admin.audit.commands import audit
from mcpd.admin.audit.logfiles import read_lines, rotated_set
from mcpd.admin.audit.verify import Verdict, verify
from mcpd.common.audit.chain import GENESIS
from mcpd.common.audit.writer import AuditLog


def raw_lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def write_n(path: Path, n: int, start: int = 0) -> None:
    with AuditLog(str(path), syslog=False) as log:
        for i in range(start, start + n):
            log.record("accept", user="alice", tool="files/read", requested_path=f"/srv/f{i}", bytes=i)


def rotate_like_logrotate_create(path: Path) -> Path:
    """What logrotate's `create` does: rename, then a new empty file 0600."""
    old = path.with_name(path.name + ".1")
    os.rename(path, old)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    return old


def check(*paths: Path) -> Verdict:
    return verify(read_lines([str(p) for p in paths]))


def test_each_record_carries_seq_and_hash_of_the_previous_bytes(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write_n(path, 5)
    lines = raw_lines(path)
    recs = [json.loads(x) for x in lines]
    assert [r["seq"] for r in recs] == [1, 2, 3, 4, 5]
    assert recs[0]["prev"] == GENESIS
    for before, rec in zip(lines, recs[1:]):
        assert rec["prev"] == hashlib.sha256(before).hexdigest()
    assert list(recs[0])[:4] == ["seq", "prev", "time", "event"]


def test_a_new_writer_resumes_the_chain_from_the_last_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write_n(path, 3)
    write_n(path, 2, start=3)  # a helper restart
    assert [json.loads(x)["seq"] for x in raw_lines(path)] == [1, 2, 3, 4, 5]
    assert check(path).ok


def test_rotation_is_noticed_and_the_new_file_links_to_the_old(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path), syslog=False)
    try:
        for i in range(3):
            log.record("accept", bytes=i)
        old = rotate_like_logrotate_create(path)
        log.record("accept", bytes=3)  # the same running writer, after the rename
        log.record("accept", bytes=4)
    finally:
        log.close()
    new = [json.loads(x) for x in raw_lines(path)]
    assert [r["seq"] for r in new] == [4, 5, 6]
    assert new[0] == dict(new[0], event="rotate", file_number=2, previous_seq=3)  # the new file's first line
    assert [r["bytes"] for r in new[1:]] == [3, 4]
    assert new[0]["prev"] == hashlib.sha256(raw_lines(old)[-1]).hexdigest()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    verdict = check(old, path)
    assert verdict.ok and verdict.count == 6 and (verdict.first_seq, verdict.last_seq) == (1, 6)
    assert not check(path, old).ok  # given in the wrong order, the link fails


def test_removed_log_is_recreated_and_the_chain_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path), syslog=False)
    try:
        log.record("accept", bytes=1)
        kept = path.read_bytes()
        path.unlink()
        log.record("accept", bytes=2)
    finally:
        log.close()
    new, alert, rec = [json.loads(x) for x in raw_lines(path)]
    assert new["event"] == "rotate" and new["seq"] == 2 and new["prev"] == hashlib.sha256(kept).hexdigest()
    # the file was deleted, not renamed: its records went with it, and the writer says so
    assert (alert["event"], alert["missing_from"], alert["missing_to"]) == ("alert", 1, 1)
    assert rec["seq"] == 4 and rec["bytes"] == 2


def test_a_writer_started_after_rotation_resumes_from_the_rotated_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write_n(path, 3)
    old = rotate_like_logrotate_create(path)  # rotated while the helper was stopped
    write_n(path, 2, start=3)
    assert json.loads(raw_lines(path)[0])["event"] == "rotate"  # written at the start, first in the new file
    assert check(old, path).ok and check(old, path).count == 6


def test_a_torn_last_line_stays_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write_n(path, 2)
    with open(path, "ab") as f:
        f.write(b'{"seq":3,"prev":"ab')  # a crash mid-write
    write_n(path, 1, start=2)
    lines = raw_lines(path)
    assert len(lines) == 4 and json.loads(lines[3])["bytes"] == 2  # not glued to the torn bytes
    verdict = check(path)
    assert not verdict.ok and verdict.where == f"{path}:3"


def test_verify_command_accepts_a_whole_chain_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write_n(path, 4)
    old = rotate_like_logrotate_create(path)
    write_n(path, 3, start=4)
    out = CliRunner().invoke(audit, ["verify", str(old), str(path)])
    assert out.exit_code == 0, out.output
    assert "8 records" in out.output and "seq 1..8" in out.output  # (the new file's rotate record too)
    # no FILE: the rotated set of the configured log (here through --file-less config default)
    assert rotated_set(str(path)) == [str(old), str(path)]


def flip_prev(line: bytes) -> bytes:
    """``line`` with the first hex digit of its ``prev`` changed."""
    i = line.index(b'"prev":"') + 8
    return line[:i] + (b"1" if line[i:i + 1] == b"0" else b"0") + line[i + 1:]


TAMPERS = {
    # name: (function of the line list → new list, line named (1-based), word in the problem)
    "changed byte in a record's content": (lambda ls: ls[:4] + [ls[4].replace(b"/srv/f4", b"/srv/g4")] + ls[5:], 5, "edited"),
    "changed byte in a record's prev": (lambda ls: ls[:4] + [flip_prev(ls[4])] + ls[5:], 5, "edited"),
    "changed sequence number": (lambda ls: ls[:4] + [ls[4].replace(b'"seq":5', b'"seq":9')] + ls[5:], 5, "edited"),
    "deleted line": (lambda ls: ls[:4] + ls[5:], 5, "deleted"),
    "two swapped lines": (lambda ls: ls[:4] + [ls[5], ls[4]] + ls[6:], 5, "reordered"),
    "truncated tail": (lambda ls: ls[:-1] + [ls[-1][:30]], 10, "truncated"),
    "not JSON any more": (lambda ls: ls[:2] + [b"garbage\n"] + ls[3:], 3, "edited"),
}


@pytest.mark.parametrize("name", sorted(TAMPERS))
def test_verify_names_the_first_broken_line(tmp_path: Path, name: str) -> None:
    path = tmp_path / "audit.jsonl"
    write_n(path, 10)
    change, line, word = TAMPERS[name]
    lines = raw_lines(path)
    tampered = change(lines)
    assert tampered != lines
    path.write_bytes(b"".join(tampered))
    verdict = check(path)
    assert not verdict.ok
    assert verdict.where == f"{path}:{line}", verdict
    assert verdict.problem is not None and verdict.problem.startswith(word), verdict
    out = CliRunner().invoke(audit, ["verify", str(path)])
    assert out.exit_code == 1 and f"{path}:{line}: {word}" in out.output


def test_verify_names_the_line_across_files(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write_n(path, 4)
    old = rotate_like_logrotate_create(path)
    write_n(path, 4, start=4)
    lines = raw_lines(old)
    old.write_bytes(b"".join(lines[:-1]))  # the last record before the rotation deleted
    verdict = check(old, path)
    assert not verdict.ok and verdict.where == f"{path}:1" and verdict.problem.startswith("deleted")


def test_a_forged_record_appended_by_hand_without_the_hash_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write_n(path, 3)
    forged = {"seq": 4, "prev": GENESIS, "time": "2026-01-01T00:00:00.000000Z", "event": "accept"}
    with open(path, "ab") as f:
        f.write(json.dumps(forged).encode() + b"\n")
    write_n(path, 1, start=3)  # the next real record links to the forged one, as it must
    verdict = check(path)  # only the link into line 4 fails: line 3 changed, or line 4's prev is forged
    assert not verdict.ok and verdict.where == f"{path}:3" and verdict.problem.startswith("edited")
    assert f"{path}:4" in verdict.problem


def test_records_before_the_chain_existed_are_counted_apart(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text('{"time":"2026-01-01T00:00:00.000000Z","event":"reload"}\n')
    write_n(path, 2)
    verdict = check(path)
    assert verdict.ok and verdict.unchained == 1 and verdict.count == 2


def test_repeated_alerts_are_rate_limited_with_a_count_of_those_suppressed(tmp_path: Path) -> None:
    from mcpd.common.audit.alerts import ALERT_BURST, ALERT_WINDOW

    path = tmp_path / "audit.jsonl"
    now = [1000.0]
    log = AuditLog(str(path), syslog=False, clock=lambda: now[0])
    for i in range(500):
        log.record("alert", peer=f"pid={i} uid=999", reason="malformed frame")
    log.record("alert", reason="another reason")  # its own allowance
    recs = [json.loads(x) for x in raw_lines(path)]
    assert len(recs) == ALERT_BURST + 1 and not any("suppressed" in r for r in recs)
    now[0] += ALERT_WINDOW  # the window is over: the next record of any kind brings out the count
    log.record("accept", bytes=1)
    recs = [json.loads(x) for x in raw_lines(path)]
    assert recs[-2] == dict(recs[-2], event="alert", reason="malformed frame", suppressed=500 - ALERT_BURST)
    assert recs[-1]["event"] == "accept"
    for _ in range(ALERT_BURST + 3):
        log.record("alert", reason="malformed frame")  # a new window: a new allowance
    log.close()  # what is still held back is written on close
    recs = [json.loads(x) for x in raw_lines(path)]
    assert recs[-1] == dict(recs[-1], event="alert", reason="malformed frame", suppressed=3)
    # every alert raised is either written or counted in a summary: none lost
    assert sum(r.get("suppressed", 1) for r in recs if r["event"] == "alert") == 500 + 1 + ALERT_BURST + 3
    assert check(path).ok


def test_alert_reasons_tracked_are_bounded(tmp_path: Path) -> None:
    from mcpd.common.audit.alerts import ALERT_BURST, ALERT_KEYS

    path = tmp_path / "audit.jsonl"
    with AuditLog(str(path), syslog=False, clock=lambda: 0.0) as log:
        for i in range(ALERT_KEYS + 100):  # an attacker varying the reason text
            log.record("alert", reason=f"unknown key 'k{i}'")
        assert len(log._limit._slots) == ALERT_KEYS + 1  # the reasons seen first, and one for all others
    recs = [json.loads(x) for x in raw_lines(path)]
    assert len([r for r in recs if "suppressed" not in r]) == ALERT_KEYS + ALERT_BURST
    assert recs[-1]["reason"] == "(other reasons)" and recs[-1]["suppressed"] == 100 - ALERT_BURST


def race(path: Path, logs: list[AuditLog], threads: int, per_thread: int, rotations: int) -> list[Path]:
    """``threads`` threads write ``per_thread`` records each through ``logs`` (round robin) while
    the path is renamed away ``rotations`` times, logrotate-style; returns the files, oldest first."""
    import threading

    rotated: list[Path] = []

    def write(log: AuditLog, t: int) -> None:
        for i in range(per_thread):
            log.record("accept", user=f"t{t}", bytes=i)

    workers = [threading.Thread(target=write, args=(logs[t % len(logs)], t)) for t in range(threads)]
    for w in workers:
        w.start()
    deadline = time.monotonic() + 60
    for n in range(rotations):
        while path.exists() and path.stat().st_size < 3000 and any(w.is_alive() for w in workers):
            assert time.monotonic() < deadline
        old = path.with_name(f"{path.name}.r{n}")
        os.rename(path, old)
        rotated.append(old)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    for w in workers:
        w.join(60)
    for log in logs:
        log.close()
    return rotated + [path]


def test_threads_racing_rotations_keep_one_whole_chain(tmp_path: Path) -> None:
    """The helper's case: one writer, many threads, logrotate renaming under them."""
    path = tmp_path / "audit.jsonl"
    files = race(path, [AuditLog(str(path), syslog=False)], threads=8, per_thread=250, rotations=6)
    verdict = check(*files)
    assert verdict.ok, verdict
    rotates = sum(json.loads(x)["event"] == "rotate" for f in files for x in raw_lines(f))
    assert 1 <= rotates <= 6 and (verdict.count, verdict.first_seq, verdict.last_seq) == (2000 + rotates, 1, 2000 + rotates)


def test_two_writers_racing_keep_one_whole_chain(tmp_path: Path) -> None:
    """Two writers on one file (a helper still stopping while the next one starts): each takes
    the file lock and goes on from the last line the other wrote."""
    path = tmp_path / "audit.jsonl"
    logs = [AuditLog(str(path), syslog=False), AuditLog(str(path), syslog=False)]
    files = race(path, logs, threads=4, per_thread=300, rotations=0)
    verdict = check(*files)
    assert verdict.ok, verdict
    assert (verdict.count, verdict.last_seq) == (1200, 1200)


def test_two_writers_across_a_rotation_go_on_from_the_last_record_written(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    a, b = AuditLog(str(path), syslog=False), AuditLog(str(path), syslog=False)
    a.record("accept", bytes=1)
    b.record("accept", bytes=2)
    old = rotate_like_logrotate_create(path)
    a.record("accept", bytes=3)  # a's own last record is not the last one: b wrote after it
    b.record("accept", bytes=4)
    a.close()
    b.close()
    assert [json.loads(x).get("bytes") for x in raw_lines(path)] == [None, 3, 4]  # one rotate record, by a
    verdict = check(old, path)
    assert verdict.ok and verdict.count == 5, verdict
