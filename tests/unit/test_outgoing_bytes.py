"""The budgets of outgoing bytes (:class:`mcpd.front.sessions.budgets.OutgoingBytes`): per session
(``session_queue_bytes``, now counting the event being written), per principal and in total.

The daemon-level attacks are in ``tests/integration/test_outgoing_budgets.py``; here the total
budget, which those leave at its default, with sessions whose stream is an ASGI ``send`` that never
returns (a client that stopped reading)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from mcpd.common import wirejson
from mcpd.common.config import Config
from mcpd.common.identity import Principal
from mcpd.front import metrics
from mcpd.front.mcp.dispatcher import Dispatcher
from mcpd.front.mcp.jsonrpc import RpcError
from mcpd.front.sessions import budgets
from mcpd.front.sessions.budgets import OutgoingBytes
from mcpd.front.sessions.session import Session
from mcpd.front.sessions.table import SessionManager
from mcpd.front.transport.stream import AsgiStream

KIB = 1024


def test_charges_add_up_by_principal_and_in_all_and_release() -> None:
    budget = OutgoingBytes(per_principal=100, total=150)
    assert budget.charge("alice", 60) is None
    assert budget.charge("bob", 60) is None
    assert budget.charge("alice", 50) == "queue_bytes_per_principal"  # 110 > 100
    assert budget.charge("alice", -50) is None
    assert budget.charge("bob", 40) == "queue_bytes_total"  # bob 100, all 160 > 150
    assert budget.charge("bob", -40) is None  # a release never refuses
    assert (budget.held("alice"), budget.held("bob"), budget.total) == (60, 60, 120)
    budget.charge("alice", -60)
    budget.charge("bob", -60)
    assert (budget.held("alice"), budget.total) == (0, 0)


def hits(kind: str) -> float:
    return metrics.REGISTRY.get_sample_value("mcpd_limits_hit_total", {"limit": kind}) or 0.0


def stalled(m: SessionManager, name: str) -> tuple[Session, asyncio.Event]:
    """A session of ``name`` whose stream's client reads nothing: its send never returns."""
    session = m.open(Principal(name, name, "t1"))
    never = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        await never.wait()

    session.attach(AsgiStream(send, None), None)
    return session, never


def test_past_the_total_budget_the_principal_holding_the_most_gives_up_its_bytes() -> None:
    """Two principals' sessions stall behind 64 KiB messages, the total budget 320 KiB (each
    principal's 1 MiB): the writer's event counts from the first message on (it is not taken).
    Alice holds three; bob's second passes the total: alice, holding more, is closed and her bytes
    released, bob's session keeps its. Then alice stalls one again and bob's fifth passes the
    total: bob holds the most, so his session is the one closed."""
    async def go() -> None:
        m = SessionManager(Config(principal_queue_bytes=1024 * KIB, total_queue_bytes=320 * KIB),
                           Dispatcher(pool=None, privileged=None))  # type: ignore[arg-type]
        alice, _ = stalled(m, "alice")
        bob, _ = stalled(m, "bob")
        message = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x" * (64 * KIB)}}
        before = hits("queue_bytes_total")
        for _ in range(3):
            alice.send(message)
            await asyncio.sleep(0)  # the writer takes one and waits on the stream: still counted
        assert m.outgoing.held("alice") >= 3 * 64 * KIB and not alice.closed
        for _ in range(2):
            bob.send(message)
            await asyncio.sleep(0)
        assert alice.closed and not bob.closed  # bob's second passed 320 KiB in all; alice held more
        assert hits("queue_bytes_total") == before + 1
        assert m.outgoing.held("alice") == 0 and m.outgoing.total == m.outgoing.held("bob") == bob.held()
        again, _ = stalled(m, "alice")
        again.send(message)
        await asyncio.sleep(0)
        for _ in range(3):
            bob.send(message)
            await asyncio.sleep(0)
        assert bob.closed and not again.closed  # bob's fifth passed the total, bob holding the most
        assert hits("queue_bytes_total") == before + 2
        assert m.outgoing.held("bob") == 0 and m.outgoing.total == m.outgoing.held("alice") == again.held()
        m.close_all()
        assert m.outgoing.total == 0

    asyncio.run(go())


