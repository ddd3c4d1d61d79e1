"""Backpressure of a session's outgoing queue: the room each request whose reply goes to the
session's stream takes before it runs, and the requests waiting for room.

:class:`Backpressure` is the half of :class:`~mcpd.front.sessions.session.Session` that is its
protocol's :class:`~mcpd.front.mcp.session.Room`; the queue it measures, and what writes it, are the
session's. The budgets of outgoing bytes by principal and in all are ``budgets.py``.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcpd.front.sessions.session import StreamOut
    from mcpd.front.sessions.table import SessionManager

#: How many calls that may answer large (``tools/call``, ``resources/read``) a session runs at once
#: with an empty queue: each reserves this fraction of ``session_queue_bytes`` until its answer is
#: queued (:meth:`Backpressure.admit`), so what a session holds stays within its budget plus the
#: answers of the calls it took while it had room (at most this many beyond their reservations).
CALLS_AT_ONCE = 4


class Backpressure:
    """The room of one session (its protocol's :class:`~mcpd.front.mcp.session.Room`).

    A request whose reply goes to this session's stream first takes room (:meth:`admit`) and
    gives it back with its reply (:meth:`deliver`). A session takes requests while what its client
    has not taken plus what the requests it took reserve is under ``queue_bytes``, and their
    number under ``queue_size``; else a request waits for room while its client takes some of the
    stream, and is refused (``-32000``, not run) once its deadline passed with the client taking
    nothing. So a client reading slower than its calls answer slows them down instead of being
    cut. The queue's state read here (``_queue``, ``_queued``, ``_backlog``, ``_out`` ...) and
    :meth:`_put`, :meth:`_measure` are the session's.
    """

    __slots__ = ("_reserved", "_slots", "_waiters")

    # the session's (mcpd.front.sessions.session.Session), read here
    closed: bool
    last_taken: float
    _manager: SessionManager
    _queue: list[bytes]
    _queue_size: int
    _queue_bytes: int
    _queued: int
    _backlog: int
    _out: StreamOut | None

    def __init__(self) -> None:
        # what the requests admitted and not yet answered reserve: bytes, and messages (admit)
        self._reserved = 0
        self._slots = 0
        # requests waiting for room, oldest first (admit); None while none waits
        self._waiters: list[Waiter] | None = None

    def _put(self, message: Any, admitted: bool) -> None:
        """Queue one message (the session's)."""
        raise NotImplementedError

    def _measure(self, out: StreamOut) -> None:
        """Count what the stream holds now (the session's)."""
        raise NotImplementedError

    @property
    def call_cost(self) -> int:
        """Bytes a request that may answer large reserves while it runs: a
        :data:`CALLS_AT_ONCE`-th of ``queue_bytes``."""
        return max(1, self._queue_bytes // CALLS_AT_ONCE)

    @property
    def wait_seconds(self) -> float:
        """How long a request waits for room before it is refused, unless its own deadline is
        longer (``workers.timeout_seconds``)."""
        return self._manager.admit_seconds

    def admit_now(self, cost: int) -> bool:
        """Take room for one request whose reply goes to this stream if there is room now,
        reserving ``cost`` bytes and one message until :meth:`deliver` or :meth:`release` gives
        them back; whether it did.

        There is room while what the client has not taken plus the reservations is under
        ``queue_bytes`` and their messages under ``queue_size``, and no earlier request that
        reserves bytes waits. A request that reserves no bytes (``cost`` 0: its reply is small and
        immediate) needs only what the client has not taken to be under ``queue_bytes``, not the
        reservations of the calls running."""
        if self.closed or (cost and self._waiters):
            return False
        if self._backlog and self._out is not None:
            self._measure(self._out)
        if not self._fits(cost):
            return False
        self._reserved += cost
        self._slots += 1
        return True

    async def admit(self, cost: int, size: int, seconds: float | None = None) -> bool:
        """:meth:`admit_now`, else wait for room, in arrival order, holding the request (``size``:
        about its bytes). Returns ``False`` (nothing reserved) at once when the requests waiting
        would pass ``max_in_flight`` or together hold more than ``max_body_bytes`` (what waits for
        a client that does not read is bounded too); once ``seconds`` (default
        :attr:`wait_seconds`: the request's deadline) passed without room and without the client
        taking anything of its stream (a client that reads, however slowly, makes room in time);
        or when the session was closed meanwhile."""
        if self.admit_now(cost):
            return True
        waiters = self._waiters
        if self.closed or (waiters and (len(waiters) >= self._manager.max_waiting
                                        or sum(w.size for w in waiters) + size > self._manager.waiting_bytes)):
            return False
        loop = asyncio.get_running_loop()
        waiter = Waiter(cost, size, loop.create_future(), self.wait_seconds if seconds is None else seconds)
        if waiters is None:
            waiters = self._waiters = []
        waiters.append(waiter)
        waiter.timer = loop.call_later(waiter.seconds, self._expire, waiter)
        try:
            return await waiter.fut
        except asyncio.CancelledError:
            fut = waiter.fut
            if fut.done() and not fut.cancelled() and fut.result():  # admitted, then cancelled
                self.release(cost)
            raise
        finally:
            if waiter.timer is not None:
                waiter.timer.cancel()
            waiters = self._waiters
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
            if not self._waiters:
                self._waiters = None

    def _expire(self, waiter: Waiter) -> None:
        """``waiter``'s time is up unless the stream took some of the session's messages
        meanwhile (then it waits ``waiter.seconds`` more from then): refuse it. The stream's own
        keep-alive comments count for nothing here: taking them makes no room, and a request
        waiting behind calls that hang would otherwise wait for ever, never answered."""
        waiter.timer = None
        if waiter.fut.done():
            return
        again = self.last_taken + waiter.seconds - time.monotonic()
        if again > 0 and not self.closed:
            waiter.timer = asyncio.get_running_loop().call_later(again, self._expire, waiter)
            return
        waiter.fut.set_result(False)

    def deliver(self, message: Any, cost: int | None) -> None:
        """Queue ``message``, the reply of a request :meth:`admit` took (``cost``: what it
        reserved, given back now; ``None``: it reserved nothing, a refusal for want of room).
        Unlike :meth:`send`, a reply is always queued: the room it needs was taken."""
        self._put(message, True)
        if cost is not None:
            self.release(cost)

    def release(self, cost: int) -> None:
        """Give back what :meth:`admit` reserved (``cost`` bytes, one message) for a request
        answered without a reply to this stream (a notification, a cancelled request)."""
        self._reserved -= cost
        self._slots -= 1
        if self._waiters:
            self._grant()

    def _fits(self, cost: int) -> bool:
        """Whether a request reserving ``cost`` bytes may be admitted now (:meth:`admit`)."""
        if self.closed or len(self._queue) + self._slots >= self._queue_size:
            return False
        return self._queued + (self._reserved if cost else 0) < self._queue_bytes

    def _grant(self) -> None:
        """Admit the waiting requests that fit now, oldest first."""
        waiters = self._waiters
        if not waiters:
            return
        if self._backlog and self._out is not None:
            self._measure(self._out)
        left = []
        for waiter in waiters:
            if waiter.fut.done():  # (refused: its waiter removes nothing more)
                continue
            if self._fits(waiter.cost):
                self._reserved += waiter.cost
                self._slots += 1
                waiter.fut.set_result(True)
            else:
                left.append(waiter)
        self._waiters = left or None


class Waiter:
    """A request waiting for room (:meth:`Backpressure.admit`): the bytes it reserves, about the
    bytes it holds meanwhile, the future set ``True`` once it is admitted (``False``: refused),
    how long it may wait without the client taking anything, and the timer that looks again then."""

    __slots__ = ("cost", "size", "fut", "seconds", "timer")

    def __init__(self, cost: int, size: int, fut: asyncio.Future[bool], seconds: float) -> None:
        self.cost, self.size, self.fut, self.seconds = cost, size, fut, seconds
        self.timer: asyncio.TimerHandle | None = None

