"""Closed sessions give their memory back (issue "hostile load"): once enough sessions were closed
and closing has paused, the front collects the cycles closed streams leave and trims the C heap
(:meth:`mcpd.front.sessions.table.SessionManager.give_back_memory`). The figures are measured by
``tests/bench/bench_idle_sessions.py``; this checks when it happens, and that a stream whose writing
fails does not stay behind."""

from __future__ import annotations

import asyncio
import time

from mcpd.common.config import Config
from mcpd.common.identity import Principal
from mcpd.front.mcp.dispatcher import Dispatcher
from mcpd.front.sessions.table import TRIM_AFTER, TRIM_QUIET, SessionManager
from mcpd.front.transport.stream import SessionStream


def manager() -> SessionManager:
    return SessionManager(Config(max_sessions=1000, max_sessions_per_principal=1000),
                          Dispatcher(pool=None, privileged=None))  # type: ignore[arg-type]


def close_many(m: SessionManager, count: int) -> float:
    sessions = [m.open(Principal("alice", "alice", "t1")) for _ in range(count)]
    for s in sessions:
        m.close(s)
    return time.monotonic()


def test_memory_is_given_back_once_enough_sessions_closed_and_closing_paused() -> None:
    m = manager()
    last = close_many(m, TRIM_AFTER)
    assert not m.give_back_memory(now=last)  # still closing: not yet
    assert m.give_back_memory(now=last + TRIM_QUIET)  # paused: collected and trimmed
    assert not m.give_back_memory(now=last + 10)  # nothing closed since


def test_a_few_closes_do_not_trim_and_a_steady_stream_of_closes_still_does() -> None:
    m = manager()
    last = close_many(m, TRIM_AFTER - 1)
    assert not m.give_back_memory(now=last + 10)
    last = close_many(m, 8 * TRIM_AFTER)
    assert m.give_back_memory(now=last)  # however busy, after 8 * TRIM_AFTER closes


def test_a_stream_whose_writing_fails_is_closed_and_its_task_ended() -> None:
    """A ``send`` that raises (the server's, broken) neither leaves the session open nor its
    stream waiting: the session is closed and the stream's task ends."""
    async def go() -> tuple[bool, bool, int]:
        m = manager()
        session = m.open(Principal("alice", "alice", "t1"))
        gone = asyncio.Event()

        async def receive() -> dict[str, object]:
            await gone.wait()  # the client never leaves
            return {"type": "http.disconnect"}

        async def send(message: dict[str, object]) -> None:
            if message["type"] == "http.response.body":
                raise RuntimeError("broken server")

        stream = SessionStream(session, m, "/message?session_id=" + session.id)
        task = asyncio.ensure_future(stream({"type": "http", "method": "GET"}, receive, send))
        done, _ = await asyncio.wait({task}, timeout=10)
        return bool(done) and task.cancelled(), session.closed, len(m)

    ended, closed, left = asyncio.run(go())
    assert ended and closed and left == 0
