"""The budgets of outgoing bytes (:class:`mcpd.front.transport.sse.OutgoingBytes`): per session
(``session_queue_bytes``, now counting the event being written), per principal and in total.

The daemon-level attacks are in ``tests/integration/test_outgoing_budgets.py``; here the total
budget, which those leave at its default, with sessions whose stream is an ASGI ``send`` that never
returns (a client that stopped reading)."""

from __future__ import annotations

import asyncio
from typing import Any

from mcpd.common.config import Config
from mcpd.common.identity import Principal
from mcpd.front import metrics
from mcpd.front.protocol import Dispatcher
from mcpd.front.transport.sse import AsgiStream, OutgoingBytes, SessionManager, SseSession

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


def stalled(m: SessionManager, name: str) -> tuple[SseSession, asyncio.Event]:
    """A session of ``name`` whose stream's client reads nothing: its send never returns."""
    session = m.open(Principal(name, name, "t1"))
    never = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        await never.wait()

    session.attach(AsgiStream(send, None), None)
    return session, never


def test_the_session_passing_the_total_budget_is_closed_and_its_bytes_released() -> None:
    """Two principals' sessions stall behind 64 KiB messages, the total budget 320 KiB (each
    principal's 1 MiB): the writer's event counts from the first message on (it is not taken), and
    the session whose message passes the total is closed, its bytes released; the other keeps its."""
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
        for _ in range(3):
            bob.send(message)
            await asyncio.sleep(0)
        assert bob.closed and not alice.closed  # bob's third passed 320 KiB in all
        assert hits("queue_bytes_total") == before + 1
        assert m.outgoing.held("bob") == 0 and m.outgoing.total == m.outgoing.held("alice") == alice.held()
        m.close_all()
        assert m.outgoing.total == 0

    asyncio.run(go())