class Connection:
    """A stream's connection as the session sees it (:class:`~mcpd.front.sessions.session.StreamOut`):
    it takes writes until it holds ``limit`` bytes the client has not read; ``read()`` is the
    client reading everything."""

    def __init__(self, limit: int) -> None:
        self.limit, self.buffered, self.ended = limit, 0, False

    def writable(self) -> bool:
        return self.buffered < self.limit

    def write(self, data: bytes) -> None:
        self.buffered += len(data)

    def held(self) -> int:
        return self.buffered

    def read(self) -> None:
        self.buffered = 0

    async def send(self, data: bytes) -> None:
        self.write(data)

    def end(self) -> None:
        self.ended = True

    async def finish(self) -> None:
        self.end()

    def abort(self) -> None:
        self.ended = True


def two_streams() -> tuple[SessionManager, Session, Session, list[Connection], dict[str, Any]]:
    """Two sessions of alice, each with a stream whose connection takes 64 KiB unread (her
    budget 3 MiB, ``keepalive_seconds`` 4), and a 2 MiB message."""
    m = SessionManager(Config(principal_queue_bytes=3 * 1024 * KIB, keepalive_seconds=4),
                       Dispatcher(pool=None, privileged=None))  # type: ignore[arg-type]
    message = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x" * (2048 * KIB)}}
    first, second = (m.open(Principal("alice", "alice", "t1")) for _ in range(2))
    conns = [Connection(64 * KIB), Connection(64 * KIB)]
    first.attach(conns[0], None)
    second.attach(conns[1], None)
    return m, first, second, conns, message


def test_what_a_stream_no_longer_holds_is_not_held_against_its_principal() -> None:
    """Alice's first session wrote a 2 MiB answer its client then read; her second writes one
    too, with her budget at 3 MiB: the first stream is measured again before the second session
    is judged, so it stays open; the keep-alive ticker measures them again as well."""
    async def go() -> None:
        m, first, second, conns, message = two_streams()
        first.send(message)
        assert m.outgoing.held("alice") > 2048 * KIB  # the connection holds it all: the client is behind
        conns[0].read()
        second.send(message)
        assert not second.closed and not first.closed
        assert m.outgoing.held("alice") == conns[1].held()
        conns[1].read()
        m.keep_alive()
        assert m.outgoing.total == 0
        m.close_all()

    asyncio.run(go())


def test_an_answer_its_connection_has_not_taken_counts_against_its_principal_not_its_session() -> None:
    """``SessionManager.hold_answer`` (a ``/mcp`` answer written in pieces, while its client is
    behind): answers add up against the principal's budget (and the total), never against a
    session's ``session_queue_bytes`` (each has a connection of its own, and several large answers
    read at once on one session are normal); releasing leaves nothing counted."""
    m = SessionManager(Config(session_queue_bytes=100 * KIB, principal_queue_bytes=300 * KIB,
                              total_queue_bytes=500 * KIB), Dispatcher(pool=None, privileged=None))  # type: ignore[arg-type]
    m.open(Principal("alice", "alice", "t1"), kind="mcp")
    assert m.hold_answer("alice", 150 * KIB) is None  # over session_queue_bytes: no session bound here
    assert m.hold_answer("alice", 140 * KIB) is None
    assert m.hold_answer("alice", 20 * KIB) == "queue_bytes_per_principal"  # 310 KiB > 300 KiB
    m.hold_answer("alice", -20 * KIB)
    assert m.hold_answer("bob", 200 * KIB) is None  # bob's budget is his own
    assert m.hold_answer("carol", 20 * KIB) == "queue_bytes_total"  # 290 + 200 + 20 > 500 KiB
    m.hold_answer("carol", -20 * KIB)
    for name, size in (("alice", 150 * KIB), ("alice", 140 * KIB), ("bob", 200 * KIB)):
        m.hold_answer(name, -size)
    m.close_all()
    assert m.outgoing.total == 0 and m.outgoing.held("alice") == m.outgoing.held("bob") == 0


