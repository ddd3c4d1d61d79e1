"""The bytes the front holds for clients that stop reading (the outgoing queue's bounds).

A client that stops reading its stream just short of its queue's overflow used to leave the front
holding, besides the queue's ``session_queue_bytes``, the event its writer was writing and one or
two more in the connection's buffers (about 37 MiB with the defaults), for as long as it kept the
stream open, times its 100 sessions. Now a session counts everything it holds that the client has
not taken, and the bytes of all sessions and ``/mcp`` POST streams of one principal, and of all
principals, have budgets (``principal_queue_bytes``, ``total_queue_bytes``).

Each test drives the real daemon over raw TLS (a client with a tiny receive buffer that reads
nothing) and reads what the front holds from its metrics listener (``mcpd_outgoing_bytes``, the
sessions' counters; ``mcpd_limits_hit_total``), whether its session still answers (``404`` once
closed) and whether the server still holds the connection. Every loop is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Daemon, slow_read
from tests.support.budgets import (
    ANSWER_MIB,
    MIB,
    Metrics,
    answer_ends,
    bob_is_served,
    daemon_with_metrics,
    read_call,
    session_of,
    stall,
    stateless_read,
)
from tests.support.net import free_port
from tests.support.principals import add_dev_principals
from tests.support.streamable import (
    client,
    hdrs,
    open_session,
)
from tests.support.streamable import (
    headers as modern_headers,
)
from tests.support.streamable import (
    request as modern_request,
)
from tests.support.streams import INIT, Raw, assert_no_crash_in_log, reads_done, server_connections, until

QUEUE = 16 * MIB  # session_queue_bytes' default
SLACK = MIB  # what the TLS layer buffers besides (its high-water mark and about a piece)


def session_alive(d: Daemon, c: httpx.Client, endpoint: str, token: str | None = None) -> bool:
    """Whether the session still takes POSTs: a notification, answered by nothing, so asking
    adds nothing to the stalled stream's queue."""
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    return c.post(d.url + endpoint, json=note, headers=d.auth(token)).status_code == 202


@pytest.mark.parametrize("pipelined", [False, True], ids=["taken-over", "kept-by-uvicorn"])
def test_a_stream_stalled_short_of_its_queue_overflow_holds_no_more_than_its_queue(
        daemon_factory: Callable[..., Daemon], tmp_path: Path, pipelined: bool) -> None:
    """A client reads nothing of its ``/sse`` stream while five 6 MiB answers are posted: what
    used to fit without an overflow (one answer in the connection's buffers, one in the TLS
    layer's, one taken by the writer, two in the 16 MiB queue: 30 MiB held for as long as the
    client liked). Now the answer being written and what the connection holds count in the queue:
    with the third answer the queue holds its 16 MiB, so the fourth and fifth reads wait for room
    (not run); the client takes nothing for ``connections.idle_seconds`` (here 5 s), so the session is
    closed (its POSTs get 404, the ``queue_overflow`` limit counts it) and its connection dropped,
    the front never holding more than the queue plus one answer; bob is served meanwhile. Also
    for a stream the server kept (its events then go through the server's ``send``, a piece at a
    time)."""
    d, m, big, small = daemon_with_metrics(daemon_factory, tmp_path, connections={"idle_seconds": 5})
    overflows = m.hits("queue_overflow")
    with httpx.Client(verify=d.ssl_context(), timeout=60, headers=d.auth()) as c:
        s, endpoint, statuses = stall(d, c, big, 3, m=m, pipelined=pipelined)
        for i in (3, 4):  # (they wait for room: nothing to wait for here)
            statuses.append(c.post(d.url + endpoint, json=read_call(big, i)).status_code)
        try:
            bob_is_served(d, c, small)
            assert until(lambda: not session_alive(d, c, endpoint)), \
                f"the stalled session still holds its answers (POSTs: {statuses}, held: {m.outgoing():.0f} bytes)"
            assert until(lambda: server_connections(d, s.port) == 0), "the stalled stream's connection is still held"
            assert m.hits("queue_overflow") == overflows + 1
            assert m.peak <= QUEUE + (ANSWER_MIB + 0.1) * MIB + SLACK, m.peak
            assert until(lambda: m.outgoing() == 0), "the closed session's bytes are still counted"
            bob_is_served(d, c, small)
        finally:
            s.close()
    assert "outgoing queue full" in d.log()
    assert_no_crash_in_log(d)


