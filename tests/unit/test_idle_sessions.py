"""Idle sessions hold little, and closed ones leave nothing behind.

The front runs in this process (the real app, over real TLS, with uvicorn and the front's own
connection guard; no worker pool: ``initialize`` and ``ping`` need none), so the test can look at
what the process holds: while streams are idle, no task at all (the front took each stream's
connection over from uvicorn: no request task, and no writer, watcher or timer of the session's
own), and none of uvicorn's per-request objects; once the streams ended, whether the client
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
from mcpd.front.connections.count import ConnectionCount
from mcpd.front.connections.guarded import guarded_protocol
from mcpd.front.connections.handover import StreamConnection
from mcpd.front.connections.lean import LeanFlowControl, Pipeline, Waiters
from mcpd.front.mcp.dispatcher import Dispatcher
from mcpd.front.mcp.session import McpSession
from mcpd.front.sessions.session import Session
from mcpd.front.sessions.table import SessionManager
from mcpd.front.transport.stream import SessionStream

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
    count: ConnectionCount

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
    count = ConnectionCount(cfg.connections)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, ssl_certfile=cfg.tls.cert, ssl_keyfile=cfg.tls.key,
                            lifespan="off", http=guarded_protocol(count),
                            access_log=False, log_config=None)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.05)
    assert server.started
    try:
        yield Front(f"https://127.0.0.1:{port}", "127.0.0.1", port, plain, str(pki.ca_cert), app.state.sessions, count)
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
    kinds = (Session, McpSession, SessionStream)
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
    # idle: no task for any stream (neither the server's request task nor one of the session's own)
    assert await settle(lambda: len(asyncio.all_tasks()) == tasks_before), \
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


async def test_an_idle_streams_connection_is_held_by_a_stream_connection_alone(front: Front) -> None:
    """Once a stream's response started, the front takes its connection over from uvicorn: what an
    idle stream holds is a :class:`StreamConnection` (slots, no dict) with the transport, and none
    of uvicorn's protocol, request cycle, scope or parser (nor their deques and events)."""
    streams = [await Stream.open(front) for _ in range(3)]
    try:
        gc.collect()
        conns = [o for o in gc.get_objects() if type(o) is StreamConnection]
        assert len(conns) == 3
        assert all(not hasattr(c, "__dict__") and c.writable() and c.on_lost is not None for c in conns)
        assert [o for o in gc.get_objects() if type(o).__name__ in ("GuardedHttpToolsProtocol", "RequestResponseCycle")
                or (isinstance(o, dict) and o.get("type") == "http" and o.get("path") == "/sse")] == []
        # still a live stream: a message goes out on it
        async with httpx.AsyncClient(verify=front.ssl_context(), timeout=DEADLINE) as client:
            r = await client.post(front.url + streams[0].endpoint, headers={"Authorization": f"Bearer {front.token}"},
                                  json={"jsonrpc": "2.0", "id": 7, "method": "ping"})
            assert r.status_code == 202
        assert b'"id":7' in await streams[0].until(b"\n\n")
    finally:
        for s in streams:
            s.close()
    assert await settle(lambda: len(front.sessions) == 0)


async def test_a_request_sent_on_an_event_streams_connection_ends_the_stream_and_frees_the_connection(
        front: Front) -> None:
    """Data on a connection whose response is an event stream (here a second request, pipelined
    behind it) cannot be answered: the stream is ended, its session closed (a POST to it is then
    ``404``), the connection closed, and its place in the connection count given back. Another
    session is not touched."""
    other = await Stream.open(front)
    s = await Stream.open(front)
    assert front.count.total == 2
    s.writer.write(f"GET /sse HTTP/1.1\r\nHost: {front.host}\r\nAuthorization: Bearer {front.token}\r\n\r\n".encode())
    rest = await asyncio.wait_for(s.reader.read(), DEADLINE)  # EOF: the server closed the connection
    assert b"HTTP/1.1" not in rest  # the second request was never answered
    assert await settle(lambda: len(front.sessions) == 1 and front.count.total == 1)
    async with httpx.AsyncClient(verify=front.ssl_context(), timeout=DEADLINE) as client:
        headers = {"Authorization": f"Bearer {front.token}"}
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        assert (await client.post(front.url + s.endpoint, headers=headers, json=ping)).status_code == 404
        assert (await client.post(front.url + other.endpoint, headers=headers, json=ping)).status_code == 202
    assert b'"id":1' in await other.until(b"\n\n")
    s.close()
    other.close()
    assert await settle(lambda: len(front.sessions) == 0 and front.count.total == 0 and front.count.held("127.0.0.1") == 0)


async def test_a_streams_connection_is_counted_until_it_ends_whoever_ends_it(front: Front) -> None:
    """The connection count (total and per address) keeps a stream's connection for as long as it
    is open, and gives it back once it ends: the client leaves, the client drops the connection
    without a TLS goodbye, or the server closes the session. In the last case the client reads the
    response's last chunk, and the connection is closed: the response said ``Connection: close``
    (a client that pools connections must not send its next request on it)."""
    leaves, drops, closed = [await Stream.open(front) for _ in range(3)]
    assert front.count.total == 3 and front.count.held("127.0.0.1") == 3
    leaves.close()
    drops.writer.transport.abort()
    close_by_server(front.sessions, {closed.endpoint.rsplit("=", 1)[1]})
    assert (await closed.until(b"0\r\n\r\n")).endswith(b"0\r\n\r\n")
    assert await asyncio.wait_for(closed.reader.read(), DEADLINE) == b""  # and then closed
    closed.close()
    assert await settle(lambda: front.count.total == 0 and front.count.held("127.0.0.1") == 0 and len(front.sessions) == 0)


async def test_an_idle_streams_connection_holds_no_deque_or_asyncio_event_of_its_own(front: Front) -> None:
    """A connection keeps uvicorn's protocol while it is not a stream (an idle keep-alive connection
    between requests): uvicorn's keeps three empty deques (760 bytes each) for its life, the
    pipelined requests, the request's message event and the write flow control's event. The
    front's keeps a list, and lean events made on first use."""
    reader, writer = await asyncio.open_connection(front.host, front.port, ssl=front.ssl_context(),
                                                   server_hostname=front.host)
    try:
        # a request whose body never comes: its cycle is held, waiting
        writer.write(f"POST /message?session_id={'0' * 32} HTTP/1.1\r\nHost: {front.host}\r\n"
                     f"Authorization: Bearer {front.token}\r\nContent-Length: 10\r\n\r\n{{".encode())
        await writer.drain()
        protocols: list[Any] = []
        for _ in range(100):
            gc.collect()
            protocols = [o for o in gc.get_objects() if type(o).__name__ == "GuardedHttpToolsProtocol" and o.cycle]
            if protocols:
                break
            await asyncio.sleep(0.05)
        assert len(protocols) == 1
        for p in protocols:
            assert type(p.pipeline) is Pipeline and not p.pipeline
            assert type(p.flow) is LeanFlowControl and p.flow._is_writable_event is None  # never paused
            assert type(p.cycle.message_event) is Waiters
            held = [o for o in gc.get_referents(p, p.__dict__, p.cycle, p.cycle.__dict__, p.flow.__dict__)
                    if isinstance(o, (collections.deque, asyncio.Event))]
            assert held == []
    finally:
        writer.close()


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
