"""Idle sessions hold little, and closed ones leave nothing behind (issue "hostile load").

The front runs in this process (the real app, over real TLS, with uvicorn and the front's own
connection guard; no worker pool: ``initialize`` and ``ping`` need none), so the test can look at
what the process holds: while streams are idle, the server's one request task per stream and no
task of the session's own (no writer, watcher or timer); once the streams ended, whether the client
left or the server closed the session, not one session object is left. How much memory a session
costs is measured by ``tests/bench/bench_idle_sessions.py``, not here.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import os
import pwd
import re
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml

from mcpd.admin import certs
from mcpd.common import identity
from mcpd.common.config import load
from mcpd.front.app import build_app
from mcpd.front.auth import FileAuthenticator
from mcpd.front.connguard import ConnectionCount, LeanFlowControl, Pipeline, Waiters, guarded_protocol
from mcpd.front.protocol import Dispatcher, McpSession
from mcpd.front.transport.sse import SessionManager, SessionStream, SseSession

pytestmark = pytest.mark.anyio

STREAMS = 12
DEADLINE = 20.0


@dataclass
class Front:
    url: str
    host: str
    port: int
    token: str
    ca: str
    sessions: SessionManager

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca)


@pytest.fixture
async def front(tmp_path: Path) -> AsyncIterator[Front]:
    pki = certs.make_pki(tmp_path, ["127.0.0.1"])
    plain, rec = identity.new_token()
    me = pwd.getpwuid(os.geteuid()).pw_name
    identity.save_users(tmp_path / "users.yaml", {"alice": identity.UserRecord(name="alice", os_user=me, tokens=[rec])})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "mcpd.yaml").write_text(yaml.safe_dump({
        "listen": {"host": "127.0.0.1", "port": port}, "tls": {"cert": str(pki.server_cert), "key": str(pki.server_key)},
        "users_file": "users.yaml", "helper_socket": "", "state_dir": ".", "keepalive_seconds": 60}))
    cfg = load(tmp_path / "mcpd.yaml")
    app = build_app(cfg, FileAuthenticator(cfg.users_file), Dispatcher(pool=None, privileged=None))  # type: ignore[arg-type]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, ssl_certfile=cfg.tls.cert, ssl_keyfile=cfg.tls.key,
                            lifespan="off", http=guarded_protocol(ConnectionCount(cfg.connections)),
                            access_log=False, log_config=None)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.05)
    assert server.started
    try:
        yield Front(f"https://127.0.0.1:{port}", "127.0.0.1", port, plain, str(pki.ca_cert), app.state.sessions)
    finally:
        app.state.sessions.close_all()
        server.should_exit = True
        await asyncio.wait_for(serving, DEADLINE)


class Stream:
    """One raw ``GET /sse`` over TLS, read only when asked (no reader task of the client's own)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, endpoint: str) -> None:
        self.reader, self.writer, self.endpoint = reader, writer, endpoint

    @classmethod
    async def open(cls, f: Front) -> Stream:
        reader, writer = await asyncio.open_connection(f.host, f.port, ssl=f.ssl_context(), server_hostname=f.host)
        writer.write(f"GET /sse HTTP/1.1\r\nHost: {f.host}\r\nAuthorization: Bearer {f.token}\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"/message?session_id="), DEADLINE)
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
        sid = await asyncio.wait_for(reader.readexactly(32), DEADLINE)
        await asyncio.wait_for(reader.readuntil(b"\n\n"), DEADLINE)  # the endpoint event's end
        return cls(reader, writer, "/message?session_id=" + sid.decode())

    async def until(self, marker: bytes) -> bytes:
        return await asyncio.wait_for(self.reader.readuntil(marker), DEADLINE)

    def close(self) -> None:
        self.writer.close()


def close_by_server(sessions: SessionManager, ids: set[str]) -> None:
    for session in sessions.sessions():
        if session.id in ids:
            sessions.close(session)


def live(*types: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, types))


async def settle(predicate: Any) -> bool:
    """Wait (bounded) until ``predicate()`` holds."""
    for _ in range(int(DEADLINE / 0.05)):
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return bool(predicate())


async def test_idle_streams_hold_no_task_of_their_own_and_closed_ones_leave_no_session_objects(
        front: Front) -> None:
    kinds = (SseSession, McpSession, SessionStream)
    assert live(*kinds) == 0
    tasks_before = len(asyncio.all_tasks())
    streams = [await Stream.open(front) for _ in range(STREAMS)]
    async with httpx.AsyncClient(verify=front.ssl_context(), timeout=DEADLINE) as client:
        for i, s in enumerate(streams):
            r = await client.post(front.url + s.endpoint, headers={"Authorization": f"Bearer {front.token}"},
                                  json={"jsonrpc": "2.0", "id": i, "method": "ping"})
            assert r.status_code == 202
            reply = await s.until(b"\n\n")
            assert json.loads(re.search(rb"data: (.*)\n", reply).group(1)) == {"jsonrpc": "2.0", "id": i, "result": {}}
    assert len(front.sessions) == STREAMS
    # idle: the server's request task of each stream, and nothing else of the session's own
    assert await settle(lambda: len(asyncio.all_tasks()) == tasks_before + STREAMS), \
        [t.get_coro() for t in asyncio.all_tasks()]

    # half leave (the client goes away), half are closed by the server (as a revoked token is):
    # the server's end completes each response, so its client reads the last chunk
    leaving, closed = streams[:STREAMS // 2], streams[STREAMS // 2:]
    for s in leaving:
        s.close()
    close_by_server(front.sessions, {s.endpoint.rsplit("=", 1)[1] for s in closed})
    for s in closed:
        assert (await s.until(b"0\r\n\r\n")).endswith(b"0\r\n\r\n")
        s.close()
    assert await settle(lambda: len(front.sessions) == 0)
    assert await settle(lambda: len(asyncio.all_tasks()) == tasks_before)
    assert live(*kinds) == 0


async def test_the_servers_scope_is_left_as_the_server_made_it(front: Front) -> None:
    """The stack adds its keys (route, user, ...) to a copy: the scope the server keeps for an open
    stream's request does not grow with them."""
    scopes: list[dict[str, Any]] = []
    s = await Stream.open(front)
    try:
        for o in gc.get_objects():
            if isinstance(o, dict) and o.get("type") == "http" and o.get("path") == "/sse" and "headers" in o:
                scopes.append(o)
        assert scopes
        assert all("route" not in sc and "user" not in sc and "endpoint" not in sc for sc in scopes)
    finally:
        s.close()
    assert await settle(lambda: len(front.sessions) == 0)


async def test_an_idle_streams_connection_holds_no_deque_or_asyncio_event_of_its_own(front: Front) -> None:
    """uvicorn's connection keeps three empty deques (760 bytes each) for the life of a stream: the
    pipelined requests, the request's message event and the write flow control's event. The front's
    connection keeps a list, and lean events made on first use."""
    streams = [await Stream.open(front) for _ in range(3)]
    try:
        gc.collect()
        protocols = [o for o in gc.get_objects() if type(o).__name__ == "GuardedHttpToolsProtocol" and o.cycle]
        assert len(protocols) >= 3
        for p in protocols:
            assert type(p.pipeline) is Pipeline and not p.pipeline
            assert type(p.flow) is LeanFlowControl and p.flow._is_writable_event is None  # never paused
            assert type(p.cycle.message_event) is Waiters
            held = [o for o in gc.get_referents(p, p.__dict__, p.cycle, p.cycle.__dict__, p.flow.__dict__)
                    if isinstance(o, (collections.deque, asyncio.Event))]
            assert held == []
    finally:
        for s in streams:
            s.close()
    assert await settle(lambda: len(front.sessions) == 0)


async def test_pipelined_requests_on_one_connection_are_answered_in_order(front: Front) -> None:
    """Requests sent back to back on one connection, before any answer, are each answered, in the
    order sent (uvicorn queues all but the first)."""
    reader, writer = await asyncio.open_connection(front.host, front.port, ssl=front.ssl_context(),
                                                   server_hostname=front.host)
    auth = f"Authorization: Bearer {front.token}\r\nHost: {front.host}\r\n"
    writer.write((f"GET /nowhere HTTP/1.1\r\n{auth}\r\n"
                  f"POST /message?session_id=nonsense HTTP/1.1\r\n{auth}Content-Length: 2\r\n\r\n{{}}"
                  f"GET /message HTTP/1.1\r\n{auth}Connection: close\r\n\r\n").encode())
    try:
        answers = await asyncio.wait_for(reader.read(), DEADLINE)
    finally:
        writer.close()
    statuses = re.findall(rb"HTTP/1.1 (\d{3}) ", answers)
    assert statuses == [b"404", b"400", b"405"], answers[:600]
