"""`mcpd audit verify` tells the auditor the truth about the whole history: older files deleted
fail (naming the records missing) unless logrotate's retention explains them or the auditor says
where history may begin; a writer's own loss alert anywhere is a failure; every break is listed,
not only the first; a deletion re-chained by hand is not blamed on the last record; records
copied back over newer ones are reported."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import yaml
from click.testing import CliRunner

from mcpd.admin.audit.commands import audit
from mcpd.admin.audit.logfiles import read_lines
from mcpd.admin.audit.verify import verify
from mcpd.common.audit.chain import GENESIS
from mcpd.common.audit.writer import AuditLog


def write(log: AuditLog, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        log.record("accept", user="alice", tool="files/read", requested_path=f"/srv/f{i}", bytes=i)


def rotate(path: Path) -> None:
    """logrotate's create without compression: FILE.N -> FILE.N+1, FILE -> FILE.1, a new empty FILE."""
    n = 1
    while path.with_name(f"{path.name}.{n}").exists():
        n += 1
    for i in range(n - 1, 0, -1):
        os.rename(path.with_name(f"{path.name}.{i}"), path.with_name(f"{path.name}.{i + 1}"))
    os.rename(path, path.with_name(path.name + ".1"))
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def history(tmp_path: Path, state: tuple[Path, int], files: int = 3, per_file: int = 10) -> tuple[Path, Path]:
    """A log of ``files`` files written by one writer keeping its head, and its config."""
    path = tmp_path / "audit.jsonl"
    config = tmp_path / "mcpd.yaml"
    config.write_text(yaml.safe_dump({"audit_log": str(path), "helper_state_dir": str(state[0])}))
    with AuditLog(str(path), syslog=False, head_dir=state[1]) as log:
        for f in range(files):
            if f:
                rotate(path)
            write(log, per_file, start=f * per_file)
    return path, config


def run(*args: str) -> tuple[int, str]:
    out = CliRunner().invoke(audit, ["verify", *args])
    return out.exit_code, out.output


def logrotate_conf(tmp_path: Path, path: Path, keeps: int) -> Path:
    conf = tmp_path / "logrotate.conf"
    conf.write_text(f"# as the shipped file\n{path} {{\n    weekly\n    rotate {keeps}\n    create 0600 a a\n}}\n")
    return conf


def test_deleting_the_oldest_file_fails_and_names_the_records_missing(tmp_path: Path, state: tuple[Path, int]) -> None:
    path, config = history(tmp_path, state)
    oldest = path.with_name(path.name + ".2")
    assert json.loads(oldest.read_text().splitlines()[0])["seq"] == 1
    whole = run("--config", str(config))
    assert whole[0] == 0 and "OK: 32 records, chain whole (seq 1..32)" in whole[1], whole[1]
    oldest.unlink()  # the only file holding seq 1..10
    code, out = run("--config", str(config), "--logrotate", str(tmp_path / "none"))
    assert code == 1, out
    assert f"{path}.1:1: missing: 10 records (seq 1..10) before this line, the first record read" in out
    assert "is the log's file 2: the 1 file before it is not here" in out
    assert "--since-seq 11 accepts a history that begins there" in out
    assert "files not given" not in out and "OK" not in out
    code, out = run("--config", str(config), "--since-seq", "11")  # the auditor says history may begin there
    assert code == 0 and "history begins at seq 11, as --since-seq 11 allows" in out, out
    code, out = run("--config", str(config), "--since-seq", "5")  # but not later than it does
    assert code == 1 and "missing: 6 records (seq 5..10)" in out, out


def test_what_logrotate_removed_by_its_retention_is_told_apart_from_a_deletion(tmp_path: Path,
                                                                                state: tuple[Path, int]) -> None:
    path, config = history(tmp_path, state, files=3)
    path.with_name(path.name + ".2").unlink()  # the log's file 1 of 3
    kept_one = logrotate_conf(tmp_path, path, 1)  # rotate 1: logrotate itself removes file 1
    code, out = run("--config", str(config), "--logrotate", str(kept_one))
    assert code == 0, out
    assert ("seq 1..10 (the log's files 1..1) were removed by logrotate's retention: it keeps 1 rotated files "
            f"({kept_one}) and this log has had 3 files") in out
    kept_two = logrotate_conf(tmp_path, path, 2)  # rotate 2: it would still keep file 1, so someone removed it
    code, out = run("--config", str(config), "--logrotate", str(kept_two))
    assert code == 1 and "missing: 10 records (seq 1..10)" in out, out
    assert "logrotate keeps 2 rotated files of this log" in out and "it would still keep file 1, so they were removed" in out
    code, out = run(str(path.with_name(path.name + ".1")), str(path), "--logrotate", str(kept_one))
    assert code == 1 and "the files given may not be all of them" in out, out  # files given by hand: no retention


