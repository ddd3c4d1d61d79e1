"""docs/REFERENCE.md §4.5: the audit log — one JSON line per record, private files, secrets never logged."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import hypothesis
import hypothesis.strategies as st
import pytest
from click.testing import CliRunner

from mcpd.admin.audit.commands import audit
from mcpd.admin.audit.logfiles import tail_lines
from mcpd.common.audit import records as audit_format
from mcpd.common.audit.chain import GENESIS
from mcpd.common.audit.records import AuditError
from mcpd.common.audit.writer import AuditLog


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_audit_record_is_one_json_line_with_fields(tmp_path: Path) -> None:
    path = tmp_path / "log" / "audit.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        log.record("accept", user="alice", os_user="alice", peer="127.0.0.1:5555", session="ab" * 16,
                   tool="files/read", requested_path="/var/log/../log/x\nfake", resolved_path="/var/log/x",
                   rule="users.alice files/read paths /var/log", decision="allowed", reason="granted", bytes=12)
        log.record("reject", user="bob", tool="files/read", requested_path="/etc/shadow",
                   decision="denied", reason="no grant covers this path", bytes=0)
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    first, second = records(path)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", first["time"])
    assert first["event"] == "accept" and first["bytes"] == 12
    assert first["requested_path"] == "/var/log/../log/x\nfake"  # newline escaped, still one line
    assert second["event"] == "reject" and second["reason"] == "no grant covers this path"


def test_audit_file_0600_in_0700_folder(tmp_path: Path) -> None:
    folder = tmp_path / "auditdir"
    with AuditLog(str(folder / "audit.jsonl"), syslog=False) as log:
        log.record("reload", decision="loaded")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "audit.jsonl").stat().st_mode) == 0o600
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    (loose / "a.jsonl").write_text("")
    os.chmod(loose / "a.jsonl", 0o644)
    AuditLog(str(loose / "a.jsonl"), syslog=False).close()
    assert stat.S_IMODE(loose.stat().st_mode) == 0o755  # an existing folder is left as it is
    assert stat.S_IMODE((loose / "a.jsonl").stat().st_mode) == 0o600


def test_a_log_in_a_folder_other_accounts_may_write_is_refused_and_the_folder_left_alone(tmp_path: Path) -> None:
    """A log directly in a shared folder (``/tmp``: 1777) could be replaced by another account;
    the writer refuses it, and never changes that folder's mode (tightening ``/tmp`` to 0700
    would break every other account on the host)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(OSError, match="writable by other accounts"):
        AuditLog(str(shared / "audit.jsonl"), syslog=False)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


@pytest.mark.parametrize("key", ["token", "password", "content", "contents", "secret", "user_password",
                                 "bearer_token"])
def test_audit_never_logs_tokens_passwords_or_contents(tmp_path: Path, key: str) -> None:
    path = tmp_path / "a.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        with pytest.raises(AuditError):
            log.record("accept", **{key: "hunter2"})
    assert path.read_text() == ""


def test_audit_refuses_non_scalar_values_and_bad_names(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        with pytest.raises(AuditError):
            log.record("accept", reason={"text": "file body"})
        with pytest.raises(AuditError):
            log.record("accept", reason=b"bytes")
        with pytest.raises(AuditError):
            log.record("Accept; rm")
        with pytest.raises(AuditError):
            log.record("accept", time="forged")
    assert path.read_text() == ""


def test_audit_appends_across_writers(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"event":"old"}\n')
    os.chmod(path, 0o600)
    a, b = AuditLog(str(path), syslog=False), AuditLog(str(path), syslog=False)
    for i in range(50):
        a.record("accept", bytes=i)
        b.record("reject", bytes=i)
    a.close()
    b.close()
    got = records(path)
    assert len(got) == 101 and got[0] == {"event": "old"}
    assert [r["bytes"] for r in got[1:]] == [i for i in range(50) for _ in (0, 1)]
    assert [r["seq"] for r in got[1:]] == list(range(1, 101))  # one chain, whichever writer wrote


def test_audit_log_symlink_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "a.jsonl").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        AuditLog(str(tmp_path / "a.jsonl"), syslog=False)


def test_tail_lines_reads_backwards(tmp_path: Path) -> None:
    path = tmp_path / "t"
    lines = [f"line {i} " + "x" * (i % 37) for i in range(500)]
    path.write_text("\n".join(lines) + "\n")
    raw = [line.encode() for line in lines]
    assert tail_lines(str(path), 3, block=16) == raw[-3:]
    assert tail_lines(str(path), 1000, block=7) == raw
    assert tail_lines(str(path), 0) == []
    path.write_text("a\nb")
    assert tail_lines(str(path), 5, block=1) == [b"a", b"b"]


