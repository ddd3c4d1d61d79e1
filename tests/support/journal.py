"""A systemd-journald of the test's own, in a journal namespace, and reading it back.

``systemd-journald NS`` listens on ``/run/systemd/journal.NS/socket`` (native protocol) and
``/run/systemd/journal.NS/dev-log`` (syslog), read back with ``journalctl --namespace=NS``; so a
test needs no journald of the machine's and disturbs none. Not root, the fixture skips; as root,
a machine without a systemd-journald binary fails it (``scripts/bootstrap.sh`` installs systemd).
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

from tests.support.rootonly import needs_root, root_prerequisite

JOURNALD = next((p for p in ("/lib/systemd/systemd-journald", "/usr/lib/systemd/systemd-journald") if os.path.exists(p)),
                None)


@pytest.fixture()
def journal() -> Iterator[tuple[str, str]]:
    """(namespace, socket path) of a private journald, stopped and removed afterwards; its syslog
    socket is ``dev-log`` beside that socket."""
    needs_root("runs a journald of its own")
    root_prerequisite(JOURNALD is not None and shutil.which("journalctl") is not None,
                      "no systemd-journald on this machine: nothing to send records to")
    ns = f"mcpdt{secrets.token_hex(4)}"
    sock = f"/run/systemd/journal.{ns}/socket"
    assert JOURNALD is not None
    proc = subprocess.Popen([JOURNALD, ns], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while not (os.path.exists(sock) and os.path.exists(os.path.join(os.path.dirname(sock), "dev-log"))):
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


def journal_json(ns: str, ident: str) -> list[str]:
    """The lines ``journalctl --namespace=NS -o json SYSLOG_IDENTIFIER=ident`` prints now."""
    out = subprocess.run(["journalctl", f"--namespace={ns}", "-o", "json", "--no-pager", f"SYSLOG_IDENTIFIER={ident}"],
                         capture_output=True, text=True, timeout=30)
    return [line for line in out.stdout.splitlines() if line.startswith("{")]


def entries(ns: str, ident: str, count: int) -> list[dict[str, Any]]:
    """The journal's entries of ``ident``, once there are ``count`` of them (or 15 s passed)."""
    deadline = time.monotonic() + 15
    while True:
        found = [json.loads(line) for line in journal_json(ns, ident)]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)