def test_stalled_sessions_of_one_principal_share_its_budget(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """Three ``/sse`` sessions of alice each stall behind two 6 MiB answers (within each one's
    16 MiB queue), with ``principal_queue_bytes`` at 24 MiB: the first keeps its two; the others
    would pass alice's budget with their second answer, so each is closed then (404, the
    ``queue_bytes_per_principal`` limit counting it). Bob's own stalled session, with as much
    held, is untouched (his budget is his own), and a new session of his is served."""
    d, m, big, small = daemon_with_metrics(daemon_factory, tmp_path, principal_queue_bytes=24 * MIB)
    streams: list[Raw] = []
    with httpx.Client(verify=d.ssl_context(), timeout=60) as c:
        try:
            endpoints = []
            for _ in range(3):
                s, endpoint, _statuses = stall(d, c, big, 2, m=m)
                streams.append(s)
                endpoints.append(endpoint)
            bob, bob_endpoint, bob_statuses = stall(d, c, big, 2, token=d.other_token, m=m)
            streams.append(bob)
            assert bob_statuses == [202, 202]
            assert session_alive(d, c, endpoints[0]), "alice's first stalled session is within her budget"
            for endpoint in endpoints[1:]:
                assert until(lambda: not session_alive(d, c, endpoint)), "a session past alice's budget is still open"
            assert m.hits("queue_bytes_per_principal") == 2
            assert m.hits("queue_overflow") == 0, "no session's own queue was full"
            assert session_alive(d, c, bob_endpoint, d.other_token), "bob's session paid for alice's"
            assert m.peak <= 2 * 24 * MIB + SLACK, m.peak  # each principal within its budget
            bob_is_served(d, c, small)
        finally:
            for s in streams:
                s.close()
    assert "over principal_queue_bytes" in d.log()
    assert_no_crash_in_log(d)


def post_stream(d: Daemon, sid: str, message: dict[str, Any]) -> Raw:
    """A ``POST /mcp`` asking for an event stream, on a connection whose client then reads nothing."""
    raw = Raw(d, rcvbuf=4096)
    body = json.dumps(message).encode()
    raw.send((f"POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {d.token}\r\n"
              f"Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
              f"Mcp-Session-Id: {sid}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
    return raw


def test_stalled_post_streams_of_one_principal_share_its_budget(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """Streamable HTTP: four POSTs of alice's session, each a 6 MiB read asking for progress (so
    answered as an event stream), on connections whose client reads nothing, with
    ``principal_queue_bytes`` at 24 MiB. Each stream's answer counts until its connection took it
    (a piece at a time), so the fourth would pass alice's budget: that stream is cut without its
    answer (the ``queue_bytes_per_principal`` limit counts it) and its bytes released, while the
    front holds no more than the budget; bob is served meanwhile."""
    d, m, big, small = daemon_with_metrics(daemon_factory, tmp_path, principal_queue_bytes=24 * MIB)
    posts: list[Raw] = []
    with httpx.Client(verify=d.ssl_context(), timeout=60) as c:
        r = c.post(d.url + "/mcp", json=INIT, headers={"Accept": "application/json, text/event-stream", **d.auth()})
        assert r.status_code == 200
        sid = r.headers["mcp-session-id"]
        try:
            for i in range(4):
                before = reads_done(d)
                posts.append(post_stream(d, sid, read_call(big, i, progress=True)))
                assert until(lambda: reads_done(d) > before, 60), "the read was not answered"
                m.outgoing()
            assert until(lambda: m.hits("queue_bytes_per_principal") == 1), "no stream passed alice's budget"
            status, _ = posts[3].head()
            assert status == 200
            cut = posts[3].until(b"0\r\n\r\n")  # the stream ended, without its answer
            assert b'"result"' not in cut
            assert m.peak <= 24 * MIB + SLACK, m.peak
            bob_is_served(d, c, small)
        finally:
            for raw in posts:
                raw.close()
        assert until(lambda: m.outgoing() == 0), "the streams' bytes are still counted once their clients left"
    assert_no_crash_in_log(d)


def test_a_post_stream_writes_its_own_keep_alive_comments(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """A POST stream writes its keep-alive comments itself (the response's own ticker could write
    one between two pieces of a large event): a call that runs for seconds (counting the lines of a
    16 GiB hole) gets ``: ping`` comments on its stream while it runs, with ``keepalive_seconds``
    at 0.2; the call is then cancelled."""
    d = daemon_factory(keepalive_seconds=0.2)
    headers = {"Accept": "application/json, text/event-stream", **d.auth()}
    slow = slow_read(tmp_path, "slow")
    slow["params"]["_meta"] = {"progressToken": "p"}
    with httpx.Client(verify=d.ssl_context(), timeout=30) as c:
        r = c.post(d.url + "/mcp", json=INIT, headers=headers)
        assert r.status_code == 200
        headers["Mcp-Session-Id"] = r.headers["mcp-session-id"]
        with c.stream("POST", d.url + "/mcp", json=slow, headers=headers) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            lines = stream.iter_lines()
            first = next(line for line in lines if line)
            assert first == ": ping", first
        c.post(d.url + "/mcp", headers=headers, json={"jsonrpc": "2.0", "method": "notifications/cancelled",
                                                      "params": {"requestId": "slow"}})
    assert_no_crash_in_log(d)


# -- /mcp answers as JSON (written whole once; now in pieces, charged while their client is behind) --


LIMITS = ("queue_overflow", "queue_bytes_per_principal", "queue_bytes_total")


def unread_answer(d: Daemon, m: Metrics, message: dict[str, Any], headers: dict[str, str]) -> Raw:
    """A ``POST /mcp`` answered as JSON (a 6 MiB read), on a connection whose client then reads
    nothing; returns once the read was answered and its answer either counted in
    ``mcpd_outgoing_bytes`` (the client is behind) or refused by a bound."""
    raw = Raw(d, rcvbuf=4096)
    body = json.dumps(message).encode()
    fields = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    reads, held, refused = reads_done(d), m.outgoing(), sum(map(m.hits, LIMITS))
    raw.send(f"POST /mcp HTTP/1.1\r\nHost: x\r\n{fields}Content-Type: application/json\r\n"
             f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    assert until(lambda: reads_done(d) > reads, 60), "the read was not answered"
    assert until(lambda: m.outgoing() > held or sum(map(m.hits, LIMITS)) > refused), \
        "the unread answer is neither counted nor refused"
    return raw


def answer_text(raw: Raw) -> str:
    """A client reading at last: its read's answer to the end, which must be whole (``200``); the text."""
    status, whole = answer_ends(raw)
    assert status == 200, whole[:300]
    text: str = json.loads(whole)["result"]["content"][0]["text"]
    return text


def all_released(m: Metrics, posts: list[Raw]) -> None:
    """Every client leaves: nothing their answers held stays counted."""
    for raw in posts:
        raw.close()
    assert until(lambda: m.outgoing() == 0), "the answers' bytes are still counted once their clients left"


def test_large_answers_of_one_session_read_late_are_all_delivered_whole(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """Four POSTs of one session, each a 6 MiB read answered as JSON, on connections whose client
    reads nothing at first: 24 MiB held for one session, more than its 16 MiB queue bound
    (``session_queue_bytes``). Each answer has a connection of its own, and a client reading
    several large answers at once is normal (a reader keeping up is behind for most of a large
    answer): they count against the principal's budget (128 MiB), not the session's queue. So
    none is dropped and no bound is counted, the session lives, every answer arrives whole once
    its client reads, and once the clients leave nothing stays counted."""
    d, m, big, small = daemon_with_metrics(daemon_factory, tmp_path)
    before = [m.hits(kind) for kind in LIMITS]
    posts: list[Raw] = []
    with httpx.Client(verify=d.ssl_context(), timeout=60) as c:
        headers = session_of(d, c)
        try:
            for i in range(4):
                posts.append(unread_answer(d, m, read_call(big, i), headers))
            assert m.outgoing() > QUEUE, m.outgoing()  # held for the session's clients, and counted
            assert all(server_connections(d, raw.port) == 1 for raw in posts), "an answer was dropped"
            assert [m.hits(kind) for kind in LIMITS] == before
            ping = c.post(d.url + "/mcp", json={"jsonrpc": "2.0", "id": "p", "method": "ping"}, headers=headers)
            assert ping.status_code == 200, "the session was closed for its clients' answers"
            for raw in posts:
                assert len(answer_text(raw)) == ANSWER_MIB * MIB
            bob_is_served(d, c, small)
        finally:
            all_released(m, posts)
    assert_no_crash_in_log(d)


def test_unread_json_answers_of_one_principal_share_its_budget(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """Alice's POSTs answered as JSON, 6 MiB each, on connections whose client reads nothing: one
    without a session (2026-07-28), then one on each of two sessions, then one more on the first
    session and one more without, with ``principal_queue_bytes`` at 20 MiB. What their
    connections have not taken adds up against her budget: the first three fit (about 18 MiB),
    the last two would pass it, so each waits for room, and, as none of her answers moves, is
    refused ``-32000`` before its bytes are made (the ``queue_bytes_per_principal`` limit
    counting it; no session's own bound is passed) and the front never holds more than the budget
    for her. Bob's own unread answer is untouched (his budget is his own), he reads it whole, and
    a new session of his is served."""
    d, m, big, small = daemon_with_metrics(daemon_factory, tmp_path, principal_queue_bytes=20 * MIB)
    posts: list[Raw] = []
    with httpx.Client(verify=d.ssl_context(), timeout=60) as c:
        try:
            bob = unread_answer(d, m, *stateless_read(d, big, 99, d.other_token))
            posts.append(bob)
            bob_held = m.outgoing()
            first, second = session_of(d, c), session_of(d, c)
            alice = [unread_answer(d, m, *stateless_read(d, big, 1)),
                     unread_answer(d, m, read_call(big, 2), first),
                     unread_answer(d, m, read_call(big, 3), second),
                     unread_answer(d, m, read_call(big, 4), first),
                     unread_answer(d, m, *stateless_read(d, big, 5))]
            posts += alice
            for raw in alice[3:]:
                status, whole = answer_ends(raw)
                error = json.loads(whole)["error"]
                assert status == 200 and error["code"] == -32000 and "principal_queue_bytes" in error["message"], \
                    "an answer past her budget was made"
            assert all(server_connections(d, raw.port) == 1 for raw in alice[:3]), "an answer within her budget was dropped"
            assert m.hits("queue_bytes_per_principal") == 2
            assert m.hits("queue_overflow") == 0, "no session's own bound was passed"
            assert server_connections(d, bob.port) == 1, "bob's answer paid for alice's"
            assert m.peak <= 20 * MIB + bob_held, m.peak
            bob_is_served(d, c, small)
            assert len(answer_text(bob)) == ANSWER_MIB * MIB
        finally:
            all_released(m, posts)
    assert "over principal_queue_bytes" in d.log()
    assert_no_crash_in_log(d)


SMALL_ANSWER = 250 * 1024  # bytes of text: the answer stays under one piece (256 KiB)


def stalled_small_answer(d: Daemon, path: Path, rid: int) -> Raw:
    """A stateless ``POST /mcp`` read of ``path`` answered as JSON (under one piece), on a
    connection whose client reads nothing; returns once the read was answered."""
    message = modern_request("tools/call", {"name": "files/read", "arguments": {"path": str(path),
                                                                                  "limit": SMALL_ANSWER + 1024}}, rid)
    headers = {**modern_headers(d, message), "Accept": "application/json"}
    done = reads_done(d)
    raw = post_raw(d, message, headers, 4096)
    assert until(lambda: reads_done(d) > done, 30), "the read was not answered"
    return raw


def post_raw(d: Daemon, message: dict[str, Any] | list[Any], headers: dict[str, str], rcvbuf: int) -> Raw:
    """``POST /mcp`` ``message`` with ``headers`` on a new raw connection with a ``rcvbuf`` byte
    receive buffer; the connection (nothing read yet)."""
    raw = Raw(d, rcvbuf=rcvbuf)
    body = json.dumps(message).encode()
    fields = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    raw.send(f"POST /mcp HTTP/1.1\r\nHost: x\r\n{fields}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return raw


def test_unread_answers_under_a_piece_count_against_the_principals_budget(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """docs/REFERENCE.md §1.7 (what the front holds for a client that stopped reading is bounded per principal
    by ``principal_queue_bytes`` and in all by ``total_queue_bytes``), medium: a ``/mcp`` answer
    of up to one piece (256 KiB) goes to the connection in one write and is never charged (only
    larger ones are, piece by piece, and only until their last piece was handed over), and once
    its response is complete the keep-alive timer's close waits to flush it: the connection, its
    answer and its TLS buffers (about 600 KiB in the front's RSS) stay for the TLS shutdown's
    30 s, then the client asks again. One principal with 1024 connections from one address (the
    per-address cap) held about 600 MiB against a budget of 128 MiB, four addresses about 2.4 GiB
    against a total of 512 MiB; ``mcpd_outgoing_bytes`` said 0.
    Fixed: an answer over 64 KiB, once written, is charged what its connection still holds (the
    kernel's send queue included) until it holds no more. Here: eight such answers with a budget
    of 1 MiB; past the budget's four, the connections must be dropped within seconds."""
    port = free_port()
    d = daemon_factory(metrics_listen=f"127.0.0.1:{port}", principal_queue_bytes=MIB,
                       connections={"idle_seconds": 1})
    folder = tmp_path / "files"
    folder.mkdir()
    path = folder / "quarter.txt"
    path.write_bytes((b"y" * 1023 + b"\n") * (SMALL_ANSWER // 1024))
    raws = []
    try:
        for i in range(8):
            raws.append(stalled_small_answer(d, path, i + 1))
        within = MIB // SMALL_ANSWER
        assert until(lambda: sum(server_connections(d, r.port) for r in raws) <= within, 10), \
            f"{sum(server_connections(d, r.port) for r in raws)} unread answers held, budget {within}"
    finally:
        for r in raws:
            r.sock.close()


def test_stalled_principals_filling_the_total_budget_do_not_cut_a_reading_client(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """docs/REFERENCE.md §1.7 (a client that stops reading is disconnected; a client reading at a normal speed
    is served), medium: the total budget is four principals' budgets (128 MiB x 4 = 512 MiB by
    default). Four principals that each stalled one session just within their own budget filled
    it, and from then on every other principal's large answer, charged while its connection was
    behind, passed the total and was cut (``queue_bytes_total``), while the stalled sessions that
    held the bytes kept them, for as long as their clients liked.
    Fixed: past the total, the principal holding the most gives up what it holds, the one
    charging when none other holds more. Here at a 7 MiB / 28 MiB scale: alice, carol, dave
    and erin stall a 6 MiB answer each (about 6.5 MiB held each, 26 MiB in all); bob reads a
    4 MiB answer a second late (its connection holds all of it meanwhile, so the total is passed
    whatever the timing) and must get all of it, a staller being cut instead."""
    d, m, big, _small = daemon_with_metrics(daemon_factory, tmp_path, principal_queue_bytes=7 * MIB,
                                            total_queue_bytes=28 * MIB)
    tokens = {"alice": d.token, **add_dev_principals(d, ["carol", "dave", "erin"])}
    streams: list[Raw] = []
    with httpx.Client(verify=d.ssl_context(), timeout=60) as c:
        try:
            for name, token in tokens.items():
                s, _endpoint, statuses = stall(d, c, big, 1, token=token, m=m)
                streams.append(s)
                assert statuses == [202], (name, statuses)
            # (what is left of the total is well short of what bob's connection will hold)
            assert 28 * MIB - BOB_ANSWER + MIB // 2 < m.outgoing() <= 28 * MIB, m.outgoing()
            message, headers = stateless_read(d, big, 7, d.other_token)
            message["params"]["arguments"]["limit"] = BOB_ANSWER
            done = reads_done(d)
            bob = post_raw(d, message, headers, 64 * 1024)
            streams.append(bob)
            assert until(lambda: reads_done(d) > done, 30), "bob's read was not answered"
            time.sleep(1.0)  # bob reads a second late: his connection holds his answer meanwhile
            status, whole = answer_ends(bob)
            assert status == 200 and len(whole) > BOB_ANSWER, f"bob's answer cut at {len(whole)} bytes"
            assert m.hits("queue_bytes_total") >= 1, "no staller was cut"
        finally:
            for s in streams:
                s.close()


BOB_ANSWER = 4 * MIB  # bytes of text bob reads: less than a staller holds, more than the total leaves


def abandoned_post_stream(d: Daemon, sid: str, big: Path, k: int) -> None:
    """A session-era ``POST /mcp`` batch asking for progress (so answered as an event stream): a
    read that takes seconds, then a 6 MiB read; its client leaves once the stream's headers came,
    before the batch's one reply (about 6 MiB) is ready. Returns once both reads were answered."""
    slow = slow_read(big.parent, f"s{k}")
    slow["params"]["arguments"]["start_line"] = 3 * 10 ** 8  # (a second or so, not the full count)
    slow["params"]["_meta"] = {"progressToken": f"p{k}"}
    done = reads_done(d)
    raw = post_raw(d, [slow, read_call(big, k, progress=True)],
                   {"Authorization": f"Bearer {d.token}", "Accept": "text/event-stream",
                    "Content-Type": "application/json", "Mcp-Session-Id": sid}, 1 << 20)
    raw.until(b"\r\n\r\n")
    raw.sock.close()
    assert until(lambda: reads_done(d) >= done + 2, 120), "the batch's reads were not answered"


def test_a_post_stream_its_client_left_leaves_nothing_charged(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """docs/REFERENCE.md §1.7 (outgoing budgets; nothing grows without bound), high: a session-era POST's
    event stream whose client leaves before its reply is released when the stream ends, but the
    request goes on (in that era leaving is no cancellation) and its reply, put into the ended
    stream, was charged again, and never released: every such POST left its answer's size
    charged to its principal and to the total for the front's life. About 21 abandoned 6 MiB
    answers filled a principal's 128 MiB for good (each of its sessions then cut at its next
    large answer) and about 85 the total 512 MiB, after which every principal's large answers
    were cut. Fixed: an ended stream takes nothing more."""
    d, m, big, small = daemon_with_metrics(daemon_factory, tmp_path)
    with httpx.Client(verify=d.ssl_context(), timeout=60) as c:
        sid = session_of(d, c, version="2025-03-26")["Mcp-Session-Id"]  # (batches end with 2025-06-18)
        for k in range(2):
            abandoned_post_stream(d, sid, big, k)
        assert until(lambda: m.outgoing() == 0, 5), f"{m.outgoing():.0f} bytes still charged for clients that left"
        bob_is_served(d, c, small)


def _unread_post(d: Daemon, sid: str, body: bytes) -> Any:
    """A raw TLS connection with a small receive window that sends one POST /mcp and reads nothing."""
    host, port = d.host_port
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window stays small
    sock.settimeout(30)
    sock.connect((host, port))
    tls: ssl.SSLSocket = d.ssl_context().wrap_socket(sock, server_hostname=host)
    tls.sendall((f"POST /mcp HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {d.token}\r\n"
                 f"Content-Type: application/json\r\nAccept: application/json\r\nMcp-Session-Id: {sid}\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    return tls


def _read_all(tls: Any) -> int:
    """Bytes read until the server ends the connection (or 10 s of silence)."""
    tls.settimeout(10)
    got = 0
    try:
        while chunk := tls.recv(1 << 16):
            got += len(chunk)
    except OSError:
        pass
    return got


@pytest.mark.anyio
async def test_unread_json_answers_are_bounded_like_a_sessions_queue(daemon_factory: Any, tmp_path: Path) -> None:
    """Each POST /mcp answered as JSON (up to the 10 MiB response cap) that its client never reads
    is held by the front until the connection ends: 16 such POSTs made the front hold ~370 MiB.
    docs/REFERENCE.md §1.7 bounds what a client makes the server hold per principal and in total, and
    disconnects a client that stops reading: such answers count
    against the principal's ``principal_queue_bytes`` (here 32 MiB), so 8 unread answers of 9 MiB
    on one session (72 MiB) must not all be delivered in full."""
    d = daemon_factory(principal_queue_bytes=32 * 1024 * 1024)
    big = tmp_path / "big.txt"
    big.write_bytes((b"x" * 99 + b"\n") * (9 * 1024 * 1024 // 100))
    n = 8
    async with client(d) as c:
        sid = await open_session(c, d)
        conns = []
        for i in range(n):
            body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
                "name": "files/read", "arguments": {"path": str(big), "offset": 0, "limit": 9 * 1024 * 1024}}}).encode()
            conns.append(await asyncio.to_thread(_unread_post, d, sid, body))
        try:
            access = d.state_dir / "access.jsonl"
            for _ in range(600):  # until every read is done (its record written)
                done = [json.loads(x) for x in access.read_text().splitlines()] if access.exists() else []
                if sum(1 for r in done if r.get("tool") == "files/read" and r.get("bytes")) >= n:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the reads did not finish")
            r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": "p", "method": "ping"}, headers=hdrs(d, sid))
            assert r.status_code == 200  # the front still answers others meanwhile
            got = [await asyncio.to_thread(_read_all, t) for t in conns]
        finally:
            for t in conns:
                t.close()
    full = sum(1 for g in got if g > 9 * 1024 * 1024)
    assert full < n, f"all {n} unread answers of 9 MiB were held and delivered in full: {got}"