def test_audit_tail_command(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        for i in range(5):
            log.record("accept", bytes=i)
    out = CliRunner().invoke(audit, ["tail", "-n", "2", "--json", "--file", str(path)])
    assert out.exit_code == 0
    assert [json.loads(line)["bytes"] for line in out.output.splitlines()] == [3, 4]
    missing = CliRunner().invoke(audit, ["tail", "--file", str(tmp_path / "none")])
    assert missing.exit_code == 1


def test_a_prepared_record_is_written_as_record_would_with_the_late_fields_last(tmp_path: Path) -> None:
    """prepare()/finish() (the privileged read's record, encoded while the worker reads) writes the
    same line record() would for the same fields in the same order, as the next link of the chain."""
    from mcpd.admin.audit.logfiles import read_lines
    from mcpd.admin.audit.verify import verify

    path = tmp_path / "a.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        log.record("reload", decision="loaded")
        prepared = log.prepare("accept", user="alice", requested_path="/var/log/x\n\u00e9", decision="accept")
        log.record("reject", user="bob", reason="no grant covers this path")  # written in between
        log.finish(prepared, outcome=None, bytes=4096, duration_ms=0.8)
        log.record("accept", user="alice", requested_path="/var/log/x\n\u00e9", decision="accept", outcome=None,
                   bytes=4096, duration_ms=0.8)
    lines = path.read_text().splitlines()
    assert len(lines) == 4
    finished, recorded = json.loads(lines[2]), json.loads(lines[3])
    assert [finished["seq"], recorded["seq"]] == [3, 4]
    assert list(finished) == list(recorded) == ["seq", "prev", "time", "event", "user", "requested_path", "decision",
                                                "outcome", "bytes", "duration_ms"]
    assert {k: v for k, v in finished.items() if k not in ("seq", "prev", "time")} == \
        {k: v for k, v in recorded.items() if k not in ("seq", "prev", "time")}
    assert lines[2].isascii()
    assert verify(read_lines([str(path)])).ok


def test_a_prepared_record_refuses_what_record_refuses_and_a_field_given_twice(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        with pytest.raises(AuditError):
            log.prepare("accept", token="hunter2")
        with pytest.raises(AuditError):
            log.prepare("alert", reason="x")  # alerts are rate-limited when written: record() only
        prepared = log.prepare("accept", user="alice", bytes=0)
        with pytest.raises(AuditError):
            log.finish(prepared, bytes=4096)
        with pytest.raises(AuditError):
            log.finish(prepared, content="file body")
    assert path.read_text() == ""


def test_records_are_written_with_the_values_given_even_when_the_same_fields_repeat(tmp_path: Path) -> None:
    """Text fields are encoded once and remembered; values that compare equal across types
    (``1``, ``True``, ``1.0``) and text that only looks alike are still written as given, and a
    record's time is when it was made, in UTC."""
    import datetime

    path = tmp_path / "audit.jsonl"
    who = {"user": "alice", "requested_path": "/var/log/x\u00e9", "grant": None}
    with AuditLog(str(path), syslog=False) as log:
        for value in (1, True, 1.0, "1", None, "None", 0, False):
            log.record("accept", **who, bytes=value)
            log.finish(log.prepare("accept", **who), bytes=value)
        log.record("accept", **dict(who, grant="None"))
    got = records(path)
    assert [r["bytes"] for r in got[:-1]] == [v for v in (1, True, 1.0, "1", None, "None", 0, False) for _ in (0, 1)]
    assert [type(r["bytes"]) for r in got[:-1:2]] == [int, bool, float, str, type(None), str, int, bool]
    assert all(r["requested_path"] == "/var/log/x\u00e9" and r["grant"] is None for r in got[:-1])
    assert got[-1]["grant"] == "None"
    when = datetime.datetime.strptime(got[0]["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.UTC)
    assert abs((datetime.datetime.now(datetime.UTC) - when).total_seconds()) < 60


def test_a_record_that_cannot_be_written_leaves_no_lock_behind(tmp_path: Path) -> None:
    """The log is rotated away and its path made a folder, so the writer cannot open it again:
    the record fails with an error, and the old file's lock is released at once (before, another
    writer waiting for it would have waited for ever). Once the path is a file again, records
    go on, and the chain with them."""
    import fcntl

    path = tmp_path / "audit.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        log.record("accept", user="alice")
        os.rename(path, tmp_path / "audit.jsonl.1")
        path.mkdir()
        with pytest.raises(OSError):
            log.record("accept", user="bob")
        other = os.open(tmp_path / "audit.jsonl.1", os.O_RDONLY)
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while the lock is held
        finally:
            os.close(other)
        path.rmdir()
        log.record("accept", user="carol")
    first = records(tmp_path / "audit.jsonl.1")
    after = records(path)
    assert [r.get("user") for r in first + after] == ["alice", None, "carol"]
    assert (after[0]["event"], after[0]["file_number"]) == ("rotate", 2)  # the new file says which it is
    assert after[0]["seq"] == first[-1]["seq"] + 1


@pytest.mark.parametrize("event, key", [("accept\n", "user"), ("accept", "user\n"), ("accept", "token\n"),
                                        ("accept\r", "user"), ("accept", "password\n")])
def test_event_and_field_names_with_a_trailing_newline_are_refused(tmp_path: Path, event: str, key: str) -> None:
    """The event name goes into the line unescaped (it is checked plain ASCII): a name ending in a
    newline would cut the record in two (a forged second line), and a field named ``token\\n``
    would slip past the names that are never logged."""
    path = tmp_path / "audit.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        with pytest.raises(AuditError):
            log.record(event, **{key: "x"})
        with pytest.raises(AuditError):
            log.prepare(event, **{key: "x"})
    assert path.read_text() == ""


HOSTILE = ['/a"}\n{"seq":1,"event":"accept"', "/a\\", "/a\r\n/b", "/\u2028\u2029", "/\udcff", "/\x00\x1b[2J",
           "/\U0001f600" * 1100, "/x" * 3000, "/é"]


def test_remembered_text_fields_encode_hostile_strings_as_one_line_that_reads_back(tmp_path: Path) -> None:
    """Text fields are encoded once and remembered. Every string (quotes, backslashes, newlines,
    line separators, lone surrogates, control characters, over 4096 characters) is written as one
    line whose value reads back as given (cut at 4096 characters, the last one then the cut mark), the first time and from memory,
    and never as another record's value."""
    path = tmp_path / "audit.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        for _ in range(2):
            for value in HOSTILE:
                log.record("accept", user="alice", requested_path=value, grant=None)
                log.finish(log.prepare("accept", user="alice", requested_path=value), bytes=1)
    lines = path.read_text(encoding="ascii").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == 4 * len(HOSTILE)
    got = [json.loads(line)["requested_path"] for line in lines[:-1]]
    cut = [v if len(v) <= 4096 else v[:4095] + "\u2026" for v in HOSTILE]
    assert got == [v for _ in range(2) for v in cut for _ in range(2)]


def test_a_refused_field_is_refused_every_time_not_only_the_first(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(str(path), syslog=False) as log:
        for _ in range(3):
            with pytest.raises(AuditError):
                log.record("accept", user="alice", api_token="t")
            with pytest.raises(AuditError):
                log.record("accept", user="alice", Bad="t")
        log.record("accept", user="alice")
    assert [r["user"] for r in records(path)] == ["alice"]


def test_the_record_time_always_has_microseconds_and_a_four_digit_year() -> None:
    import datetime

    from mcpd.common.audit.records import format_record

    utc = datetime.UTC
    for when, text in ((datetime.datetime(2026, 1, 2, 3, 4, 5, 0, utc), "2026-01-02T03:04:05.000000Z"),
                       (datetime.datetime(2026, 1, 2, 3, 4, 5, 7, utc), "2026-01-02T03:04:05.000007Z"),
                       (datetime.datetime(999, 12, 31, 23, 59, 59, 999999, utc), "0999-12-31T23:59:59.999999Z")):
        assert json.loads(format_record("accept", {}, now=when))["time"] == text


@hypothesis.given(st.lists(st.integers(min_value=0, max_value=2 ** 63 - 1), min_size=1, max_size=5))
def test_the_clock_time_of_a_record_is_its_instant_to_the_microsecond_in_utc(clocks: list[int]) -> None:
    """Records written one after another, whatever whole seconds they fall in (the date and time
    of day are formatted once a second and remembered), each carry their own instant, truncated
    to the microsecond: the same text as ``datetime`` gives for it."""
    import datetime
    from unittest import mock

    from mcpd.common.audit import records as audit

    epoch = datetime.datetime(1970, 1, 1)
    for nanos in clocks:
        if nanos // 1000 > (datetime.datetime.max - epoch) // datetime.timedelta(microseconds=1):
            continue  # past the year 9999
        with mock.patch.object(audit.time, "time_ns", return_value=nanos):
            text = json.loads(audit.format_record("accept", {}))["time"]
        expected = epoch + datetime.timedelta(microseconds=nanos // 1000)
        if expected.year >= 1000:  # (the clock is never before that; strftime writes no leading zeros)
            assert text == expected.isoformat(timespec="microseconds") + "Z"


def test_a_record_written_in_the_next_second_has_that_second() -> None:
    from unittest import mock

    from mcpd.common.audit import records as audit

    second = 1_767_323_045  # 2026-01-02T03:04:05Z
    for nanos, text in ((second * 10 ** 9 + 999_999_999, "2026-01-02T03:04:05.999999Z"),
                        ((second + 1) * 10 ** 9, "2026-01-02T03:04:06.000000Z"),
                        ((second + 86400) * 10 ** 9 + 7000, "2026-01-03T03:04:05.000007Z"),
                        (second * 10 ** 9 + 1000, "2026-01-02T03:04:05.000001Z")):
        with mock.patch.object(audit.time, "time_ns", return_value=nanos):
            assert json.loads(audit.format_record("accept", {"user": "u"}))["time"] == text


def test_a_record_time_in_another_time_zone_is_written_as_the_same_instant_in_utc() -> None:
    import datetime

    from mcpd.common.audit.records import format_record

    paris = datetime.timezone(datetime.timedelta(hours=1))
    when = datetime.datetime(2026, 1, 1, 0, 30, 0, 0, paris)  # 23:30 UTC the day before
    assert json.loads(format_record("accept", {}, now=when))["time"] == "2025-12-31T23:30:00.000000Z"
    naive = datetime.datetime(2026, 1, 2, 3, 4, 5)  # no zone: taken as UTC
    assert json.loads(format_record("accept", {}, now=naive))["time"] == "2026-01-02T03:04:05.000000Z"


def test_mixed_records_keep_their_field_order_and_values_whatever_was_remembered(tmp_path: Path) -> None:
    """Text fields in front are remembered, the rest encoded each time: the line is still every
    field in the order given, with its own values, and a bad field is refused wherever it sits."""
    path = tmp_path / "a.jsonl"
    text = {"user": "alice", "peer": "127.0.0.1:1", "outcome": None}
    with AuditLog(str(path), syslog=False) as log:
        for n in (1, 2):
            log.record("access", **text, bytes=n, duration_ms=n / 10, reason="after numbers", ok=True)
        log.record("access", bytes=3, **text)
        log.record("access", **text)
        with pytest.raises(AuditError):
            log.record("access", **text, bytes=1, nested=[1])
        with pytest.raises(AuditError):
            log.record("access", **text, **{"bad key": 1})
    lines = path.read_text().splitlines()
    got = [json.loads(line) for line in lines]
    order = [list(r)[3:] for r in got]  # after seq, prev and time... and event
    assert order[0] == order[1] == ["event", "user", "peer", "outcome", "bytes", "duration_ms", "reason", "ok"]
    assert order[2] == ["event", "bytes", "user", "peer", "outcome"] and order[3] == ["event", "user", "peer", "outcome"]
    assert [(r["bytes"], r["duration_ms"], r["ok"]) for r in got[:2]] == [(1, 0.1, True), (2, 0.2, True)]
    assert len(got) == 4


_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40), st.sampled_from(["\u2028", "\ud800", "\x00\x1f\"\\", "é\u20ac\U0001f600"]),
)


@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(st.dictionaries(st.from_regex(r"[a-z][a-z_]{0,31}", fullmatch=True).filter(
    lambda k: k not in ("seq", "prev", "time", "event") and not audit_format._forbidden(k)), _SCALARS, max_size=8),
    st.integers(min_value=0, max_value=2**63), st.sampled_from([GENESIS, "a3" * 32]))
def test_members_and_chain_are_written_exactly_as_the_json_encoder_writes_them(
        fields: dict[str, Any], seq: int, prev: str) -> None:
    """The members of a record are written without the generic encoder; they must be its very
    characters (the chain hashes them, and readers parse them), whatever the values."""
    encoder = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))
    expected = encoder.encode({k: audit_format._clean(v, k) for k, v in fields.items()})[1:-1]
    assert audit_format._encode_members(tuple(fields.items())) == expected
    assert audit_format.record_line("BODY", seq, prev) == "{" + encoder.encode({"seq": seq, "prev": prev})[1:-1] + ",BODY}"
    assert audit_format.record_line("BODY", None, None) == "{BODY}"
