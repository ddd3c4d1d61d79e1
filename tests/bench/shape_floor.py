"""The least a server of mcpd's shape pays, on the user's stack: a yardstick for the front.

It serves the HTTP+SSE transport the way mcpd does, and nothing else: uvicorn (uvloop, httptools)
with TLS, starlette, ``GET /sse`` answering an ``endpoint`` event and then every JSON-RPC answer as
an event, ``POST /message?session_id=`` answering ``202``, and each ``tools/call`` run by a worker
process over a Unix socket (4-byte length, JSON), which opens, reads and closes the file. One
constant-time bearer check; no sessions table beyond a dict, no limits, no records, no argument
checks, no privilege separation. It is not a server to run for anyone: it binds to 127.0.0.1 only.

The gap between it and mcpd on the same load is what mcpd's own work per call costs (the checks,
the records, the protocol's rules); the gap between it and a bare starlette server answering in
process is what the transport's shape costs (a second connection for the answer, a worker hop).

Run (as any user) with a certificate and key (``mcpd certs`` makes a pair), then drive it with
an HTTP+SSE load generator that opens ``/sse`` with ``Authorization: Bearer t`` and posts
``tools/call`` requests for ``files/read`` (the comparison harness's; none in this repository)::

    BENCH_TOKEN=t .venv/bin/python tests/bench/shape_floor.py --port 8610 \\
        --cert server.crt --key server.key

Prints nothing but uvicorn's warnings; the load generator prints the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import os
import secrets
import socket
import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

HEADER = struct.Struct("!I")


def serve_worker(fd: int) -> None:
    """The worker: one request at a time, ``{"id", "args": {"path"}}`` → ``{"id", "text"}`` or
    ``{"id", "error"}``; ends when the socket closes."""
    sock = socket.socket(fileno=fd)
    buf = bytearray()
    while True:
        while len(buf) < HEADER.size or len(buf) < HEADER.size + HEADER.unpack_from(buf)[0]:
            chunk = sock.recv(65536)
            if not chunk:
                return
            buf += chunk
        (n,) = HEADER.unpack_from(buf)
        req = orjson.loads(bytes(buf[HEADER.size:HEADER.size + n]))
        del buf[:HEADER.size + n]
        try:
            fd_ = os.open(req["args"]["path"], os.O_RDONLY | os.O_CLOEXEC)
            try:
                reply = {"id": req["id"], "text": os.read(fd_, 1 << 20).decode("utf-8", "replace")}
            finally:
                os.close(fd_)
        except OSError as exc:
            reply = {"id": req["id"], "error": exc.strerror or "error"}
        out = orjson.dumps(reply)
        sock.sendall(HEADER.pack(len(out)) + out)


class Worker:
    """One worker process and the front's end of its socket."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker-fd", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()])
        theirs.close()
        self.sock, self.next_id = ours, 0
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def call(self, args: dict[str, Any]) -> dict[str, Any]:
        if self.streams is None:
            self.streams = await asyncio.open_unix_connection(sock=self.sock)
        reader, writer = self.streams
        self.next_id += 1
        body = orjson.dumps({"id": self.next_id, "args": args})
        writer.write(HEADER.pack(len(body)) + body)
        (n,) = HEADER.unpack(await reader.readexactly(HEADER.size))
        reply: dict[str, Any] = orjson.loads(await reader.readexactly(n))
        return reply


class Shape:
    """The app's state: the token, the sessions' queues and the idle workers."""

    def __init__(self, token: str, workers: int) -> None:
        self.token = f"Bearer {token}".encode()
        self.sessions: dict[str, asyncio.Queue[bytes]] = {}
        self.idle = [Worker() for _ in range(workers)]
        self.free = asyncio.Semaphore(workers)
        self.tasks: set[asyncio.Task[None]] = set()

    def authorized(self, request: Request) -> bool:
        return hmac.compare_digest(request.headers.get("authorization", "").encode(), self.token)

    async def sse(self, request: Request) -> Response:
        if not self.authorized(request):
            return PlainTextResponse("unauthorized", 401)
        sid = secrets.token_hex(16)
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.sessions[sid] = queue

        async def events() -> AsyncIterator[bytes]:
            try:
                yield f"event: endpoint\r\ndata: /message?session_id={sid}\r\n\r\n".encode()
                while True:
                    yield b"event: message\r\ndata: " + await queue.get() + b"\r\n\r\n"
            finally:
                self.sessions.pop(sid, None)

        return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-store"})

    async def answer(self, queue: asyncio.Queue[bytes], msg: dict[str, Any]) -> None:
        result: dict[str, Any] = {}
        if msg.get("method") == "initialize":
            result = {"protocolVersion": msg.get("params", {}).get("protocolVersion", "2025-06-18"),
                      "capabilities": {"tools": {}}, "serverInfo": {"name": "shape-floor", "version": "0"}}
        elif msg.get("method") == "tools/call":
            async with self.free:
                worker = self.idle.pop()
                try:
                    reply = await worker.call(msg["params"]["arguments"])
                finally:
                    self.idle.append(worker)
            text = reply.get("text", reply.get("error", ""))
            result = {"content": [{"type": "text", "text": text}], "isError": "error" in reply}
        queue.put_nowait(orjson.dumps({"jsonrpc": "2.0", "id": msg.get("id"), "result": result}))

    async def message(self, request: Request) -> Response:
        if not self.authorized(request):
            return PlainTextResponse("unauthorized", 401)
        queue = self.sessions.get(request.query_params.get("session_id", ""))
        if queue is None:
            return PlainTextResponse("no such session", 404)
        msg = orjson.loads(await request.body())
        if isinstance(msg, dict) and "id" in msg and "method" in msg:
            task = asyncio.ensure_future(self.answer(queue, msg))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            await asyncio.sleep(0)  # as mcpd: the call starts before the 202 is written
        return Response(status_code=202)

    def close(self) -> None:
        for worker in self.idle:
            worker.sock.close()
            worker.proc.wait(5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8610)
    parser.add_argument("--cert", help="TLS certificate (PEM)")
    parser.add_argument("--key", help="TLS private key (PEM)")
    parser.add_argument("--token", default=os.environ.get("BENCH_TOKEN"))
    parser.add_argument("--workers", type=int, default=4, help="worker processes (mcpd's per-account default: 4)")
    parser.add_argument("--worker-fd", type=int, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker_fd is not None:
        serve_worker(opts.worker_fd)
        return 0
    if not (opts.token and opts.cert and opts.key):
        parser.error("--cert, --key and --token (or BENCH_TOKEN) are required")
    shape = Shape(opts.token, opts.workers)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        shape.close()

    app = Starlette(routes=[Route("/sse", shape.sse), Route("/message", shape.message, methods=["POST"])],
                    lifespan=lifespan)
    uvicorn.run(app, host="127.0.0.1", port=opts.port, ssl_certfile=opts.cert, ssl_keyfile=opts.key,
                log_level="warning", access_log=False, loop="uvloop", http="httptools")
    return 0


if __name__ == "__main__":
    sys.exit(main())
