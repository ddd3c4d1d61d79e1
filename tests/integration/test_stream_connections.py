"""The event streams the front takes over from uvicorn (``GET /sse``, ``GET /mcp``):
once a stream's headers are written, its connection is held by a ``StreamConnection``
(mcpd/front/connections/handover.py) and written by its session directly (mcpd/front/sessions/session.py).

Each test drives the real daemon over raw TLS as a hostile or careless client would, and checks
what the server holds afterwards from outside: whether the server still holds the client's TCP
connection (``/proc/net/tcp``, the daemon's side of it), the connection caps, the session table
(a POST to a closed session is ``404``) and the log (no traceback). Every loop is bounded in count
and time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpd.common import identity
from tests.conftest import EVENT_TIMEOUT, Daemon, start_daemon, stop_daemon
from tests.support.streams import (
    DEADLINE,
    INIT,
    Raw,
    assert_no_crash_in_log,
    get,
    open_sse,
    reads_done,
    server_connections,
    until,
)

MIB = 1024 * 1024


# -- helpers -------------------------------------------------------------------------------------


def mib_file(tmp_path: Path) -> Path:
    folder = tmp_path / "files"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "one-mib.txt"
    path.write_bytes((b"x" * 1023 + b"\n") * 1024)
    os.chmod(tmp_path, 0o755)
    os.chmod(folder, 0o755)
    return path


def read_call(path: Path, rid: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {
        "name": "files/read", "arguments": {"path": str(path), "offset": 0, "limit": MIB}}}


def ping(rid: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "ping"}


def stalled_behind_reads(d: Daemon, c: httpx.Client, big: Path, count: int) -> tuple[Raw, str]:
    """A ``/sse`` stream whose client reads nothing past its endpoint event, ``count`` 1 MiB reads
    answered onto it: far more than the kernel's buffers take, so the server waits to write."""
    s, endpoint = open_sse(d, rcvbuf=4096)
    assert c.post(d.url + endpoint, json=INIT).status_code == 202
    before = reads_done(d)
    for i in range(count):
        assert c.post(d.url + endpoint, json=read_call(big, i)).status_code == 202
    assert until(lambda: reads_done(d) >= before + count, 60)
    return s, endpoint


def dechunk(data: bytes) -> tuple[bytes, bool]:
    """A chunked body's data, and whether its last chunk (``0``) came."""
    out, pos = [], 0
    while True:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            return b"".join(out), False
        size = int(data[pos:eol], 16)
        if size == 0:
            return b"".join(out), True
        if len(data) < eol + 4 + size:
            return b"".join(out), False
        out.append(data[eol + 2:eol + 2 + size])
        assert data[eol + 2 + size:eol + 4 + size] == b"\r\n", "a chunk's framing"
        pos = eol + 4 + size


def mcp_session(d: Daemon, c: httpx.Client) -> str:
    r = c.post(d.url + "/mcp", json=INIT, headers={"Accept": "application/json, text/event-stream"})
    assert r.status_code == 200
    return r.headers["mcp-session-id"]


def mcp_headers(sid: str) -> str:
    return f"Accept: text/event-stream\r\nMcp-Session-Id: {sid}\r\n"


def mcp_ping(d: Daemon, c: httpx.Client, sid: str, rid: Any = 1) -> int:
    return c.post(d.url + "/mcp", json=ping(rid), headers={
        "Accept": "application/json, text/event-stream", "Mcp-Session-Id": sid}).status_code


# -- a client that stops reading -----------------------------------------------------------------


