"""A session's backpressure (:class:`mcpd.front.sessions.session.Session` as the protocol's
``Room``): what takes room, what waits for it and how long, what a wait may hold, and when a
client counts as one that stopped reading.

The daemon-level cases (24 parallel 5 MiB reads, a client that stops reading, batches) are in
``tests/integration/test_backpressure.py``; here the rules, on real sessions in one event loop,
their streams an ASGI ``send`` that never returns (a client that reads nothing)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mcpd.common.config import Config, Workers
from mcpd.common.identity import Principal
from mcpd.front.mcp.dispatcher import Dispatcher
from mcpd.front.sessions.session import Session
from mcpd.front.sessions.table import SessionManager
from mcpd.front.transport.body import BodyRefused, parse_json
from mcpd.front.transport.stream import AsgiStream
from tests.support.envelope import BODY, CALLER, SCALAR, SETTINGS, VALUE
from tests.support.fuzzgen import answered, dump, strict

KIB = 1024


def session_of(**cfg: Any) -> tuple[SessionManager, Session, asyncio.Event]:
    """A session whose stream's client reads nothing (its ``send`` never returns)."""
    m = SessionManager(Config(**cfg), Dispatcher(pool=None, privileged=None))  # type: ignore[arg-type]
    session = m.open(Principal("alice", "alice", "t1"))
    never = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        await never.wait()

    session.attach(AsgiStream(send, None), None)
    return m, session, never


