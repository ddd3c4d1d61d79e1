"""The connection protocol's lean parts (mcpd/front/connections/lean.py) keep the rules of what they replace:
:class:`Waiters` behaves as ``asyncio.Event``, :class:`Pipeline` pops the oldest request first as
uvicorn's deque does, :class:`LeanFlowControl` holds a writer back while the transport asks for a
pause and lets it go on resume."""

from __future__ import annotations

import asyncio

import pytest

from mcpd.front.connections.lean import LeanFlowControl, Pipeline, Waiters

pytestmark = pytest.mark.anyio


async def test_waiters_wake_every_waiter_on_set_and_wait_again_after_clear() -> None:
    ev = Waiters()
    assert not ev.is_set()
    waiting = [asyncio.ensure_future(ev.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiting)
    ev.set()
    assert await asyncio.wait_for(asyncio.gather(*waiting), 5) == [True, True, True]
    assert await asyncio.wait_for(ev.wait(), 5) is True  # set: at once
    ev.clear()
    late = asyncio.ensure_future(ev.wait())
    await asyncio.sleep(0.01)
    assert not late.done()
    ev.set()
    assert await asyncio.wait_for(late, 5) is True


async def test_a_cancelled_wait_leaves_no_waiter_behind() -> None:
    ev = Waiters()
    w = asyncio.ensure_future(ev.wait())
    await asyncio.sleep(0)
    w.cancel()
    with pytest.raises(asyncio.CancelledError):
        await w
    assert not ev._waiters  # the cancelled wait took its future with it
    ev.set()  # nothing left to wake, nothing raised
    assert ev.is_set()


def test_the_pipeline_gives_the_oldest_request_first() -> None:
    p = Pipeline()
    assert not p
    for item in ("first", "second", "third"):
        p.appendleft(item)
    assert [p.pop(), p.pop(), p.pop()] == ["first", "second", "third"]
    assert not p


class _Transport:
    """Records what flow control asks of the transport (uvloop's transport is not needed here)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause_reading")

    def resume_reading(self) -> None:
        self.calls.append("resume_reading")


async def test_flow_control_holds_a_writer_while_paused_and_lets_it_go_on_resume() -> None:
    t = _Transport()
    flow = LeanFlowControl(t)  # type: ignore[arg-type]
    await asyncio.wait_for(flow.drain(), 5)  # never paused: at once
    flow.pause_writing()
    assert flow.write_paused
    draining = asyncio.ensure_future(flow.drain())
    await asyncio.sleep(0.01)
    assert not draining.done()
    flow.resume_writing()
    await asyncio.wait_for(draining, 5)
    assert not flow.write_paused
    await asyncio.wait_for(flow.drain(), 5)
    flow.pause_reading()
    flow.pause_reading()
    flow.resume_reading()
    assert t.calls == ["pause_reading", "resume_reading"]