def test_a_log_that_begins_with_its_writers_loss_alert_fails(tmp_path: Path, state: tuple[Path, int]) -> None:
    """Stop, delete every log file but keep the head, start: the writer's alert opens the log."""
    path, config = history(tmp_path, state, files=2, per_file=5)
    for p in (path, path.with_name(path.name + ".1")):
        p.unlink()
    AuditLog(str(path), syslog=False, head_dir=state[1]).close()
    (alert,) = [json.loads(x) for x in path.read_text().splitlines()]
    assert alert["event"] == "alert" and alert["missing_to"] == 11 and alert["missing_from"] is None
    code, out = run("--config", str(config))
    assert code == 1, out
    assert "lost: its writer recorded that records were lost: records up to seq 11, the last its writer wrote; " \
           "the log held none of its records, so where the loss begins is not known" in out
    assert "missing: 11 records (seq 1..11) before this line" in out
    tail = CliRunner().invoke(audit, ["tail", "--config", str(config)]).output
    assert "?" not in tail and "records up to seq 11" in tail, tail


def test_every_break_is_listed_with_a_count_not_only_the_first(tmp_path: Path) -> None:
    """A harmless-looking edit first must not hide a deletion and a reordering after it."""
    path = tmp_path / "audit.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        write(log, 20)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"bytes":2', b'"bytes":7')  # an edit of record 3
    del lines[9]  # record 10 deleted
    lines[12], lines[13] = lines[13], lines[12]  # records 15 and 14 swapped
    path.write_bytes(b"".join(lines))
    verdict = verify(read_lines([str(path)]))
    got = [(p.where.rsplit(":", 1)[1], p.kind) for p in verdict.problems]
    assert got == [("3", "edited"), ("10", "deleted"), ("13", "reordered")], verdict.problems
    assert "deleted: 1 record (seq 10) missing before this line" in verdict.problems[1].text
    code, out = run(str(path))
    assert code == 1 and out.splitlines()[-1].startswith("FAILED: 3 problems (1 edited, 1 deleted, 1 reordered)")


def test_a_deletion_rechained_by_hand_is_not_blamed_on_the_last_record(tmp_path: Path, state: tuple[Path, int]) -> None:
    """Root removes seq 46 and renumbers and re-hashes every record after it: the chain is whole
    but one short of the head; verify says what it knows, not that seq 88 was cut off."""
    path, config = history(tmp_path, state, files=1, per_file=88)
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    del recs[45]
    out, prev = [], GENESIS
    for seq, rec in enumerate(recs, 1):
        line = (json.dumps(dict(rec, seq=seq, prev=prev), separators=(",", ":")) + "\n").encode()
        prev = hashlib.sha256(line).hexdigest()
        out.append(line)
    path.write_bytes(b"".join(out))
    code, text = run("--config", str(config))
    assert code == 1, text
    assert ("truncated: 1 record (seq 88) missing: the log ends at seq 87 but its writer's head state says it wrote "
            "up to seq 88; cut off the end, unless records were removed before it and the rest renumbered and "
            "re-chained by hand (the hash its head holds, of its last record, is in no record read)") in text


def test_records_copied_back_over_newer_ones_are_reported(tmp_path: Path, state: tuple[Path, int]) -> None:
    """An old log copied over the new one: the copies are repeated numbers, the writer's records
    in between are lost, and both are named."""
    path, config = history(tmp_path, state, files=2, per_file=10)
    old = path.with_name(path.name + ".1").read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(old[4:]))  # records 5..10 again, in place of 11..21
    with AuditLog(str(path), syslog=False, head_dir=state[1]) as log:
        write(log, 1, start=99)
    code, out = run("--config", str(config))
    assert code == 1, out
    assert f"{path}:1: repeated: 6 records (seq 5..10) again from this line: exact copies of those from {path}.1:5" in out
    assert f"{path}:7: lost: 11 records (seq 11..21) missing before this line; its writer found them gone" in out