def reply(rid: int, size: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": {"text": "x" * size}}


def test_large_calls_take_a_quarter_of_the_queue_each_and_small_requests_pass() -> None:
    """Four calls that may answer large fill the room of an empty queue (each reserves a quarter
    of ``session_queue_bytes``); a fifth waits. A request reserving nothing (a ping) needs only
    the bytes the client has not taken to be under the budget, so it passes them. A call given
    back makes room for the next."""
    async def go() -> None:
        _m, session, never = session_of(session_queue_bytes=100 * KIB)
        cost = session.call_cost
        assert cost == 25 * KIB
        assert all(session.admit_now(cost) for _ in range(4))
        assert not session.admit_now(cost)
        assert session.admit_now(0)
        session.release(0)
        session.release(cost)
        assert session.admit_now(cost)
        session.close()
        never.set()

    asyncio.run(go())


def test_a_queue_holding_its_budget_takes_nothing_until_its_client_reads() -> None:
    """Once what the client has not taken reaches ``session_queue_bytes`` (here a 120 KiB answer
    delivered to a client that reads nothing), no request is admitted, not even one reserving
    nothing; the session is then full (``pressed``)."""
    async def go() -> None:
        _m, session, never = session_of(session_queue_bytes=100 * KIB)
        assert session.admit_now(session.call_cost)
        session.deliver(reply(1, 120 * KIB), session.call_cost)
        await asyncio.sleep(0)  # (the writer takes the event and waits on the stream)
        assert session.held() > 100 * KIB and session.pressed()
        assert not session.admit_now(0) and not session.admit_now(session.call_cost)
        session.close()
        never.set()

    asyncio.run(go())


def test_what_waits_for_room_is_bounded_in_count_and_bytes() -> None:
    """Requests waiting for room hold their parsed bodies: at most ``max_in_flight`` of them wait
    in one session, holding at most ``max_body_bytes`` together; past either a request is refused
    at once. Closing the session refuses those that wait."""
    async def go() -> None:
        _m, session, never = session_of(session_queue_bytes=100 * KIB, max_in_flight=3, max_body_bytes=10 * KIB,
                                        workers=Workers(timeout_seconds=30))
        cost = session.call_cost
        for _ in range(4):
            assert session.admit_now(cost)
        waiting = [asyncio.ensure_future(session.admit(cost, KIB)) for _ in range(3)]
        await asyncio.sleep(0)
        assert not any(w.done() for w in waiting)
        assert await asyncio.wait_for(session.admit(cost, KIB), 1) is False  # a fourth: past max_in_flight
        session.release(cost)  # one waiter is admitted
        await asyncio.sleep(0)
        assert [w.done() for w in waiting] == [True, False, False] and waiting[0].result() is True
        assert await asyncio.wait_for(session.admit(cost, 9 * KIB), 1) is False  # 2 + 9 KiB > 10 KiB
        small = asyncio.ensure_future(session.admit(cost, 8 * KIB))  # 2 + 8 KiB: waits
        await asyncio.sleep(0)
        assert not small.done()
        session.close()
        assert await asyncio.wait_for(asyncio.gather(*waiting[1:], small), 1) == [False, False, False]
        never.set()

    asyncio.run(go())


def test_a_wait_ends_after_its_deadline_only_while_the_client_takes_nothing() -> None:
    """A request waiting for room is refused once its deadline (``workers.timeout_seconds``, here
    0.3 s) passed with the stream taking nothing; while the stream takes something now and then
    (a client reading slowly) it waits on, and is admitted once room comes."""
    async def go() -> None:
        _m, session, never = session_of(session_queue_bytes=100 * KIB, workers=Workers(timeout_seconds=0.3))
        cost = session.call_cost
        for _ in range(4):
            assert session.admit_now(cost)
        started = time.monotonic()
        assert await asyncio.wait_for(session.admit(cost, KIB), 5) is False
        assert time.monotonic() - started >= 0.3
        patient = asyncio.ensure_future(session.admit(cost, KIB))
        for _ in range(8):  # 1.2 s, four deadlines, the stream taking something every 0.15 s
            await asyncio.sleep(0.15)
            session.last_taken = time.monotonic()
        assert not patient.done()
        session.release(cost)
        assert await asyncio.wait_for(patient, 1) is True
        session.close()
        never.set()

    asyncio.run(go())


def test_keep_alive_comments_never_keep_a_wait_for_room_going() -> None:
    """A request waiting for the room that four running calls hold (calls that hang) is refused
    once its deadline (here 0.3 s) passed, though its client reads every keep-alive comment the
    stream sends meanwhile: taking those makes no room, and the request must be answered within
    its deadline, not wait for as long as the client stays connected."""
    async def go() -> None:
        m = SessionManager(Config(session_queue_bytes=100 * KIB, workers=Workers(timeout_seconds=0.3)),
                           Dispatcher(pool=None, privileged=None))  # type: ignore[arg-type]
        session = m.open(Principal("alice", "alice", "t1"))
        body = bytearray()

        async def send(message: dict[str, Any]) -> None:  # a client that reads everything
            body.extend(message.get("body", b""))

        session.attach(AsgiStream(send, None), None)
        cost = session.call_cost
        for _ in range(4):
            assert session.admit_now(cost)
        waiting = asyncio.ensure_future(session.admit(cost, KIB))
        for _ in range(12):  # 1.2 s, four deadlines, a keep-alive comment every 0.1 s
            await asyncio.sleep(0.1)
            session.ping()
            if waiting.done():
                break
        assert waiting.done() and waiting.result() is False
        assert body.count(b": ping") >= 2  # the client took the comments
        session.close()

    asyncio.run(go())


def test_a_client_is_stalled_only_with_its_queue_full_and_nothing_taken_for_the_timeout() -> None:
    """``stalled``: the queue holds its budget and the stream took nothing for more than the
    timeout. Not while requests only wait for the room the session's running calls reserve (the
    client has nothing to take), nor once the stream took something lately."""
    async def go() -> None:
        _m, session, never = session_of(session_queue_bytes=100 * KIB)
        cost = session.call_cost
        for _ in range(4):
            assert session.admit_now(cost)
        waiter = asyncio.ensure_future(session.admit(cost, KIB))
        await asyncio.sleep(0)
        later = time.monotonic() + 10
        assert not session.stalled(later, 5), "nothing to take: not stalled"
        session.deliver(reply(1, 120 * KIB), cost)  # the client takes none of it
        await asyncio.sleep(0)
        assert session.stalled(later, 5)
        assert not session.stalled(time.monotonic(), 5), "it took something lately"
        session.close()
        assert await waiter is False
        never.set()

    asyncio.run(go())


def exchange_through_room(payload: Any) -> list[Any]:
    """``payload`` handed to a real session's protocol, its replies taking room in the session
    (the ``/sse`` path), read off its stream by a client that reads everything."""
    async def go() -> list[Any]:
        m = SessionManager(Config(), Dispatcher(pool=None, privileged=None))  # type: ignore[arg-type]
        session = m.open(Principal("alice", "alice", "t1"))
        body = bytearray()

        async def send(message: dict[str, Any]) -> None:
            body.extend(message.get("body", b""))

        session.attach(AsgiStream(send, None), None)
        task = session.protocol.receive(payload, CALLER)
        if task is not None:
            await asyncio.wait_for(task, 10)
        for _ in range(5):  # (the writer task writes what is queued)
            await asyncio.sleep(0)
        session.close()
        events = bytes(body).split(b"\n\n")
        return [strict(e.split(b"data: ", 1)[1].decode("utf-8")) for e in events if b"data: " in e]

    return asyncio.run(go())


#: The envelope's bodies, and requests whose method is any JSON value (a list or an object too).
ODD_METHOD = st.builds(lambda rid, method: {"jsonrpc": "2.0", "id": rid, "method": method}, SCALAR, VALUE)
ROOM_BODY = st.one_of(BODY, ODD_METHOD, st.lists(ODD_METHOD, min_size=1, max_size=3))


@SETTINGS
@given(body=ROOM_BODY)
def test_through_the_room_every_request_gets_exactly_one_reply(body: Any) -> None:
    """The envelope's property (every request exactly one reply, a batch one array, nothing for
    notifications and client responses) holds when replies take room in the session first, for
    messages of every shape (a method that is not a string, a batch of anything)."""
    try:
        payload = parse_json(dump(body).encode("utf-8", "surrogatepass"))
    except BodyRefused:
        return
    replies = exchange_through_room(payload)
    if isinstance(payload, list):
        want = [m for m in payload if answered(m)] if payload else [None]
        if not want:
            assert replies == []
            return
        assert len(replies) == 1, replies
        got = replies[0] if payload else [replies[0]]
        assert isinstance(got, list) and len(got) == len(want), (got, want)
    else:
        assert len(replies) == (1 if answered(payload) else 0), (payload, replies)
