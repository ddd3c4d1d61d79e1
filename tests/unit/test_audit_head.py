"""The audit chain's head lives outside the log: a writer given its state folder keeps the last
sequence number and hash there, checks on start and before each record that the log still ends
where it left it, records a cut-off tail as an alert naming the records gone, never reuses a
sequence number, and `mcpd audit verify` checks the log's end against that head. A rotation by
rename (logrotate's `create`) is no loss."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mcpd.admin.audit.commands import audit
from mcpd.admin.audit.logfiles import read_lines
from mcpd.admin.audit.verify import Verdict, verify
from mcpd.common.audit.chain import LOST_TAIL
from mcpd.common.audit.head import HEAD_FILE, Head, read_head_at
from mcpd.common.audit.writer import AuditLog


def writer(path: Path, state: tuple[Path, int]) -> AuditLog:
    return AuditLog(str(path), syslog=False, head_dir=state[1])


def write(log: AuditLog, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        log.record("accept", user="alice", tool="files/read", requested_path=f"/srv/f{i}", bytes=i)


def records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_bytes().splitlines()]


def cut_last(path: Path, n: int) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    with open(path, "r+b") as f:
        f.truncate(sum(map(len, lines[:-n])))


def verdict(state: tuple[Path, int], *paths: Path) -> Verdict:
    return verify(read_lines([str(p) for p in paths]), read_head_at(str(state[0])))


def test_a_tail_cut_while_the_writer_runs_is_caught_and_no_number_is_reused(tmp_path: Path, state: tuple[Path, int]) -> None:
    path = tmp_path / "audit.jsonl"
    log = writer(path, state)
    try:
        write(log, 48)
        cut_last(path, 2)  # records 47 and 48 gone, at a line boundary
        before = verdict(state, path)  # nothing written since: the head alone shows it
        assert not before.ok and before.problem is not None
        assert before.problem.startswith("truncated: 2 records (seq 47..48) missing: the log ends at seq 46 but its "
                                         "writer's head state says it wrote up to seq 48; cut off the end"), before
        write(log, 1, start=48)
    finally:
        log.close()
    recs = records(path)
    alert, after = recs[-2], recs[-1]
    assert [r["seq"] for r in recs[-3:]] == [46, 49, 50]  # 47 and 48 are never written again
    assert alert["event"] == "alert" and alert["reason"] == LOST_TAIL
    assert (alert["missing_from"], alert["missing_to"], alert["found_seq"]) == (47, 48, 46)
    assert after["requested_path"] == "/srv/f48"
    found = verdict(state, path)
    assert not found.ok and len(found.problems) == 1 and found.count == 48
    assert len(found.losses) == 1 and "lost: 2 records (seq 47..48) missing before this line" in found.losses[0]


def test_a_tail_cut_while_the_writer_is_stopped_is_an_alert_on_start(tmp_path: Path, state: tuple[Path, int]) -> None:
    path = tmp_path / "audit.jsonl"
    with writer(path, state) as log:
        write(log, 10)
    cut_last(path, 3)
    with writer(path, state):  # no record yet: the check is made on start
        pass
    recs = records(path)
    assert [r["seq"] for r in recs[-2:]] == [7, 11]
    assert recs[-1]["event"] == "alert" and (recs[-1]["missing_from"], recs[-1]["missing_to"]) == (8, 10)
    with writer(path, state):  # and only once: the log now ends where the head says
        pass
    assert len(records(path)) == len(recs)


def test_a_last_record_rewritten_while_stopped_is_caught(tmp_path: Path, state: tuple[Path, int]) -> None:
    path = tmp_path / "audit.jsonl"
    with writer(path, state) as log:
        write(log, 5)
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"bytes":4', b'"bytes":9'))  # same length, the last record's bytes
    assert verdict(state, path).problem == ("edited: record seq 5 is not the one its writer wrote "
                                            "(its head state holds another hash)")
    with writer(path, state):
        pass
    alert = records(path)[-1]
    assert alert["reason"] == LOST_TAIL and (alert["seq"], alert["missing_from"], alert["missing_to"]) == (6, 5, 5)


@pytest.mark.parametrize("running", [True, False])
def test_a_rotation_by_rename_is_no_loss(tmp_path: Path, state: tuple[Path, int], running: bool) -> None:
    path = tmp_path / "audit.jsonl"
    old = path.with_name(path.name + ".1")
    log = writer(path, state)
    try:
        write(log, 4)
        if not running:
            log.close()
        os.rename(path, old)  # logrotate's create: rename, then a new empty file
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        if not running:
            log = writer(path, state)
        write(log, 2, start=4)
    finally:
        log.close()
    assert not any(r["event"] == "alert" for r in records(old) + records(path))
    assert [(r["seq"], r["event"]) for r in records(path)] == [(5, "rotate"), (6, "accept"), (7, "accept")]
    found = verdict(state, old, path)
    assert found.ok and found.count == 7 and found.head_checked


def test_a_log_emptied_in_place_is_an_alert_and_the_chain_goes_on(tmp_path: Path, state: tuple[Path, int]) -> None:
    """copytruncate (which the shipped logrotate file never uses) empties the file in place: the
    writer cannot tell it from a cut, says so, and goes on from the records it wrote, so the copy
    and the new file still chain whole."""
    path = tmp_path / "audit.jsonl"
    copy = path.with_name(path.name + ".1")
    with writer(path, state) as log:
        write(log, 3)
        shutil.copyfile(path, copy)
        os.truncate(path, 0)
        write(log, 1, start=3)
    recs = records(path)
    assert recs[0]["event"] == "alert" and recs[0]["missing_to"] == 3 and recs[0]["missing_from"] is None
    assert [r["seq"] for r in recs] == [4, 5]
    assert verdict(state, copy, path).ok


def test_the_head_is_one_fixed_width_line_of_a_0600_file_rewritten_in_place(tmp_path: Path, state: tuple[Path, int]) -> None:
    path = tmp_path / "audit.jsonl"
    head = state[0] / HEAD_FILE
    with writer(path, state) as log:
        write(log, 1)
        inode, first = head.stat().st_ino, head.read_bytes()
        write(log, 99, start=1)
        assert head.stat().st_ino == inode and len(head.read_bytes()) == len(first)
    st = head.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_nlink == 1
    got = Head.decode(head.read_bytes())
    last = path.read_bytes().splitlines(keepends=True)[-1]
    assert (got.seq, got.hash, got.end, got.length) == (100, hashlib.sha256(last).hexdigest(), path.stat().st_size, len(last))
    assert got.log == str(path) and got.ino == path.stat().st_ino


def test_an_unreadable_head_is_an_alert_and_written_anew(tmp_path: Path, state: tuple[Path, int]) -> None:
    path = tmp_path / "audit.jsonl"
    with writer(path, state) as log:
        write(log, 2)
    (state[0] / HEAD_FILE).write_bytes(b"garbage\n")
    with writer(path, state):
        pass
    assert records(path)[-1]["reason"] == "the audit log's head state was unreadable; it is written anew"
    assert Head.decode((state[0] / HEAD_FILE).read_bytes()).seq == 3


def test_a_head_that_is_a_symlink_is_refused(tmp_path: Path, state: tuple[Path, int]) -> None:
    (state[0] / HEAD_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        writer(tmp_path / "audit.jsonl", state)


def test_without_a_head_a_running_writer_still_catches_a_cut(tmp_path: Path) -> None:
    """The front's access log keeps no head file, but its writer remembers where it left the log."""
    path = tmp_path / "access.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        write(log, 5)
        cut_last(path, 1)
        write(log, 1, start=5)
    assert [(r["seq"], r["event"]) for r in records(path)[-2:]] == [(6, "alert"), (7, "accept")]


