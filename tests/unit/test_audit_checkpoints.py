"""Checkpoints of the chains leave the log (docs/REFERENCE.md §7.3): when they are sent (every N
records, at most M seconds after a record), what they say, and `mcpd audit verify --checkpoints`
reading the three forms a collector keeps, untrusted: a forged or malformed line is an error
naming it, escaped, never a traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from mcpd.admin.audit.checkpoints import CheckpointFileError, parse_line, read_checkpoints
from mcpd.admin.audit.commands import audit
from mcpd.common import config
from mcpd.common.audit.chain import record_hash
from mcpd.common.audit.checkpoint import CHECKPOINT_IDENT, MESSAGE_ID, Checkpoint, Checkpoints, parse_message
from mcpd.common.audit.writer import AuditLog
from tests.support.syslog import SyslogSink

HASH = "ab" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def sink() -> Iterator[SyslogSink]:
    s = SyslogSink(reading=False)  # read when asked: what was sent before is all there
    yield s
    s.close()


def points(sink: SyslogSink) -> list[Checkpoint]:
    found = [parse_message(line.decode()) for line in sink.lines()]
    assert None not in found
    return found  # type: ignore[return-value]


def test_a_checkpoint_follows_every_n_records(sink: SyslogSink) -> None:
    cp = Checkpoints("mcpd-audit", "/l", records=3, seconds=60, syslog=sink.path, clock=Clock(), timer=False)
    for seq in range(1, 8):
        cp.wrote(1, seq, f"{seq:064x}")
    assert [(p.seq, p.hash) for p in points(sink)] == [(3, f"{3:064x}"), (6, f"{6:064x}")]
    cp.wrote(5, 12, HASH)  # several records in one write: one checkpoint, of the last
    cp.close()  # and on close, the records not covered yet (none here)
    assert [p.seq for p in points(sink)] == [3, 6, 12]


def test_a_record_is_covered_at_most_m_seconds_after_it_was_written(sink: SyslogSink) -> None:
    clock = Clock()
    cp = Checkpoints("mcpd-access", "/l", records=100, seconds=60, syslog=sink.path, clock=clock,
                     timer=False)
    cp.wrote(1, 1, HASH)
    clock.now += 59
    cp.poll()
    cp.wrote(1, 2, HASH)
    assert points(sink) == []
    clock.now += 1  # 60 s after record 1: due, covering record 2 too
    cp.poll()
    assert points(sink) == [Checkpoint("mcpd-access", 2, HASH)]
    cp.poll()
    clock.now += 120
    cp.poll()  # nothing new written: nothing sent
    cp.wrote(1, 3, "cd" * 32)
    clock.now += 61
    cp.wrote(1, 4, "ef" * 32)  # the next record sees the time too
    assert [p.seq for p in points(sink)] == [2, 4]
    cp.wrote(1, 5, HASH)
    cp.close()  # closing covers what is left
    assert [p.seq for p in points(sink)] == [2, 4, 5]


def test_the_timer_sends_a_checkpoint_with_no_further_record(sink: SyslogSink, tmp_path: Path) -> None:
    with AuditLog(str(tmp_path / "a.jsonl"), journal="", checkpoints=(1000, 0.05), syslog_socket=sink.path) as log:
        log.record("accept", user="a")
        (line,) = sink.lines(wait_for=1)  # waits for it: no duration is asserted
        last = (tmp_path / "a.jsonl").read_bytes()
        assert parse_message(line.decode()) == Checkpoint("mcpd-audit", 1, record_hash(last))


def test_the_checkpoint_forms() -> None:
    point = Checkpoint("mcpd-audit", 42, HASH)
    line = point.syslog_line(0).decode()
    assert re.fullmatch(rf"<29>[A-Z][a-z]{{2}} [ 123]\d \d\d:\d\d:\d\d {CHECKPOINT_IDENT}\[\d+\]: "
                        rf"mcpd checkpoint log=mcpd-audit seq=42 hash={HASH}", line)
    entry = point.journal_entry("/var/log/mcpd/audit.jsonl")
    fields = {}
    while entry:
        key, _, entry = entry.partition(b"\n")
        size = int.from_bytes(entry[:8], "little")
        fields[key.decode()], entry = entry[8:8 + size].decode(), entry[9 + size:]
    assert fields == {"MESSAGE": point.message(), "MESSAGE_ID": MESSAGE_ID, "SYSLOG_IDENTIFIER": CHECKPOINT_IDENT,
                      "PRIORITY": "5", "MCPD_LOG": "mcpd-audit", "MCPD_CHECKPOINT_SEQ": "42",
                      "MCPD_CHECKPOINT_HASH": HASH, "MCPD_LOG_FILE": "/var/log/mcpd/audit.jsonl"}


def test_the_three_input_forms_parse_alike() -> None:
    point = Checkpoint("mcpd-audit", 42, HASH)
    native = {"__CURSOR": "s=1", "MESSAGE": point.message(), "MCPD_LOG": "mcpd-audit", "MCPD_CHECKPOINT_SEQ": "42",
              "MCPD_CHECKPOINT_HASH": HASH, "_HOSTNAME": "h"}
    via_syslog = {"__CURSOR": "s=2", "MESSAGE": point.message(), "SYSLOG_IDENTIFIER": CHECKPOINT_IDENT}
    as_bytes = {"MESSAGE": list(point.message().encode())}  # how journalctl prints a binary value
    forms = [json.dumps(native), json.dumps(via_syslog), json.dumps(as_bytes),
             point.syslog_line(0).decode(),  # as sent to /dev/log
             f"2026-12-04T14:32:42.102140+00:00 host1 {CHECKPOINT_IDENT}[77]: {point.message()}",  # rsyslog's file
             f"<29>1 2026-12-04T14:32:42Z host1 {CHECKPOINT_IDENT} 77 - - {point.message()}",  # RFC 5424 forwarded
             json.dumps({"log": "mcpd-audit", "seq": 42, "hash": HASH.upper()})]
    assert [parse_line(f) for f in forms] == [point] * len(forms)


@pytest.mark.parametrize(("line", "says"), [
    ("not json {", "not a checkpoint"),
    ('{"seq": 1,', "not valid JSON"),
    ("[1, 2]", "not a checkpoint"),
    ('{"log": "mcpd-audit", "seq": true, "hash": "%s"}' % HASH, '"seq" an integer'),
    ('{"log": "mcpd-audit", "seq": 0, "hash": "%s"}' % HASH, "no record number"),
    ('{"log": "mcpd-audit", "seq": 3}', "neither a journal entry"),
    ('{"log": "x y", "seq": 3, "hash": "%s"}' % HASH, "no log name"),
    ('{"log": "mcpd-audit", "seq": 3, "hash": "abc"}', "no SHA-256"),
    ('{"MESSAGE": "hello", "_PID": "1"}', "no checkpoint"),
    ('{"MCPD_CHECKPOINT_SEQ": "3", "MCPD_LOG": ["a", "b"], "MCPD_CHECKPOINT_HASH": "%s"}' % HASH, "repeated"),
    ("x mcpd checkpoint log=mcpd-audit seq=12 hash=short", "is not followed by"),
    (f"x mcpd checkpoint log=mcpd-audit seq=1{'0' * 19} hash={HASH}", "is not followed by"),
])
def test_malformed_lines_are_refused_with_their_number(tmp_path: Path, line: str, says: str) -> None:
    path = tmp_path / "cps"
    path.write_text(f'{json.dumps({"log": "mcpd-audit", "seq": 1, "hash": HASH})}\n\n{line}\n')
    with pytest.raises(CheckpointFileError) as caught:
        read_checkpoints(str(path))
    assert str(caught.value).startswith(f"{path}:3: ") and says in str(caught.value)


def test_a_forged_line_is_shown_escaped_and_exits_2(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    with AuditLog(str(log), syslog=False) as w:
        w.record("accept", user="a")
    cps = tmp_path / "cps"
    cps.write_bytes(b"\x1b[2J\x1b[1;1HOK: checkpoints all match\r\n")
    out = CliRunner().invoke(audit, ["verify", "--checkpoints", str(cps), str(log)])
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit)  # an exit, no traceback
    assert f"error: {cps}:1: not a checkpoint" in out.output and "\x1b" not in out.output
    assert "\\x1b[2J" in out.output and "Traceback" not in out.output
    cps.write_bytes(b"\xff\xfe\n")
    out = CliRunner().invoke(audit, ["verify", "--checkpoints", str(cps), str(log)])
    assert out.exit_code == 2 and "1: not UTF-8" in out.output


def verify(log: Path, cps: Path, *more: str) -> tuple[int, str]:
    out = CliRunner().invoke(audit, ["verify", "--checkpoints", str(cps), *more, str(log) + ".1", str(log)])
    assert isinstance(out.exception, (SystemExit, type(None))), out.exception
    return out.exit_code, out.output


def test_verify_names_the_checkpoint_the_log_fails(tmp_path: Path, sink: SyslogSink) -> None:
    """Checkpoints over a rotation: the records are found in the rotated file too; a cut end, a
    record rewritten and re-chained, and checkpoints of another log are each told apart."""
    log = tmp_path / "a.jsonl"
    with AuditLog(str(log), journal="", checkpoints=(2, 60), syslog_socket=sink.path) as w:
        for i in range(5):
            w.record("accept", user="a", requested_path=f"/f{i}")
        log.rename(str(log) + ".1")
        for i in range(5, 9):
            w.record("accept", user="a", requested_path=f"/f{i}")
    cps = sink.write(tmp_path / "cps")
    with cps.open("a") as f:  # the other log's checkpoint, in the plain form
        f.write(json.dumps({"log": "mcpd-access", "seq": 3, "hash": HASH}) + "\n")
    code, out = verify(log, cps)
    assert code == 0, out
    assert "OK: checkpoints: 5 of mcpd-audit match the log, the last covering seq 10; 1 of other logs" in out
    code, out = verify(log, cps, "--access")  # the access log's checkpoint: its seq 3 is no such record
    assert code == 1 and "rewritten: record seq 3" in out

    # the new file: rotate record (seq 6), then seq 7 .. 10; checkpoints of seq 2, 4, 7, 9, 10
    original = log.read_bytes()
    lines = original.splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:2]))  # cut after seq 7
    code, out = verify(log, cps)
    assert code == 1 and out.splitlines()[1].startswith(
        f"{log}:2: truncated: record seq 9 is missing: the log ends at seq 7, but the checkpoint at {cps}:")

    log.write_bytes(original)
    rechained = [lines[2].replace(b'"/f6"', b'"/f9"')]  # seq 8 rewritten, every later prev recomputed
    for line in lines[3:]:
        rechained.append(line.replace(json.loads(line)["prev"].encode(), record_hash(rechained[-1]).encode()))
    log.write_bytes(b"".join(lines[:2] + rechained))
    assert CliRunner().invoke(audit, ["verify", str(log) + ".1", str(log)]).exit_code == 0  # whole again
    code, out = verify(log, cps)
    assert code == 1
    assert out.splitlines()[1].startswith(f"{log}:4: rewritten: record seq 9 hashes to {record_hash(rechained[1])}")
    assert out.splitlines()[1].endswith("the first record changed is one of seq 8..9 (the checkpoint of seq 7 matches)")
    assert "FAILED: checkpoints: the log does not match 2 of the checkpoints of mcpd-audit (and 1 more); 3 match" in out


def test_no_checkpoint_of_this_log_is_a_failure(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    with AuditLog(str(log), syslog=False) as w:
        w.record("accept", user="a")
    cps = tmp_path / "cps"
    cps.write_text(json.dumps({"log": "mcpd-access", "seq": 1, "hash": HASH}) + "\n")
    out = CliRunner().invoke(audit, ["verify", "--checkpoints", str(cps), str(log)])
    assert out.exit_code == 1 and "FAILED: checkpoints: none of mcpd-audit to check; 1 of other logs" in out.output


@pytest.mark.parametrize(("audit_section", "says"), [
    ({"checkpoint_records": 0}, "audit.checkpoint_records: must be at least 1"),
    ({"checkpoint_seconds": 0}, "audit.checkpoint_seconds"),
    ({"checkpoint_seconds": 86401}, "audit.checkpoint_seconds"),
    ({"syslog_socket": "dev/log"}, "audit.syslog_socket"),
    ({"every": 3}, "unknown key 'every'"),
])
def test_the_cadence_is_validated(audit_section: dict[str, object], says: str) -> None:
    with pytest.raises(config.ConfigError, match=re.escape(says)):
        config.from_dict({"audit": audit_section})
    assert config.from_dict({"audit": {"checkpoint_records": 1, "syslog_socket": ""}}).audit.writer_args() == \
        {"checkpoints": (1, 60.0), "syslog_socket": ""}


def test_a_full_or_missing_syslog_socket_never_holds_a_record_back(tmp_path: Path) -> None:
    """Nobody reads the sink: once its queue is full, checkpoints are dropped, records still written."""
    log = tmp_path / "a.jsonl"
    sink = SyslogSink(reading=False)
    try:
        with AuditLog(str(log), journal="", checkpoints=(1, 60), syslog_socket=sink.path) as w:
            for i in range(1200):
                w.record("accept", user="a", requested_path=f"/f{i}")
        assert len(log.read_bytes().splitlines()) == 1200
        assert 0 < len(sink.lines()) < 1200  # (the kernel queued a few; the rest were dropped)
    finally:
        sink.close()
    with AuditLog(str(tmp_path / "b.jsonl"), journal="", checkpoints=(1, 60),
                  syslog_socket=str(tmp_path / "none")) as w:
        w.record("accept", user="a")


def _chained(tmp_path: Path, n: int) -> tuple[Path, list[bytes]]:
    log = tmp_path / "c.jsonl"
    with AuditLog(str(log), syslog=False) as w:
        for i in range(n):
            w.record("accept", user="a", requested_path=f"/f{i}")
    return log, log.read_bytes().splitlines(keepends=True)


def _plain(cps: Path, *points: tuple[int, str]) -> None:
    cps.write_text("".join(json.dumps({"log": "mcpd-audit", "seq": s, "hash": h}) + "\n" for s, h in points))


def test_a_forged_second_checkpoint_of_a_seq_is_a_conflict_never_a_match(tmp_path: Path) -> None:
    """The host's root rewrote record 3, re-chained the log and sent checkpoints of the new chain:
    the collector holds both checkpoints of seq 3. Whichever the log matches, the two conflict:
    verify fails naming seq 3, and neither is counted as a match."""
    log, lines = _chained(tmp_path, 4)
    cps = tmp_path / "cps"
    _plain(cps, (2, record_hash(lines[1])), (3, record_hash(lines[2])), (3, "cd" * 32))
    out = CliRunner().invoke(audit, ["verify", "--checkpoints", str(cps), str(log)])
    assert out.exit_code == 1, out.output
    assert "conflicting: 2 checkpoints give record seq 3 different hashes" in out.output
    assert f"at {cps}:2" in out.output and f"at {cps}:3" in out.output
    assert "FAILED: checkpoints: the log does not match 1 of the checkpoints of mcpd-audit; 1 match" in out.output
    assert "OK: checkpoints" not in out.output
    _plain(cps, (3, "cd" * 32), (3, record_hash(lines[2])))  # the forged one first: the same verdict
    out = CliRunner().invoke(audit, ["verify", "--checkpoints", str(cps), str(log)])
    assert out.exit_code == 1 and "conflicting: 2 checkpoints give record seq 3" in out.output
    _plain(cps, (3, record_hash(lines[2])), (3, record_hash(lines[2])))  # the same one twice: one checkpoint
    out = CliRunner().invoke(audit, ["verify", "--checkpoints", str(cps), str(log)])
    assert out.exit_code == 0 and "OK: checkpoints: 1 of mcpd-audit match" in out.output


def test_a_forged_second_record_of_a_checkpointed_seq_is_never_a_match(tmp_path: Path) -> None:
    """The log holds its record 3 as checkpointed, and after it a forged record numbered 3: the
    checkpoint proves neither, and the repeated run is not called exact copies."""
    log, lines = _chained(tmp_path, 4)
    forged = lines[2].replace(b'"/f2"', b'"/fX"')
    log.write_bytes(b"".join(lines[:3]) + lines[1] + forged)  # seq 2 again (an exact copy), then a forged 3
    cps = tmp_path / "cps"
    _plain(cps, (3, record_hash(lines[2])))
    out = CliRunner().invoke(audit, ["verify", "--checkpoints", str(cps), str(log)])
    assert out.exit_code == 1, out.output
    assert f"{log}:4: repeated: 2 records (seq 2..3) again from this line: records numbered as those from" in out.output
    assert "exact copies" not in out.output
    assert f"{log}:5: rewritten: the log holds 2 different records numbered seq 3" in out.output
    assert "OK: checkpoints" not in out.output


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """`mcpd audit ARGS` in its own process: a reader that waited on a FIFO would fail the timeout."""
    return subprocess.run([sys.executable, "-m", "mcpd.admin.cli", "audit", *args], capture_output=True, text=True,
                          timeout=30)


def test_deeply_nested_json_is_an_error_naming_the_line_never_a_traceback(tmp_path: Path) -> None:
    log, lines = _chained(tmp_path, 2)
    deep = "[" * 200000 + "]" * 200000
    cps = tmp_path / "cps"
    cps.write_text(json.dumps({"log": "mcpd-audit", "seq": 1, "hash": HASH}) + "\n" + '{"log": ' + deep[:60000] + "}\n")
    proc = _run("verify", "--checkpoints", str(cps), str(log))
    assert proc.returncode == 2 and f"error: {cps}:2: not a checkpoint: JSON nested too deeply" in proc.stderr
    assert "Traceback" not in proc.stderr
    log.write_bytes(lines[0] + b'{"seq": 2, "x": ' + deep.encode() + b"}\n" + lines[1])
    proc = _run("verify", str(log))
    assert proc.returncode == 1 and f"{log}:2: edited: not a valid chained record" in proc.stdout, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_line_over_the_cap_is_refused_naming_it(tmp_path: Path) -> None:
    from mcpd.admin.audit.checkpoints import MAX_LINE
    from mcpd.admin.audit.logfiles import MAX_LINE as LOG_LINE
    log, lines = _chained(tmp_path, 2)
    cps = tmp_path / "cps"
    cps.write_text(json.dumps({"log": "mcpd-audit", "seq": 1, "hash": record_hash(lines[0])}) + "\n"
                   + "x" * (MAX_LINE + 1) + "\n")
    proc = _run("verify", "--checkpoints", str(cps), str(log))
    assert proc.returncode == 2 and f"error: {cps}:2: a line over {MAX_LINE} bytes is no checkpoint" in proc.stderr
    log.write_bytes(lines[0] + b"y" * (8 * LOG_LINE))  # no newline in 8 MiB: read no further than the cap
    proc = _run("verify", str(log))
    assert proc.returncode == 1 and f"error: {log}:2: a line over {LOG_LINE} bytes is no record" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_fifo_is_refused_never_waited_on(tmp_path: Path) -> None:
    """Nobody writes to the FIFOs: a reader that opened and read them would block until the timeout."""
    log, _ = _chained(tmp_path, 1)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = _run("verify", "--checkpoints", str(fifo), str(log))
    assert proc.returncode == 2 and f"error: {fifo}: not a regular file" in proc.stderr
    proc = _run("verify", str(fifo))
    assert proc.returncode == 1 and f"error: {fifo}: not a regular file" in proc.stderr
    gz = tmp_path / "old.jsonl.1.gz"
    os.mkfifo(gz)
    proc = _run("verify", str(gz), str(log))
    assert proc.returncode == 1 and f"error: {gz}: not a regular file" in proc.stderr
    for follow in ([], ["--follow"]):
        proc = _run("tail", *follow, "--file", str(fifo))
        assert proc.returncode == 1 and f"error: {fifo}: not a regular file" in proc.stderr, proc.stderr