def test_a_stream_its_client_caught_up_on_is_released_by_its_keep_alive_comment() -> None:
    """Attack 13c (accounting drift, low): a session wrote a 2 MiB answer its client was behind
    on (counted), the client then read it all, and the stream's next write was the keep-alive
    ticker's ``: ping`` comment. Writing it found the stream taking writes again and dropped the
    stream's backlog from the session's bytes, but charged the change to no budget, and later
    ticks and :meth:`SessionManager.still_over` measured only streams with a backlog: the 2 MiB
    stayed held against alice's (and the total) budget for as long as the session stayed idle,
    closing her other sessions early and, added up over principals, anyone's."""
    async def go() -> None:
        m, first, second, conns, message = two_streams()
        first.send(message)
        assert m.outgoing.held("alice") > 2048 * KIB
        conns[0].read()
        _, pinged = m.keep_alive(now=first.last_write + 5)  # the comment is due: written at once
        assert pinged >= 1 and conns[0].held() > 0
        conns[0].read()
        m.keep_alive(now=first.last_write + 1)  # not due: nothing written
        assert m.outgoing.total == 0, m.outgoing.total
        second.send(message)  # fits her budget: the first's answer went out
        assert not second.closed and not first.closed
        m.close_all()
        assert m.outgoing.total == 0

    asyncio.run(go())


class AnswerConn:
    """A ``/mcp`` answer's connection as the manager sees it (``AnswerConnection``): it holds
    ``unsent`` bytes its client has not taken; ``abort()`` drops it (it then holds nothing)."""

    def __init__(self, unsent: int) -> None:
        self.held, self.aborted = unsent, False

    def unsent(self) -> int:
        return self.held

    def abort(self) -> None:
        self.aborted, self.held = True, 0


def test_a_written_answer_counts_what_its_connection_still_holds_until_it_holds_no_more() -> None:
    """``SessionManager.keep_answer`` (a ``/mcp`` answer written whole, its connection still
    holding some of it, the kernel's queue included): more than 64 KiB held is charged, measured
    again by the keep-alive ticker, and forgotten once its client took all but 64 KiB; the answer
    passing its principal's budget is refused (its caller drops it), nothing of it kept."""
    async def go() -> None:
        m = SessionManager(Config(principal_queue_bytes=1024 * KIB, total_queue_bytes=4096 * KIB),
                           Dispatcher(pool=None, privileged=None))  # type: ignore[arg-type]
        assert m.keep_answer("alice", AnswerConn(64 * KIB)) is None and m.outgoing.total == 0  # a reader
        conns = [AnswerConn(300 * KIB) for _ in range(4)]
        assert [m.keep_answer("alice", c) for c in conns[:3]] == [None] * 3
        assert m.outgoing.held("alice") == 900 * KIB
        assert m.keep_answer("alice", conns[3]) == "queue_bytes_per_principal"  # 1200 KiB > 1 MiB
        assert m.outgoing.held("alice") == 900 * KIB
        conns[0].held = 100 * KIB  # its client read some
        conns[1].held = 10 * KIB  # and this one nearly all
        m.keep_alive()
        assert m.outgoing.held("alice") == 400 * KIB
        assert m.keep_answer("alice", conns[3]) is None  # fits now
        conns[0].held = conns[2].held = conns[3].held = 0
        m.keep_alive()
        assert m.outgoing.total == 0
        m.close_all()

    asyncio.run(go())


