"""Audit records reach the journal with structured fields (docs/REFERENCE.md §7; native journal protocol).

The journal tests run a real systemd-journald of their own, in a journal namespace
(:mod:`tests.support.journal`), so they need no journald of the machine's and disturb none.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mcpd.common.audit.journal import journal_entry
from mcpd.common.audit.writer import AuditLog
from tests.support.journal import entries, journal  # noqa: F401 - journal: a fixture


@pytest.mark.root
def test_records_appear_in_the_journal_with_their_fields(journal: tuple[str, str], tmp_path: Path) -> None:
    ns, sock = journal
    path = tmp_path / "audit.jsonl"
    forged = "/srv/a\nMCPD_DECISION=accept\nMCPD_USER=root"
    with AuditLog(str(path), journal=sock) as log:
        log.record("accept", user="alice", os_user="alice-acct", token_id="0123456789ab", route="privileged",
                   tool="files/read", requested_path="/srv/../srv/x", resolved_path="/srv/x", decision="accept",
                   reason="granted", bytes=12, outcome=None)
        log.record("reject", user="bob", tool="files/read", requested_path=forged, resolved_path=forged,
                   decision="reject", reason="no grant covers this path")
        log.record("alert", peer="pid=1 uid=2", reason="malformed frame")
    lines = path.read_text().splitlines()
    got = entries(ns, "mcpd-audit", 3)
    assert [e["MESSAGE"] for e in got] == lines  # the very lines of the file
    accept, reject, alert = got
    assert accept["MCPD_USER"] == "alice" and accept["MCPD_DECISION"] == "accept"
    assert accept["MCPD_PATH"] == "/srv/x" and accept["MCPD_REQUESTED_PATH"] == "/srv/../srv/x"
    assert accept["MCPD_TOKEN_ID"] == "0123456789ab" and accept["MCPD_BYTES"] == "12"
    assert accept["MCPD_SEQ"] == "1" and accept["MCPD_EVENT"] == "accept" and "MCPD_OUTCOME" not in accept
    assert accept["PRIORITY"] == "6" and reject["PRIORITY"] == "5" and alert["PRIORITY"] == "4"
    # a newline in a path is data, not a new field
    assert reject["MCPD_USER"] == "bob" and reject["MCPD_DECISION"] == "reject" and reject["MCPD_PATH"] == forged
    assert alert["MCPD_REASON"] == "malformed frame"


@pytest.mark.root
def test_front_access_records_go_to_the_journal_as_mcpd_access(journal: tuple[str, str], tmp_path: Path) -> None:
    ns, sock = journal
    with AuditLog(str(tmp_path / "access.jsonl"), ident="mcpd-access", journal=sock) as log:
        log.record("access", user="alice", route="unprivileged", tool="files/read", requested_path="/home/a/n.txt",
                   decision="accept")
    (entry,) = entries(ns, "mcpd-access", 1)
    assert entry["MCPD_ROUTE"] == "unprivileged" and entry["MCPD_PATH"] == "/home/a/n.txt"


def test_journal_entry_is_the_native_length_prefixed_form() -> None:
    data = journal_entry('{"seq":1,"event":"accept","user":"a\\nb","ok":true,"x":null}', "mcpd-audit")
    assert b"MCPD_USER\n" + (3).to_bytes(8, "little") + b"a\nb\n" in data
    assert b"MCPD_OK\n" + (4).to_bytes(8, "little") + b"true\n" in data and b"MCPD_X" not in data


def test_no_journal_socket_means_no_journal_and_no_error(tmp_path: Path) -> None:
    with AuditLog(str(tmp_path / "a.jsonl"), journal=str(tmp_path / "none")) as log:
        log.record("accept", user="a")
        assert log._journal is None
