"""A small HTTPS server on loopback for tests of mcpd's outgoing fetches (the JWK Set download,
an identity provider's documents): it serves a mutable ``{path: (status, body)}`` table to GETs,
and to POSTs the next of ``posts[path]`` (a list of ``(status, body)``, the last one repeated),
with a certificate from a private CA made by :func:`mcpd.admin.certs.make_pki`; it records the
paths asked for and the times of the POSTs."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from mcpd.admin import certs


@dataclass
class Served:
    """The running server: ``url`` (``https://127.0.0.1:PORT``), the CA file that trusts it, the
    table to change, and the paths requested so far."""

    url: str
    cafile: str
    routes: dict[str, tuple[int, bytes]]
    requests: list[str] = field(default_factory=list)
    posts: dict[str, list[tuple[int, bytes]]] = field(default_factory=dict)
    posted_at: list[float] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)


@contextmanager
def https_server(folder: Path, routes: dict[str, tuple[int, bytes]] | None = None) -> Iterator[Served]:
    """Serve ``routes`` over TLS on 127.0.0.1 until the block ends (the thread is joined)."""
    pki = certs.make_pki(folder, ["127.0.0.1", "localhost"])
    table: dict[str, tuple[int, bytes]] = dict(routes or {})
    served: Served

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            served.requests.append(self.path)
            status, body = table.get(self.path, (404, b"not found"))
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", body.decode())
                body = b""
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            served.bodies.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            served.requests.append(self.path)
            served.posted_at.append(time.monotonic())
            queue = served.posts.get(self.path) or [(404, b"{}")]
            status, body = queue.pop(0) if len(queue) > 1 else queue[0]
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(pki.server_cert), str(pki.server_key))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    served = Served(f"https://127.0.0.1:{server.server_address[1]}", str(pki.ca_cert), table)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