def test_past_the_total_the_kept_answers_of_the_principal_holding_the_most_are_dropped() -> None:
    """The total's rule with kept answers: alice's two stalled answers (600 KiB) and carol's
    (300 KiB) fill most of a 1 MiB total; bob's 200 KiB answer passes it: alice's connections are
    dropped (each counted in ``limits_hit``) and bob's kept, carol's untouched."""
    async def go() -> None:
        m = SessionManager(Config(principal_queue_bytes=1024 * KIB, total_queue_bytes=1024 * KIB),
                           Dispatcher(pool=None, privileged=None))  # type: ignore[arg-type]
        alice = [AnswerConn(300 * KIB), AnswerConn(300 * KIB)]
        carol, bob = AnswerConn(300 * KIB), AnswerConn(200 * KIB)
        for conn in alice:
            assert m.keep_answer("alice", conn) is None
        assert m.keep_answer("carol", carol) is None
        before = hits("queue_bytes_total")
        assert m.keep_answer("bob", bob) is None
        assert all(c.aborted for c in alice) and not carol.aborted and not bob.aborted
        assert hits("queue_bytes_total") == before + 2
        assert (m.outgoing.held("alice"), m.outgoing.total) == (0, 500 * KIB)
        bob.held = carol.held = 0
        m.keep_alive()
        assert m.outgoing.total == 0
        m.close_all()

    asyncio.run(go())


def test_answers_reserve_their_room_in_order_and_are_refused_when_none_moves() -> None:
    """Room for an answer before it is made (:meth:`SessionManager.reserve`), principal budget
    400 KiB: a small answer reserves nothing; two of 128 KiB fit, one of 256 KiB waits, and one of
    100 KiB behind it waits its turn though it would fit; each is given room as the answers before
    it are written; an answer over the budget is refused at once; and a wait during which none of
    the principal's answers moves ends in a refusal, nothing reserved. What is reserved never
    counts for the cut rule (``outgoing``)."""
    async def go() -> None:
        m = SessionManager(Config(principal_queue_bytes=400 * KIB), Dispatcher(pool=None, privileged=None))  # type: ignore[arg-type]
        assert await m.reserve("alice", 60 * KIB, 5) == 0
        first = await m.reserve("alice", 128 * KIB, 5)
        second = await m.reserve("alice", 128 * KIB, 5)
        assert first == second == 128 * KIB and m.answering.held("alice") == 256 * KIB
        assert m.outgoing.held("alice") == 0
        third = asyncio.ensure_future(m.reserve("alice", 256 * KIB, 5))
        await asyncio.sleep(0)
        fourth = asyncio.ensure_future(m.reserve("alice", 100 * KIB, 5))
        assert await m.reserve("bob", 128 * KIB, 5) == 128 * KIB  # (bob's budget is his own)
        await asyncio.sleep(0.05)
        assert not third.done() and not fourth.done()
        m.unreserve("alice", first)  # (handed over, and written)
        assert await third == 256 * KIB
        await asyncio.sleep(0.05)
        assert not fourth.done()
        m.unreserve("alice", second)
        assert await fourth == 100 * KIB
        try:
            await m.reserve("alice", 401 * KIB, 5)
        except RpcError as exc:
            assert exc.code == -32000 and exc.data == {"size": 401 * KIB, "limit": 400 * KIB}
        else:
            raise AssertionError("an answer larger than the budget was given room")
        before, budgets.STALL_SECONDS = budgets.STALL_SECONDS, 0.2
        try:
            started = asyncio.get_running_loop().time()
            try:
                await m.reserve("alice", 128 * KIB, 5)
            except RpcError as exc:
                assert exc.code == -32000 and "principal_queue_bytes" in exc.message
            else:
                raise AssertionError("a wait with nothing moving was given room")
            assert asyncio.get_running_loop().time() - started < 2
        finally:
            budgets.STALL_SECONDS = before
        assert m.answering.held("alice") == 356 * KIB

    asyncio.run(go())


def test_a_value_encoded_once_is_spliced_whole_in_either_encoder() -> None:
    """An :class:`~mcpd.common.wirejson.Embedded` value reads back as the value it holds, inside a
    message orjson writes and inside one it refuses (an id over 64 bits, a lone surrogate), with
    its line breakers still escaped."""
    value = {"matches": ["/a\u2028b", "é", 2 ** 40], "n": 3}
    held = wirejson.embedded(value)
    for rid in (7, 2 ** 70, "\udc80"):
        data = wirejson.dumps_line({"jsonrpc": "2.0", "id": rid, "result": {"structuredContent": held, "x": [held]}})
        assert b"\xe2\x80\xa8" not in data
        back = json.loads(data)
        assert back["id"] == rid and back["result"] == {"structuredContent": value, "x": [value]}
