"""A syslog socket of the test's own: a bound datagram socket that keeps what is sent to it."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from pathlib import Path


class SyslogSink:
    """A datagram socket bound at ``path`` (in a new folder under ``/tmp``: socket paths are short)
    that anyone may send to, as ``/dev/log``. ``reading``: a thread takes each datagram as it
    comes, as a syslog daemon does (the kernel queues only ``net.unix.max_dgram_qlen``, 10 by
    default); without it, nothing is read until :meth:`lines`."""

    def __init__(self, reading: bool = True) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="mcpd-log-", dir="/tmp"))
        os.chmod(self.folder, 0o755)  # the daemon's accounts send here too
        self.path = str(self.folder / "log")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind(self.path)
        os.chmod(self.path, 0o666)
        self.sock.settimeout(0.05)
        self._got: list[bytes] = []
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._read, daemon=True) if reading else None
        if self._thread is not None:
            self._thread.start()

    def _take(self) -> bool:
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        with self._lock:
            self._got.append(data)
        return True

    def _read(self) -> None:
        while not self._stop:
            self._take()

    def lines(self, wait_for: int = 0) -> list[bytes]:
        """Every datagram received so far, once there are ``wait_for`` (or 30 s passed)."""
        deadline = time.monotonic() + 30
        while True:
            if self._thread is None:
                while self._take():
                    pass
            with self._lock:
                if len(self._got) >= wait_for or time.monotonic() > deadline:
                    return list(self._got)
            time.sleep(0.02)

    def write(self, path: Path) -> Path:
        """Write what arrived to ``path``, one line each (as a collector stores them); returns it."""
        path.write_bytes(b"".join(line + b"\n" for line in self.lines()))
        return path

    def close(self) -> None:
        self._stop = True
        if self._thread is not None:
            self._thread.join(5)
        self.sock.close()
        os.unlink(self.path)
        os.rmdir(self.folder)
