"""Audit records reach the journal with structured fields (docs/REFERENCE.md §7; native journal protocol).

The journal tests run a real systemd-journald of their own, in a journal namespace
(``systemd-journald NS``: its socket is ``/run/systemd/journal.NS/socket``, read back with
``journalctl --namespace=NS``), so they need no journald of the machine's and disturb none. Not
root, they skip; as root, a machine without a systemd-journald binary fails them
(``scripts/bootstrap.sh`` installs systemd).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.common.audit.journal import journal_entry
from mcpd.common.audit.writer import AuditLog
from tests.support.rootonly import needs_root, root_prerequisite

JOURNALD = next((p for p in ("/lib/systemd/systemd-journald", "/usr/lib/systemd/systemd-journald") if os.path.exists(p)),
                None)


@pytest.fixture()
def journal() -> Iterator[tuple[str, str]]:
    """(namespace, socket path) of a private journald, stopped and removed afterwards."""
    needs_root("runs a journald of its own")
    root_prerequisite(JOURNALD is not None and shutil.which("journalctl") is not None,
                      "no systemd-journald on this machine: nothing to send records to")
    ns = f"mcpdt{secrets.token_hex(4)}"
    sock = f"/run/systemd/journal.{ns}/socket"
    proc = subprocess.Popen([JOURNALD, ns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while not os.path.exists(sock):
            assert proc.poll() is None and time.monotonic() < deadline, "journald did not start"
            time.sleep(0.05)
        yield ns, sock
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        machine = Path("/etc/machine-id").read_text().strip()
        for leftover in (f"/run/systemd/journal.{ns}", f"/run/log/journal/{machine}.{ns}",
                         f"/var/log/journal/{machine}.{ns}"):
            shutil.rmtree(leftover, ignore_errors=True)


def entries(ns: str, ident: str, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 15
    while True:
        out = subprocess.run(["journalctl", f"--namespace={ns}", "-o", "json", "--no-pager",
                              f"SYSLOG_IDENTIFIER={ident}"], capture_output=True, text=True, timeout=30)
        found = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


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
