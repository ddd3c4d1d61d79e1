"""One session of the front, of either transport (``GET /sse`` or ``/mcp``): its owner, its
:class:`~mcpd.front.mcp.session.McpSession`, its bounded queue of outgoing events and the writer
that writes them to its GET stream while one is attached.

The room its requests take in that queue is :class:`~mcpd.front.sessions.backpressure.Backpressure`,
its base; the table of sessions, and the budgets of outgoing bytes by principal and in all that
every session charges, are ``table.py`` and ``budgets.py``. The stream's HTTP side (the response,
the ASGI writer) is ``mcpd.front.transport.stream``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from mcpd.common.identity import Principal
from mcpd.front import metrics
from mcpd.front.connections.handover import UNSEEN
from mcpd.front.events import PING, endpoint_event, message_event
from mcpd.front.mcp.dispatcher import Dispatcher
from mcpd.front.mcp.session import McpSession
from mcpd.front.sessions.backpressure import Backpressure
from mcpd.front.sessions.budgets import FULL

if TYPE_CHECKING:
    from mcpd.front.sessions.table import SessionManager

log = logging.getLogger(__name__)


class Session(Backpressure):
    """One session: owner, bounded outgoing queue, and its :class:`McpSession` (docs/REFERENCE.md §1.4).

    While a GET stream is attached (:meth:`attach`), queued messages are written to it by a
    short-lived writer task, started when something is queued and ended when the queue is empty:
    an idle session holds no task, timer or event of its own (its keep-alive comments come from
    the manager's one ticker, :meth:`SessionManager.keep_alive`). A client that takes nothing for
    ``connections.idle_seconds`` while its queue is full (:meth:`stalled`) is disconnected.

    Args:
        session_id: 32 lowercase hex digits.
        principal: the owner; requests from anyone else get 404.
        queue_size: outgoing messages buffered (``session_queue_size``).
        queue_bytes: and this many bytes (``session_queue_bytes``), counting besides the queue the
            event being written and what the stream holds that the client has not taken. What it
            holds is also charged to its principal's and the total budget
            (:attr:`SessionManager.outgoing`): past either, the client is disconnected.
        manager: the table this session lives in (closing removes it).
        dispatcher: shared tool/resource dispatch.
        kind: ``"sse"`` (``GET /sse``) or ``"mcp"`` (Streamable HTTP); a session answers only on
            its own transport's endpoints.
    """

    # (slots: an idle session is held for hours, and an instance dict costs it about 280 bytes)
    __slots__ = ("id", "kind", "principal", "last_active", "last_write", "last_taken", "stream_open", "token", "closed",
                 "_manager", "_queue", "_queue_size", "_queue_bytes", "_queued", "_backlog", "_charged", "_out",
                 "_writer", "protocol")

    def __init__(
        self, session_id: str, principal: Principal, queue_size: int, manager: SessionManager, dispatcher: Dispatcher,
        kind: str = "sse", queue_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.id = session_id
        self.kind = kind  # "sse": lives as long as its GET /sse stream; "mcp": Streamable HTTP
        self.principal = principal
        self.last_active = time.monotonic()  # refreshed by each /mcp request; idle ones expire
        # time.monotonic() of the stream's last event written, or of the client's last taking some
        # of what it was written (a piece of a large event): keep-alive comments, and a stall
        self.last_write = 0.0
        # the same, but only for the session's messages, not its keep-alive comments: a request
        # waiting for room waits on only while its client takes some of those (_expire)
        self.last_taken = 0.0
        self.stream_open = False  # a GET stream is attached
        self.token = ""  # the bearer that opened it, re-checked every second (mcpd/front/revalidate.py)
        self.closed = False
        self._manager = manager
        # whole events, oldest first (a list, not a deque or an asyncio.Queue: an idle session should hold little)
        self._queue: list[bytes] = []
        self._queue_size = queue_size
        self._queue_bytes = queue_bytes
        # bytes of the messages not yet taken by the client: queued, being written by the writer,
        # and held by the stream (its transport) when last measured (self._backlog)
        self._queued = 0
        self._backlog = 0
        self._charged = 0  # of self._queued, what the manager's OutgoingBytes counts
        self._out: StreamOut | None = None  # the attached stream
        self._writer: asyncio.Task[None] | None = None  # writing the queue to the stream, while it must wait
        super().__init__()  # the room (Backpressure)
        self.protocol = McpSession(dispatcher, session_id, self.send, room=self, budget=manager)

    def pressed(self) -> bool:
        """Whether the queue holds its budget: ``queue_bytes`` the client has not taken, or
        ``queue_size`` messages."""
        return self._queued >= self._queue_bytes or len(self._queue) >= self._queue_size

    def stalled(self, now: float, seconds: float) -> bool:
        """Whether the client stopped reading: its queue is full (:meth:`pressed`, the stream
        measured afresh) and the stream has taken nothing of it for more than ``seconds``
        (``now``: ``time.monotonic()``). A client with nothing to take (requests waiting only for
        the room the session's running calls reserve) is not stalled."""
        if self.closed or self._out is None or now - self.last_write <= seconds:
            return False
        if self._backlog:
            self._measure(self._out)
        return self.pressed()

    # -- the queue -----------------------------------------------------------------------------

    def send(self, message: Any) -> None:
        """Queue one JSON-RPC message (object or array) that no request's room was taken for (a
        progress notification, a refusal); never blocks.

        A notification is dropped while the queue is full (:meth:`pressed`: its client is behind,
        and progress is advisory). Another message past ``queue_size`` messages (or one over
        :data:`~mcpd.front.connections.handover.UNSEEN` bytes, a refusal echoing a huge id, past
        ``queue_bytes``) means a client that keeps sending requests its queue has no room for
        while it reads none of it: the session is closed and its stream cut, as for a client that
        stopped reading. Also when the bytes its principal's sessions hold together, or all
        sessions, would pass their budgets (:class:`~mcpd.front.sessions.budgets.OutgoingBytes`).
        """
        self._put(message, False)

    def _put(self, message: Any, admitted: bool) -> None:
        if self.closed:
            return
        if not admitted and type(message) is dict and "id" not in message and self.pressed():
            return  # (a progress notification for a client that is behind: dropped)
        if not admitted and len(self._queue) >= self._queue_size:
            self.overflow("queue_overflow")
            return
        data = message_event(message)
        if not admitted and len(data) > UNSEEN and self._queued + len(data) > self._queue_bytes:
            self.overflow("queue_overflow")  # (a refusal echoing a huge id, for a client that is behind)
            return
        self._queue.append(data)
        self._queued += len(data)
        self._kick()
        if self._queued != self._charged:  # (a client keeping up holds nothing: nothing to charge)
            self._settle(True)

    def ping(self) -> None:
        """Queue a ``: ping`` comment, unless the stream is being written to anyway."""
        if self._out is not None and self._writer is None and not self.closed:
            self._queue.append(PING)
            self._queued += len(PING)
            self._kick()
            if self._queued != self._charged:  # (the stream took writes again: what it held went out)
                self._settle(False)

    def held(self) -> int:
        """Bytes of this session's outgoing messages the client has not taken: queued, being
        written, and held by the stream (measured now)."""
        if self._backlog and self._out is not None:
            self._measure(self._out)
        if self._queued != self._charged:
            self._settle(False)
        return self._queued

    def stale(self) -> bool:
        """Whether what is charged for this session may differ from what it holds now: its stream
        held bytes when last measured, or a write found them gone without charging the change."""
        return bool(self._backlog) or self._queued != self._charged

    def close(self) -> None:
        """Close the session (idempotent): cancel in-flight work, drop queued messages, and end the
        stream's response (its last chunk is written, so the connection is left clean). A stream
        whose writer still waits to write an event (the client stopped reading: its queue may have
        overflowed) is cut instead (:meth:`StreamOut.abort`): its end would wait behind that event
        for as long as the client likes, holding the connection, its count and its buffers."""
        if self.closed:
            return
        self.closed = True
        for waiter in self._waiters or ():
            if not waiter.fut.done():
                waiter.fut.set_result(False)
        self._waiters = None
        self.protocol.close()
        self.protocol.send = _discard  # (no cycle left between the two: freed as soon as unreferenced)
        self.protocol.room = None
        self._queue.clear()
        self._queued = self._backlog = 0
        if self._charged:
            self._settle(False)
        writer, out = self._writer, self._out
        if out is not None:
            out.on_progress = None
        if writer is not None and out is not None:
            self._writer = self._out = None
            writer.cancel()
            out.abort()
            return
        self._kick()

    def attach(self, out: StreamOut, endpoint: str | None) -> None:
        """Bind the GET stream ``out`` (an :class:`~mcpd.front.transport.stream.AsgiStream`, or
        the connection itself once the front took it over,
        :class:`~mcpd.front.connections.handover.StreamConnection`): the ``endpoint`` event (when given) goes
        first, then the queued messages. A closed session's stream is ended at once."""
        self.stream_open = True
        self.last_write = self.last_taken = time.monotonic()
        self._out = out
        out.on_progress = self._progressed
        if endpoint is not None and not self.closed:
            event = endpoint_event(endpoint)
            self._queue.insert(0, event)
            self._queued += len(event)
        self._kick()
        if self._queued != self._charged:
            self._settle(True)

    def detach(self) -> None:
        """Forget the stream (it ended): queued messages wait for the next one (``/mcp``); the
        event its writer was writing, and what the stream held, went with it."""
        if self._out is not None:
            self._out.on_progress = None
        self._out = None
        self.stream_open = False
        if self._writer is not None:
            self._writer.cancel()
            self._writer = None
        self._backlog = 0
        self._queued = sum(map(len, self._queue))
        if self._queued != self._charged:
            self._settle(False)

    def _progressed(self) -> None:
        """The stream took bytes (a piece of a large event, or its transport drained): the client
        reads; what it no longer holds makes room for waiting requests."""
        self.last_write = self.last_taken = time.monotonic()
        if self._waiters:
            self._grant()
            if self._queued != self._charged:
                self._settle(False)

    def _measure(self, out: StreamOut) -> None:
        """Count what the stream holds now (:meth:`StreamOut.held`) instead of what it held when
        last measured."""
        held = out.held()
        self._queued += held - self._backlog
        self._backlog = held

    def _settle(self, check: bool) -> None:
        """Charge the change in the bytes this session holds to its principal's and the total
        budget (:attr:`SessionManager.outgoing`); when ``check`` and they grew past either, close
        the session as for a client that stopped reading."""
        delta = self._queued - self._charged
        self._charged = self._queued
        kind = self._manager.outgoing.charge(self.principal.name, delta)
        if kind is not None and check and not self.closed:
            kind = self._manager.still_over(self.principal.name, self)
            if kind is not None:
                self.overflow(kind)

    def overflow(self, kind: str, idle: float | None = None) -> None:
        """The client stopped reading (``kind``: the bound its outgoing bytes reached, a
        :data:`~mcpd.front.metrics.LIMIT_KINDS` name; ``idle``: seconds it took nothing while its
        queue was full): count it, log it, close the session."""
        metrics.limit_hit(kind)
        took = "" if idle is None else f" and its client took nothing for {idle:g} s"
        log.warning("session %s: %s%s, disconnecting a client that stopped reading", self.id, FULL[kind], took)
        self._manager.close(self)

    def _kick(self) -> None:
        """Write what is queued, if a stream is attached and no writer is waiting for it: at once
        while the stream takes writes without waiting (:meth:`StreamOut.writable`: a connection
        whose transport is below its high-water mark), and the rest from a short-lived writer task
        (:meth:`_write`). Once the session is closed, end the stream's response instead."""
        out = self._out
        if out is None or self._writer is not None:
            return
        if out.writable():
            if self._backlog:  # the stream takes writes again: what it held went out
                self._queued -= self._backlog
                self._backlog = 0
            queue = self._queue
            if queue and not self.closed:
                taken = False
                while queue:
                    data = queue.pop(0)
                    self._queued -= len(data)
                    out.write(data)
                    taken = taken or data is not PING
                    if not out.writable():  # the client is behind: count what the stream holds
                        self._measure(out)
                        break
                self.last_write = time.monotonic()
                if taken:
                    self.last_taken = self.last_write
            if self.closed:
                self._out = None
                out.end()
                return
            if self._waiters:
                self._grant()
        if self._queue or self.closed:
            self._writer = asyncio.get_running_loop().create_task(self._write(out))

    async def _write(self, out: StreamOut) -> None:
        """Write the queued events to the stream, each once it takes it, until the queue is empty;
        once the session is closed, end the response instead (which ends the stream). Should
        writing fail, the session is closed and the stream dropped. An event stays counted in the
        queue's bytes until the stream took it, and then as what the stream holds."""
        try:
            while self._queue and not self.closed:
                data = self._queue.pop(0)
                await out.send(data)
                if self.closed:
                    break
                self._queued -= len(data)
                self._measure(out)
                self.last_write = time.monotonic()
                if data is not PING:
                    self.last_taken = self.last_write
                if self._waiters:
                    self._grant()
                if self._queued != self._charged:
                    self._settle(False)
            if self.closed:
                self._out = None
                await out.finish()
        except Exception:
            log.exception("session %s: writing its stream failed; closing it", self.id)
            self._out = None
            self._manager.close(self)
            out.abort()
        finally:
            if self._writer is asyncio.current_task():
                self._writer = None


class StreamOut(Protocol):
    """Where a session's stream goes: its request's ASGI ``send``
    (:class:`~mcpd.front.transport.stream.AsgiStream`) or the connection itself
    (:class:`~mcpd.front.connections.handover.StreamConnection`).

    ``on_progress``, when set, is called each time the client took some of a large event (a piece
    was written, or the transport drained), between the writes its writer sees."""

    on_progress: Callable[[], None] | None

    def writable(self) -> bool:
        """Whether :meth:`write` may be called now (it takes the data without waiting)."""

    def write(self, data: bytes) -> None:
        """Write one event now (only when :meth:`writable`)."""

    async def send(self, data: bytes) -> None:
        """Write one event once the stream takes it; raises when it cannot."""

    def end(self) -> None:
        """Complete the response now (only when :meth:`writable`)."""

    async def finish(self) -> None:
        """Complete the response once the stream takes it."""

    def abort(self) -> None:
        """Give the stream up (writing it failed)."""

    def held(self) -> int:
        """Bytes the stream holds that the client has not taken yet (beyond the event a pending
        :meth:`send` writes, which its caller counts until it returns)."""


def _discard(message: Any) -> None:
    """The ``send`` of a closed session's protocol: nothing goes anywhere."""
