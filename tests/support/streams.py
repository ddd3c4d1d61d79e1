"""Raw streams, SSE readers and bounded waits for tests that hold a daemon's connections and streams."""

from __future__ import annotations

import socket
import ssl
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import EVENT_TIMEOUT, Daemon

INIT = {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


DEADLINE = 15.0  # seconds any one wait here may take (well under the TLS goodbye's 30 s timeout)


def server_connections(d: Daemon, client_port: int | None = None) -> int:
    """TCP connections the daemon holds open (ESTABLISHED on its side), to ``client_port`` or to any."""
    port = d.host_port[1]
    held = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state = int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16), fields[3]
            if local == port and state == "01" and (client_port is None or remote == client_port):
                held += 1
    return held


def until(predicate: Callable[[], Any], seconds: float = DEADLINE) -> bool:
    """Wait (bounded) until ``predicate()`` holds."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def assert_no_crash_in_log(d: Daemon) -> None:
    log = d.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log and " ERROR " not in log, log[-4000:]


class Raw:
    """One raw TLS connection to the daemon, read only when asked. ``rcvbuf``: a small receive
    buffer, set before connecting (a client that stops reading then stalls the server soon)."""

    def __init__(self, d: Daemon, rcvbuf: int | None = None) -> None:
        host, port = d.host_port
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        tcp.settimeout(EVENT_TIMEOUT)
        tcp.connect((host, port))
        self.port = tcp.getsockname()[1]
        self.sock: ssl.SSLSocket = d.ssl_context().wrap_socket(tcp, server_hostname=host)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _more(self) -> bool:
        try:
            chunk = self.sock.recv(65536)
        except (ConnectionError, ssl.SSLError, OSError):
            return False
        self.buf += chunk
        return bool(chunk)

    def until(self, marker: bytes) -> bytes:
        """Everything up to and with ``marker`` (consumed); raises EOFError if the connection ends first."""
        while marker not in self.buf:
            if not self._more():
                raise EOFError(self.buf[-300:])
        head, self.buf = self.buf.split(marker, 1)
        return head + marker

    def rest(self) -> bytes:
        """Everything until the server ends the connection (bounded by the socket's timeout)."""
        while self._more():
            pass
        data, self.buf = self.buf, b""
        return data

    def head(self) -> tuple[int, bytes]:
        head = self.until(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), head.lower()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def reset(self) -> None:
        """Drop the connection with a TCP reset (no TLS goodbye)."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def get(d: Daemon, target: str = "/sse", extra: str = "", version: str = "1.1", method: str = "GET",
        token: str | None = None) -> bytes:
    return (f"{method} {target} HTTP/{version}\r\nHost: x\r\nAuthorization: Bearer {token or d.token}\r\n"
            f"{extra}\r\n").encode()


def open_sse(d: Daemon, rcvbuf: int | None = None, extra: str = "", version: str = "1.1",
             body: bytes = b"", token: str | None = None) -> tuple[Raw, str]:
    """A ``GET /sse`` read to its endpoint event; the stream and the endpoint (``/message?...``)."""
    r = Raw(d, rcvbuf)
    r.send(get(d, extra=extra, version=version, token=token) + body)
    status, _ = r.head()
    assert status == 200
    event = r.until(b"\n\n\r\n")  # (the endpoint event's chunk, whole)
    return r, event.split(b"data: ", 1)[1].split(b"\n", 1)[0].decode().strip()


def reads_done(d: Daemon) -> int:
    """``files/read`` calls answered so far (the access log's records)."""
    try:
        return sum(1 for line in (d.state_dir / "access.jsonl").read_text().splitlines() if '"files/read"' in line)
    except OSError:
        return 0
