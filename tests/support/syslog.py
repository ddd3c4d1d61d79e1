"""A syslog socket of the test's own: a bound datagram socket that keeps what is sent to it."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path


class SyslogSink:
    """A datagram socket bound at ``path`` (in a new folder under ``/tmp``: socket paths are short)
    that anyone may send to, as ``/dev/log``; :meth:`lines` is what arrived, in order."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="mcpd-log-", dir="/tmp"))
        os.chmod(self.folder, 0o755)  # the daemon's accounts send here too
        self.path = str(self.folder / "log")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind(self.path)
        os.chmod(self.path, 0o666)
        self.got: list[bytes] = []

    def lines(self, wait: float = 0.0) -> list[bytes]:
        """Every datagram received so far; with ``wait``, after waiting up to that long for one more."""
        self.sock.settimeout(wait or None)
        if wait:
            try:
                self.got.append(self.sock.recv(65536))
            except TimeoutError:
                pass
        self.sock.setblocking(False)
        while True:
            try:
                self.got.append(self.sock.recv(65536))
            except BlockingIOError:
                return list(self.got)

    def write(self, path: Path) -> Path:
        """Write what arrived to ``path``, one line each (as a collector stores them); returns it."""
        path.write_bytes(b"".join(line + b"\n" for line in self.lines()))
        return path

    def close(self) -> None:
        self.sock.close()
        os.unlink(self.path)
        os.rmdir(self.folder)