@pytest.mark.parametrize("pipelined", [False, True], ids=["taken-over", "kept-by-uvicorn"])
def test_a_stream_whose_queue_overflows_is_cut_and_its_connection_let_go(
        daemon_factory: Callable[..., Daemon], tmp_path: Path, pipelined: bool) -> None:
    """A client that reads nothing while 1 MiB answers pile up: once its queue holds
    ``session_queue_bytes`` and it has taken nothing for ``connections.idle_seconds`` (here 1 s)
    the session is closed (``404``) and the server drops the connection at once, three times in a
    row, rather than keeping it (its count, its buffers and the event its writer waits to write)
    for as long as the client keeps it open. Also for a stream the server kept (a request pipelined
    behind the ``GET``: the front cannot take the connection over), whose cut must be a dropped
    connection, not a cancelled request the server logs as a failure."""
    d = daemon_factory(session_queue_bytes=4 * MIB, connections={"idle_seconds": 1})
    big = mib_file(tmp_path)
    with httpx.Client(verify=d.ssl_context(), timeout=60, headers=d.auth()) as c:
        for _ in range(3):
            s, endpoint = open_sse(d, rcvbuf=4096, body=get(d, "/nowhere") if pipelined else b"")
            try:
                assert c.post(d.url + endpoint, json=INIT).status_code == 202
                statuses = []
                end = time.monotonic() + DEADLINE
                for i in range(400):
                    statuses.append(c.post(d.url + endpoint, json=read_call(big, i)).status_code)
                    if statuses[-1] == 404 or time.monotonic() > end:
                        break
                    time.sleep(0.05)
                assert statuses[-1] == 404, statuses
                assert until(lambda: server_connections(d, s.port) == 0), "the stalled stream's connection is still held"
            finally:
                s.close()
    assert "outgoing queue full" in d.log()
    assert_no_crash_in_log(d)


