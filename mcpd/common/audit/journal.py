"""The journal copy of each audit record: systemd's native protocol, best effort.

Where journald runs, each record also goes to the journal (the line as ``MESSAGE`` and every
field as ``MCPD_<FIELD>``, plus ``MCPD_PATH``), so journal-remote, rsyslog or Vector carry it off
the host: the copy a consistent rewrite of the file cannot reach. That copy never blocks and never
fails a record; the file is the record.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from typing import Any

JOURNAL_SOCKET = "/run/systemd/journal/socket"


def journal_entry(line: str, ident: str) -> bytes:
    """One record (``line``, as :func:`mcpd.common.audit.records.format_record` made it) in the
    journal's native protocol (systemd.io/JOURNAL_NATIVE_PROTOCOL): ``MESSAGE``,
    ``SYSLOG_IDENTIFIER`` = ``ident``, ``PRIORITY`` (4 alert, 5 reject, else 6), ``MCPD_PATH``
    (resolved, else requested path) and ``MCPD_<KEY>`` for every field but null ones (``MCPD_USER``,
    ``MCPD_DECISION`` ...). Values go in the protocol's length-prefixed form, so no newline in a
    path can forge a field."""
    record = json.loads(line)
    event = record.get("event")
    fields = {"MESSAGE": line, "SYSLOG_IDENTIFIER": ident, "PRIORITY": {"alert": 4, "reject": 5}.get(event, 6)}
    path = record.get("resolved_path") or record.get("requested_path")
    fields.update({"MCPD_PATH": path} if path else {})
    fields.update({f"MCPD_{k.upper()}": v for k, v in record.items() if v is not None})
    return native_entry(fields)


def native_entry(fields: dict[str, Any]) -> bytes:
    """``fields`` (journal field name -> value; booleans as ``true``/``false``, others by ``str``)
    in the native protocol's length-prefixed form: no newline in a value can forge a field."""
    out = bytearray()
    for key, value in fields.items():
        data = (str(value).lower() if isinstance(value, bool) else str(value)).encode()
        out += key.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
    return bytes(out)


class Journal:
    """A datagram socket to the journal at ``path``, sending each record without waiting."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @classmethod
    def at(cls, path: str) -> Journal | None:
        """A journal at ``path`` when that is a socket now, else None (no journald here)."""
        return cls(path) if stat.S_ISSOCK(os.stat(path).st_mode if os.path.exists(path) else 0) else None

    def send(self, line: str, ident: str) -> None:
        """Send the record ``line`` (:func:`journal_entry`); a journal busy or gone drops it."""
        self.send_entry(journal_entry(line, ident))

    def send_entry(self, entry: bytes) -> None:
        """Send one entry already encoded (:func:`native_entry`), without waiting; a journal busy
        or gone drops it."""
        try:
            self.sock.sendto(entry, socket.MSG_DONTWAIT, self.path)
        except OSError:
            pass  # journald busy or gone: the file has the record

    def close(self) -> None:
        self.sock.close()