def test_verify_command_names_the_missing_range_and_fails(tmp_path: Path, state: tuple[Path, int]) -> None:
    path = tmp_path / "audit.jsonl"
    config = tmp_path / "mcpd.yaml"
    config.write_text(yaml.safe_dump({"audit_log": str(path), "helper_state_dir": str(state[0])}))
    with writer(path, state) as log:
        write(log, 48)
        ok = CliRunner().invoke(audit, ["verify", "--config", str(config)])
        assert ok.exit_code == 0 and "its end is where its writer left it (seq 48)" in ok.output, ok.output
        cut_last(path, 2)
        cut = CliRunner().invoke(audit, ["verify", "--config", str(config)])
        assert cut.exit_code == 1 and "audit.jsonl:46: truncated: 2 records (seq 47..48) missing" in cut.output, cut.output
        assert "its end is where" not in cut.output
        write(log, 1, start=48)
    out = CliRunner().invoke(audit, ["verify", "--config", str(config)])
    assert out.exit_code == 1, out.output
    assert "audit.jsonl:47: lost: 2 records (seq 47..48) missing before this line" in out.output
    assert out.output.splitlines()[-1].startswith("FAILED: 1 problem (1 lost); 48 records read (seq 1..50)")


def test_a_copy_of_the_log_put_in_its_place_is_no_loss(tmp_path: Path, state: tuple[Path, int]) -> None:
    """A new inode holding the same records (a restore, a move across file systems) ends with the
    record the head names: nothing is lost, nothing is said."""
    path = tmp_path / "audit.jsonl"
    with writer(path, state) as log:
        write(log, 3)
    copy = tmp_path / "copy"
    shutil.copyfile(path, copy)
    os.replace(copy, path)
    with writer(path, state) as log:
        write(log, 1, start=3)
    assert [(r["seq"], r["event"]) for r in records(path)] == [(1, "accept"), (2, "accept"), (3, "accept"), (4, "accept")]