def test_revoking_the_token_of_a_stalled_stream_cuts_its_connection(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """A stream stalled by its client (8 MiB of answers it does not read, within its queue) whose
    token is then revoked: the re-check closes the session and the server drops the connection,
    though the stream cannot take its last chunk; Bob's session is untouched."""
    d = daemon_factory()
    big = mib_file(tmp_path)
    with httpx.Client(verify=d.ssl_context(), timeout=60, headers=d.auth()) as c:
        s, endpoint = stalled_behind_reads(d, c, big, 8)
        bob, bob_endpoint = open_sse(d, token=d.other_token)
        try:
            assert server_connections(d, s.port) == 1
            users_file = d.state_dir / "users.yaml"
            users = identity.load_users(users_file)
            users["alice"] = identity.UserRecord(name="alice", os_user=users["alice"].os_user, tokens=[])
            identity.save_users(users_file, users)
            assert until(lambda: server_connections(d, s.port) == 0), "the revoked, stalled stream is still held"
            assert c.post(d.url + bob_endpoint, json=ping("bob"), headers=d.auth(d.other_token)).status_code == 202
            assert b'"id":"bob"' in bob.until(b"\n\n\r\n")
        finally:
            s.close()
            bob.close()
    assert_no_crash_in_log(d)


def test_large_events_reach_a_slow_reader_whole(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """Twelve 1 MiB answers to a client that reads 16 KiB at a time, slowly: the writes paused and
    resumed many times over, yet the body is well-formed chunked encoding holding every event
    whole, each once (the reads run side by side: they finish in any order); then the client leaves and the session and connection are freed."""
    d = daemon_factory()
    big = mib_file(tmp_path)
    count = 12
    with httpx.Client(verify=d.ssl_context(), timeout=60, headers=d.auth()) as c:
        s, endpoint = open_sse(d, rcvbuf=16384)
        try:
            assert c.post(d.url + endpoint, json=INIT).status_code == 202
            for i in range(count):
                assert c.post(d.url + endpoint, json=read_call(big, i)).status_code == 202
            body = b""
            end = time.monotonic() + 120
            while body.count(b"\n\n") < count + 1 and time.monotonic() < end:
                try:
                    chunk = s.sock.recv(16384)
                except TimeoutError:
                    break
                if not chunk:
                    break
                s.buf += chunk
                body, _ = dechunk(s.buf)
                time.sleep(0.001)
            events = [e for e in body.split(b"\n\n") if e.startswith(b"event: message")]
            messages = [json.loads(e.split(b"data: ", 1)[1]) for e in events]
            assert messages[0]["id"] == "init"
            assert sorted(m["id"] for m in messages[1:]) == list(range(count))
            for m in messages[1:]:
                assert m["result"]["content"][0]["text"] == "x" * 1023 + "\n" + ("x" * 1023 + "\n") * 1023
        finally:
            s.close()
        assert until(lambda: server_connections(d) <= 1)  # (the POSTs' own keep-alive connection)
        assert c.post(d.url + endpoint, json=ping(1)).status_code == 404
    assert_no_crash_in_log(d)


# -- GET /mcp streams: the session outlives them ---------------------------------------------------


def test_an_mcp_session_outlives_a_stream_its_client_ended_by_sending_on_it(
        daemon_factory: Callable[..., Daemon]) -> None:
    """A ``GET /mcp`` stream on which the client sends a byte, and which it then neither reads nor
    closes (its TLS goodbye never answered: the server's close waits for it): the stream is over at
    once for its session. Keep-alive comments fall due meanwhile, yet the session lives on (a
    ``ping`` is answered), a new ``GET /mcp`` is a stream (not ``409``), and nothing is logged as
    an error."""
    d = daemon_factory(keepalive_seconds=1.0)
    with httpx.Client(verify=d.ssl_context(), timeout=30, headers=d.auth()) as c:
        sid = mcp_session(d, c)
        s = Raw(d)
        s.send(get(d, "/mcp", mcp_headers(sid)))
        assert s.head()[0] == 200
        s.send(b"x")
        assert until(lambda: "sent data on its event stream" in d.log())
        time.sleep(2.5)  # (two keep-alive rounds: each would write to the closing connection)
        try:
            assert mcp_ping(d, c, sid) == 200
            again = Raw(d)
            again.send(get(d, "/mcp", mcp_headers(sid)))
            assert again.head()[0] == 200
            again.close()
        finally:
            s.close()
    assert_no_crash_in_log(d)


def test_an_mcp_stream_ends_without_ending_its_session_and_delete_ends_both(
        daemon_factory: Callable[..., Daemon]) -> None:
    """``GET /mcp``: a second stream while one is open is ``409``; the client leaving (with or
    without a TLS goodbye, or by a reset) ends the stream, not the session, and a new stream may
    then open; ``DELETE`` while a stream is open ends it with its last chunk, the connection is
    closed, and the session is gone (``404``)."""
    d = daemon_factory()
    with httpx.Client(verify=d.ssl_context(), timeout=30, headers=d.auth()) as c:
        sid = mcp_session(d, c)
        for leave in ("close", "reset", "unwrap"):
            s = Raw(d)
            s.send(get(d, "/mcp", mcp_headers(sid)))
            assert s.head()[0] == 200
            second = Raw(d)
            second.send(get(d, "/mcp", mcp_headers(sid)))
            assert second.head()[0] == 409
            second.close()
            if leave == "close":
                s.close()
            elif leave == "reset":
                s.reset()
            else:
                s.sock.unwrap().close()
            assert until(lambda: server_connections(d, s.port) == 0)
            assert mcp_ping(d, c, sid, leave) == 200
        s = Raw(d)
        s.send(get(d, "/mcp", mcp_headers(sid)))
        assert until(lambda: mcp_ping(d, c, sid) == 200)
        assert s.head()[0] == 200
        r = c.delete(d.url + "/mcp", headers={"Mcp-Session-Id": sid})
        assert r.status_code == 200
        body, ended = dechunk(s.rest())
        assert ended and body.strip(b": ping\n") == b""
        s.close()  # (the server waits for the TLS goodbye, as for any connection it closes)
        assert until(lambda: server_connections(d, s.port) == 0)
        assert mcp_ping(d, c, sid) == 404
    assert_no_crash_in_log(d)


# -- odd GET requests: they still stream, and leave nothing behind -----------------------------------


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = start_daemon(tmp_path_factory.mktemp("takeover"), connections={"body_seconds": 1.0}, keepalive_seconds=1.0)
    yield d
    stop_daemon(d)


ODD_GETS: dict[str, Callable[[Daemon], bytes]] = {
    "HTTP/1.0": lambda d: get(d, version="1.0"),
    "HTTP/1.0 keep-alive": lambda d: get(d, version="1.0", extra="Connection: keep-alive\r\n"),
    "a body, whole": lambda d: get(d, extra="Content-Length: 5\r\n") + b"hello",
    "a chunked body, whole": lambda d: get(d, extra="Transfer-Encoding: chunked\r\n") + b"5\r\nhello\r\n0\r\n\r\n",
    "Expect: 100-continue, no body": lambda d: get(d, extra="Expect: 100-continue\r\n"),
    "a request pipelined in the same write": lambda d: get(d) + get(d, "/nowhere"),
    "half a request pipelined": lambda d: get(d) + b"GET /nowh",
    "Connection: close, then a request": lambda d: get(d, extra="Connection: close\r\n") + get(d, "/nowhere"),
    "a second GET /sse pipelined": lambda d: get(d) + get(d),
}


@pytest.mark.parametrize("case", list(ODD_GETS))
def test_an_odd_get_sse_streams_and_leaves_nothing_once_its_client_leaves(shared: Daemon, case: str) -> None:
    """Whatever rides with the ``GET /sse`` (HTTP/1.0, a body, ``Expect``, requests pipelined
    behind it, whole or half): the stream opens, a reply reaches it as a whole chunk, nothing
    pipelined behind a stream that never ends is answered, and once the client leaves its session
    is gone (``404``) and the server holds no connection of it. (Behind a whole request pipelined
    with it, the stream stays uvicorn's, which reads nothing more until the response ends: the
    server learns that the client left from its next keep-alive comment, 1 s here.)"""
    d = shared
    s = Raw(d)
    s.send(ODD_GETS[case](d))
    status, head = s.head()
    assert status == 200 and b"transfer-encoding: chunked" in head
    endpoint = s.until(b"\n\n\r\n").split(b"data: ", 1)[1].split(b"\n", 1)[0].decode().strip()
    with httpx.Client(verify=d.ssl_context(), timeout=30, headers=d.auth()) as c:
        assert c.post(d.url + endpoint, json=ping("odd")).status_code == 202
        reply = s.until(b'"id":"odd","result":{}}\n\n\r\n')
        assert b"HTTP/1." not in reply
        s.close()
        assert until(lambda: server_connections(d, s.port) == 0)
        assert until(lambda: c.post(d.url + endpoint, json=ping(2)).status_code == 404)


@pytest.mark.parametrize("extra", ["Content-Length: 5\r\n", "Expect: 100-continue\r\nContent-Length: 5\r\n",
                                   "Transfer-Encoding: chunked\r\n"])
def test_a_get_sse_whose_body_never_comes_is_closed_by_the_body_deadline(shared: Daemon, extra: str) -> None:
    """A ``GET /sse`` announcing a body it never sends: no ``100 Continue`` is sent, the stream
    works meanwhile, and the body deadline (1 s here) closes the connection and with it the
    session (``404``)."""
    d = shared
    s = Raw(d)
    s.send(get(d, extra=extra))
    assert s.head()[0] == 200
    endpoint = s.until(b"\n\n\r\n").split(b"data: ", 1)[1].split(b"\n", 1)[0].decode().strip()
    rest = s.rest()  # until the server ends the connection
    s.close()
    assert b"100 Continue" not in rest
    assert until(lambda: server_connections(d, s.port) == 0)
    with httpx.Client(verify=d.ssl_context(), timeout=30, headers=d.auth()) as c:
        assert c.post(d.url + endpoint, json=ping(1)).status_code == 404


def test_head_sse_answers_headers_only_and_leaves_no_session(daemon_factory: Callable[..., Daemon]) -> None:
    """``HEAD /sse``, five times on one connection (the last with a ``GET`` pipelined behind it):
    headers only, no body, the connection stays usable, and no session is left (the principal's
    two-session cap still admits two streams afterwards)."""
    d = daemon_factory(max_sessions_per_principal=2)
    s = Raw(d)
    for _ in range(4):
        s.send(get(d, method="HEAD"))
        status, head = s.head()
        assert status == 200 and b"transfer-encoding" not in head
    s.send(get(d, method="HEAD") + get(d, "/nowhere"))
    assert s.head()[0] == 200
    assert s.head()[0] == 404
    s.close()
    streams = [open_sse(d)[0] for _ in range(2)]
    for t in streams:
        t.close()
    assert_no_crash_in_log(d)


# -- clients that leave in every way, many times ---------------------------------------------------


LEAVES = ("close", "reset", "half-close", "tls goodbye", "junk")


def leave(s: Raw, how: str) -> None:
    if how == "close":
        s.close()
    elif how == "reset":
        s.reset()
    elif how == "half-close":  # a TCP FIN without a TLS goodbye, the client still there
        s.sock.shutdown(socket.SHUT_WR)
    elif how == "tls goodbye":  # close_notify, the TCP connection kept open
        try:
            s.sock.unwrap()
        except ssl.SSLError:  # (a reply came before the server's goodbye: ours is sent all the same)
            pass
    else:  # then gone (a client that stays without answering the server's TLS goodbye is let go
        # after the TLS shutdown timeout, 30 s, as for any connection the server closes)
        s.send(b"\r\n\r\nGET / HTTP/1.1\r\n\r\n")
        s.close()


def test_streams_opened_and_dropped_in_every_way_give_their_connections_back(
        daemon_factory: Callable[..., Daemon]) -> None:
    """Four rounds of eight ``/sse`` streams, each left its own way (close, reset, half-close,
    TLS goodbye with the TCP connection kept, junk sent on the stream); a reply raced against the
    end of some. Each time the server lets go of every connection and session, so with a cap of
    ten connections per address, nine streams still open side by side at the end (one leaked
    count would refuse the ninth)."""
    d = daemon_factory(connections={"max_per_address": 10})
    with httpx.Client(verify=d.ssl_context(), timeout=30, headers=d.auth(), limits=httpx.Limits(max_connections=1)) as c:
        for n in range(4):
            streams = [open_sse(d) for _ in range(8)]
            for i, (s, endpoint) in enumerate(streams):
                if i % 2:
                    assert c.post(d.url + endpoint, json=ping(i)).status_code == 202
                leave(s, LEAVES[(i + n) % len(LEAVES)])
            for i, (s, endpoint) in enumerate(streams):
                assert until(lambda: server_connections(d, s.port) == 0), \
                    f"held: the connection of a stream left by {LEAVES[(i + n) % len(LEAVES)]}"
                assert until(lambda: c.post(d.url + endpoint, json=ping(0)).status_code == 404)
                s.close()
        last = [open_sse(d) for _ in range(9)]
        for s, endpoint in last:
            assert c.post(d.url + endpoint, json=ping("last")).status_code == 202
            assert b'"id":"last"' in s.until(b"\n\n\r\n")
            s.close()
    assert_no_crash_in_log(d)


# -- server shutdown ----------------------------------------------------------------------------------


def test_sigterm_with_streams_open_and_stalled_exits_promptly_ending_the_writable_ones(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """SIGTERM with three streams that read and two stalled by their clients (6 MiB of answers
    each, unread): the daemon exits promptly; each reading stream gets the response's last chunk
    and then the end of the connection; the stalled ones are let go too."""
    d = daemon_factory()
    big = mib_file(tmp_path)
    with httpx.Client(verify=d.ssl_context(), timeout=60, headers=d.auth()) as c:
        reading = [open_sse(d)[0] for _ in range(3)]
        stalled = [stalled_behind_reads(d, c, big, 6)[0] for _ in range(2)]
    d.proc.send_signal(signal.SIGTERM)
    try:
        d.proc.wait(timeout=DEADLINE)
    except Exception:
        pytest.fail("the daemon did not exit within 15 s of SIGTERM")
    for s in reading:
        body, ended = dechunk(s.rest())
        assert ended, "a writable stream ended without its last chunk"
        s.close()
    for s in stalled:
        s.sock.settimeout(DEADLINE)
        s.rest()  # the connection ends (no hang)
        s.close()
    log = d.log()
    assert "Traceback" not in log, log[-4000:]


def test_head_mcp_is_a_get_with_headers_only_and_never_ends_the_session(
        daemon_factory: Callable[..., Daemon]) -> None:
    """``HEAD /mcp`` (Starlette admits HEAD wherever GET is) with the session's id: the stream's
    headers, no body, and the session lives on, its GET stream still free to open; while a GET
    stream is open it is ``409`` like a second GET."""
    d = daemon_factory()
    with httpx.Client(verify=d.ssl_context(), timeout=30, headers=d.auth()) as c:
        sid = mcp_session(d, c)
        r = c.head(d.url + "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream") and r.content == b""
        assert mcp_ping(d, c, sid) == 200
        s = Raw(d)
        s.send(get(d, "/mcp", mcp_headers(sid)))
        assert s.head()[0] == 200
        r = c.head(d.url + "/mcp", headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid})
        assert r.status_code == 409
        s.close()
        assert mcp_ping(d, c, sid) == 200
    assert_no_crash_in_log(d)


# -- replies racing the stream's end --------------------------------------------------------------


async def _race(d: Daemon, leave_how: str, rounds: int) -> None:
    async with httpx.AsyncClient(verify=d.ssl_context(), timeout=30, headers=d.auth()) as c:
        for n in range(rounds):
            s, endpoint = open_sse(d)
            posts = [asyncio.ensure_future(c.post(d.url + endpoint, json=ping(i))) for i in range(20)]
            await asyncio.sleep(0.01 * (n % 4))
            leave(s, leave_how)
            statuses = {(await p).status_code for p in posts}
            assert statuses <= {202, 404}, statuses
            assert await asyncio.to_thread(until, lambda: server_connections(d, s.port) == 0)
            assert (await c.post(d.url + endpoint, json=ping("after"))).status_code == 404
            s.close()


@pytest.mark.parametrize("how", ["reset", "close", "junk"])
def test_replies_racing_the_streams_end_are_dropped_quietly(daemon_factory: Callable[..., Daemon], how: str) -> None:
    """Twenty replies in flight while the client leaves its stream (reset, close, or junk sent on
    it), at varying moments, eight times: every POST is answered ``202`` or ``404``, the session
    and connection are gone afterwards, and nothing is logged as an error or a warning of writes
    to a closed connection."""
    d = daemon_factory()
    asyncio.run(_race(d, how, 8))
    assert_no_crash_in_log(d)
    assert "SSL connection is closed" not in d.log()


def test_clients_that_leave_before_their_streams_headers_leave_nothing(daemon_factory: Callable[..., Daemon]) -> None:
    """Thirty ``GET /sse`` whose clients leave right after sending them (reset, half-close,
    close), before the response could be written or the connection taken over: no connection,
    connection count or session is left behind (with caps of five sessions per principal and six
    connections per address, five streams still open side by side afterwards)."""
    d = daemon_factory(max_sessions_per_principal=5, connections={"max_per_address": 6})
    gone = []
    for n in range(30):
        s = Raw(d)
        s.send(get(d))
        how = ("reset", "half-close", "close")[n % 3]
        leave(s, how)
        gone.append(s)
    for s in gone:
        assert until(lambda: server_connections(d, s.port) == 0)
        s.close()
    with httpx.Client(verify=d.ssl_context(), timeout=30, headers=d.auth()) as c:
        assert until(lambda: c.get(d.url + "/nowhere").status_code == 404)  # (the one connection left for it)
    last = [open_sse(d) for _ in range(5)]
    for s, _ in last:
        s.close()
    assert_no_crash_in_log(d)


# -- a stream's end closes its connection: the client must know it ----------------------------------


def test_a_client_reusing_its_connections_is_not_handed_one_that_a_streams_end_closes(
        daemon_factory: Callable[..., Daemon]) -> None:
    """The server closes a stream's connection when the stream ends, so the stream's response
    says ``Connection: close`` (``/sse`` and ``/mcp``): an HTTP/1.1 client that pools its
    connections (httpx here) then never sends its next request on that one, where it would be
    lost ("server disconnected without sending a response") after a ``DELETE`` ended the stream."""

    d = daemon_factory()

    async def go() -> None:
        async with httpx.AsyncClient(verify=d.ssl_context(), timeout=EVENT_TIMEOUT, headers=d.auth(),
                                     limits=httpx.Limits(max_connections=2)) as c:
            async with c.stream("GET", d.url + "/sse") as s:
                assert s.status_code == 200 and s.headers["connection"] == "close"
            for _n in range(3):
                r = await c.post(d.url + "/mcp", json=INIT, headers={"Accept": "application/json, text/event-stream"})
                sid = r.headers["mcp-session-id"]
                async with c.stream("GET", d.url + "/mcp", headers={"Accept": "text/event-stream",
                                                                     "Mcp-Session-Id": sid}) as s:
                    assert s.status_code == 200 and s.headers["connection"] == "close"
                    assert (await c.delete(d.url + "/mcp", headers={"Mcp-Session-Id": sid})).status_code == 200
                    async for _ in s.aiter_bytes():
                        pass
                for i in range(3):  # each on a connection of the pool: never the stream's
                    r = await c.post(d.url + "/mcp", json=ping(i), headers={
                        "Accept": "application/json, text/event-stream", "Mcp-Session-Id": sid})
                    assert r.status_code == 404

    asyncio.run(go())
    assert_no_crash_in_log(d)
