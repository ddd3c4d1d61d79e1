"""The HTTP+SSE transport (SPEC §1.2–§1.5): ``GET /sse``, ``POST /message``, sessions, queues.

A session is born with its ``GET /sse`` stream and dies with it: the stream's end (client gone,
a client that stopped reading, server shutdown) closes the session at once, cancels its in-flight
requests and drops it from the table, so later POSTs get ``404``. Outgoing messages wait in a
queue bounded in bytes and messages. A session whose queue holds its budget takes no new call until
its client has taken some of it (backpressure: a reading client is never cut for reading slower
than its calls answer); a client that takes nothing for ``connections.idle_seconds`` while its
queue is full is disconnected instead of growing the server's memory.

The :class:`SessionManager` table also holds the Streamable HTTP sessions of ``/mcp``
(``mcpd.front.transport.streamable``, kind ``"mcp"``): one table, so ``max_sessions`` and every
per-session rule count both transports together, and the once-a-second token re-check closes both.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from sse_starlette import ServerSentEvent
from starlette.authentication import BaseUser
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from mcpd.common import wirejson
from mcpd.common.config import Config
from mcpd.front import metrics
from mcpd.front.connguard import PIECE, UNSEEN
from mcpd.front.transport.body import BodyRefused, read_json
from mcpd.common.identity import Principal
from mcpd.front.mcp.dispatcher import Caller, Dispatcher
from mcpd.front.mcp.session import McpSession

if TYPE_CHECKING:
    from mcpd.front.connguard import StreamConnection

log = logging.getLogger(__name__)

SESSION_ID_RE = re.compile(r"[0-9a-f]{32}")
_SESSION_QUERY_RE = re.compile(rb"session_id=[0-9a-f]{32}")  # a query string of one well-formed id
STREAM_HEADERS = {"Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"}


def encode_message(message: Any) -> bytes:
    """One JSON-RPC message (object or array) as compact UTF-8 JSON on one line: U+0085, U+2028
    and U+2029, where line readers built on ``str.splitlines`` (httpx's among them) would break
    it, are escaped (:func:`mcpd.common.wirejson.dumps_line`)."""
    return wirejson.dumps_line(message)


def message_event(message: Any) -> bytes:
    """One JSON-RPC message as a whole SSE ``message`` event, ready to send: encoded once, and
    never split or copied into a string again (what ``ServerSentEvent`` would do with its data)."""
    return event_of(encode_message(message))


def pieces(data: bytes) -> Iterator[bytes]:
    """``data`` in pieces of at most :data:`~mcpd.front.connguard.PIECE` bytes, in order, each
    made when asked for (an event written a piece at a time, each once the transport takes more:
    a client that stops reading then leaves at most about a piece in the transport, not the event)."""
    for start in range(0, len(data), PIECE):
        yield data[start:start + PIECE]


def event_of(data: bytes) -> bytes:
    """An SSE ``message`` event around one message already encoded by :func:`encode_message`."""
    return b"event: message\ndata: " + data + b"\n\n"


def tick_seconds(keepalive: float) -> float:
    """How often the keep-alive ticker looks at the streams: a quarter of ``keepalive`` (seconds),
    at most once a second."""
    return min(1.0, keepalive / 4)


#: How many calls that may answer large (``tools/call``, ``resources/read``) a session runs at once
#: with an empty queue: each reserves this fraction of ``session_queue_bytes`` until its answer is
#: queued (:meth:`SseSession.admit`), so what a session holds stays within its budget plus the
#: answers of the calls it took while it had room (at most this many beyond their reservations).
CALLS_AT_ONCE = 4

TRIM_AFTER = 32  # sessions closed before the heap is trimmed (SessionManager.give_back_memory)
TRIM_QUIET = 0.5  # seconds without a close before it is


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc only; elsewhere nothing to do
    except (OSError, AttributeError):
        return None


def trim_heap() -> bool:
    """Return the C heap's free pages to the system (glibc ``malloc_trim(0)``); ``False`` where
    the C library has no such call."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


#: A keep-alive comment, encoded.
PING = ServerSentEvent(comment="ping", sep="\n").encode()


class McpUser(BaseUser):
    """The authenticated caller of one HTTP request (set by the auth middleware in ``app.py``)."""

    def __init__(self, principal: Principal, token: str) -> None:
        self.principal = principal
        self.token = token

    @property
    def is_authenticated(self) -> bool:
        """Always true: unauthenticated requests never get past the middleware."""
        return True

    @property
    def display_name(self) -> str:
        """The principal's name."""
        return self.principal.name


class SseSession:
    """One session: owner, bounded outgoing queue, and its :class:`McpSession` (SPEC §1.4).

    While a GET stream is attached (:meth:`attach`), queued messages are written to it by a
    short-lived writer task, started when something is queued and ended when the queue is empty:
    an idle session holds no task, timer or event of its own (its keep-alive comments come from
    the manager's one ticker, :meth:`SessionManager.keep_alive`).

    Backpressure (the session is the :class:`~mcpd.front.mcp.session.Room` of its protocol): a request
    whose reply goes to this session's stream first takes room (:meth:`admit`) and gives it back
    with its reply (:meth:`deliver`). A session takes requests while what its client has not taken
    plus what the requests it took reserve is under ``queue_bytes``, and their number under
    ``queue_size``; else a request waits for room while its client takes some of the stream, and
    is refused (``-32000``, not run) once its deadline passed with the client taking nothing. So a
    client reading slower than its calls answer slows them down instead of being cut, and only one
    that takes nothing for ``connections.idle_seconds`` while its queue is full (:meth:`stalled`)
    is disconnected.

    Args:
        session_id: 32 lowercase hex digits.
        principal: the owner; POSTs from anyone else get 404.
        queue_size: outgoing messages buffered (``session_queue_size``).
        queue_bytes: and this many bytes (``session_queue_bytes``), counting besides the queue the
            event being written and what the stream holds that the client has not taken. Its
            reserve for a call that may answer large is a :data:`CALLS_AT_ONCE`-th of it.
            What it holds is also charged to its principal's and the total budget
            (:attr:`SessionManager.outgoing`): past either, the client is disconnected.
        manager: the table this session lives in (closing removes it).
        dispatcher: shared tool/resource dispatch.
        kind: ``"sse"`` (``GET /sse``) or ``"mcp"`` (Streamable HTTP); a session answers only on
            its own transport's endpoints.
    """

    # (slots: an idle session is held for hours, and an instance dict costs it about 280 bytes)
    __slots__ = ("id", "kind", "principal", "last_active", "last_write", "last_taken", "stream_open", "token", "closed",
                 "_manager", "_queue", "_queue_size", "_queue_bytes", "_queued", "_backlog", "_charged", "_out",
                 "_writer", "protocol", "_reserved", "_slots", "_waiters")

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
        self.token = ""  # the bearer that opened it, re-checked every second (mcpd/transport/revalidate.py)
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
        # what the requests admitted and not yet answered reserve: bytes, and messages (admit)
        self._reserved = 0
        self._slots = 0
        # requests waiting for room, oldest first (admit); None while none waits
        self._waiters: list[Waiter] | None = None
        self.protocol = McpSession(dispatcher, session_id, self.send, room=self)

    # -- the protocol's room (backpressure) ----------------------------------------------------

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
        :data:`~mcpd.front.connguard.UNSEEN` bytes, a refusal echoing a huge id, past
        ``queue_bytes``) means a client that keeps sending requests its queue has no room for
        while it reads none of it: the session is closed and its stream cut, as for a client that
        stopped reading. Also when the bytes its
        principal's sessions hold together, or all sessions, would pass their budgets
        (:class:`OutgoingBytes`).
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
        """Bind the GET stream ``out`` (an :class:`AsgiStream`, or the connection itself once the
        front took it over, :class:`~mcpd.front.connguard.StreamConnection`): the ``endpoint``
        event (when given) goes first, then the queued messages. A closed session's stream is
        ended at once."""
        self.stream_open = True
        self.last_write = self.last_taken = time.monotonic()
        self._out = out
        out.on_progress = self._progressed
        if endpoint is not None and not self.closed:
            event = ServerSentEvent(event="endpoint", data=endpoint, sep="\n").encode()
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


class Waiter:
    """A request waiting for room (:meth:`SseSession.admit`): the bytes it reserves, about the
    bytes it holds meanwhile, the future set ``True`` once it is admitted (``False``: refused),
    how long it may wait without the client taking anything, and the timer that looks again then."""

    __slots__ = ("cost", "size", "fut", "seconds", "timer")

    def __init__(self, cost: int, size: int, fut: asyncio.Future[bool], seconds: float) -> None:
        self.cost, self.size, self.fut, self.seconds = cost, size, fut, seconds
        self.timer: asyncio.TimerHandle | None = None


#: What each limit kind of a client that stopped reading says in the log.
FULL = {"queue_overflow": "outgoing queue full",
         "queue_bytes_per_principal": "its principal's outgoing bytes are over principal_queue_bytes",
         "queue_bytes_total": "all sessions' outgoing bytes are over total_queue_bytes"}


class StreamOut(Protocol):
    """Where a session's stream goes: its request's ASGI ``send`` (:class:`AsgiStream`) or the
    connection itself (:class:`~mcpd.front.connguard.StreamConnection`).

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


class AsgiStream:
    """A stream written through its request's ASGI ``send``: the stream's task (the one running
    :meth:`SessionStream.run`) waits for the client; events go through :meth:`send`, never at once.

    Args:
        send: the request's ASGI ``send``, the response started.
        task: the stream's task, cancelled by :meth:`abort` when there is no ``drop``.
        drop: drops the stream's connection (the server's offer,
            :meth:`~mcpd.front.connguard.ConnectionOffer.abort`): :meth:`abort` then cuts the
            connection, and the task ends as for a client that left, rather than by cancellation
            (which the server would log as the app's failure, and after which it would still wait
            for the client's TLS goodbye).
    """

    __slots__ = ("_send", "_task", "_drop", "on_progress")

    def __init__(self, send: Send, task: asyncio.Task[Any] | None, drop: Callable[[], None] | None = None) -> None:
        self._send, self._task, self._drop = send, task, drop
        self.on_progress: Callable[[], None] | None = None

    def writable(self) -> bool:
        """Never: ``send`` is a coroutine."""
        return False

    def write(self, data: bytes) -> None:
        raise RuntimeError("an ASGI stream is written by send()")

    def end(self) -> None:
        raise RuntimeError("an ASGI stream is ended by finish()")

    async def send(self, data: bytes) -> None:
        if len(data) <= PIECE:
            await self._send({"type": "http.response.body", "body": data, "more_body": True})
            return
        for piece in pieces(data):  # (the server's send returns once its transport takes more)
            await self._send({"type": "http.response.body", "body": piece, "more_body": True})
            if self.on_progress is not None:
                self.on_progress()

    def held(self) -> int:
        """Nothing of its own: the event :meth:`send` writes is its caller's until it returns, and
        the transport holds at most about a piece beyond that."""
        return 0

    async def finish(self) -> None:
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    def abort(self) -> None:
        task, self._task = self._task, None
        if self._drop is not None:
            self._drop()
        elif task is not None:
            task.cancel()


def _discard(message: Any) -> None:
    """The ``send`` of a closed session's protocol: nothing goes anywhere."""


class SessionRefused(Exception):
    """No session may be opened: ``status`` is ``503`` (``max_sessions`` open in all) or ``429``
    (the principal holds ``max_sessions_per_principal``); ``reason`` is the answer's text."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class OutgoingBytes:
    """The bytes of outgoing messages held for clients that have not taken them yet, by principal
    and in all, against two budgets (``principal_queue_bytes``, ``total_queue_bytes``): the
    sessions' queues and streams (:meth:`SseSession.send`), the ``/mcp`` POST event streams
    (:class:`~mcpd.front.transport.streamable.PostStream`) and large ``/mcp`` answers
    (:meth:`SessionManager.hold_answer`) charge what they hold here.

    Args:
        per_principal: bytes one principal's sessions and streams may hold together.
        total: bytes all of them may hold together.
    """

    __slots__ = ("per_principal", "budget", "total", "_held")

    def __init__(self, per_principal: int, total: int) -> None:
        self.per_principal = per_principal
        self.budget = total
        self.total = 0
        self._held: dict[str, int] = {}

    def charge(self, name: str, delta: int) -> str | None:
        """Add ``delta`` bytes (negative: released) to principal ``name``'s count and the total.
        Returns, when they grew (``delta > 0``) past a budget, the limit kind to report
        (``"queue_bytes_per_principal"`` or ``"queue_bytes_total"``): the caller then gives up
        what it holds (releasing it here) as for a full queue; else ``None``."""
        held = self._held.get(name, 0) + delta
        if held > 0:
            self._held[name] = held
        else:
            self._held.pop(name, None)
        self.total += delta
        if delta > 0:
            if held > self.per_principal:
                return "queue_bytes_per_principal"
            if self.total > self.budget:
                return "queue_bytes_total"
        return None

    def held(self, name: str) -> int:
        """The bytes principal ``name`` holds."""
        return self._held.get(name, 0)

    def holders(self) -> Iterator[tuple[str, int]]:
        """(principal, bytes held) for each principal holding some."""
        return iter(list(self._held.items()))


class AnswerConnection(Protocol):
    """The connection of a ``/mcp`` answer (the server's
    :class:`~mcpd.front.connguard.ConnectionOffer`; equal for every request of one connection)."""

    def unsent(self) -> int:
        """Bytes written to it that the client has not taken yet (``0`` once it is gone)."""

    def abort(self) -> None:
        """Drop it."""


class KeptAnswer:
    """A ``/mcp`` answer written whole whose connection still holds some of it
    (:meth:`SessionManager.keep_answer`): its principal, its connection, and what is charged."""

    __slots__ = ("owner", "conn", "charged")

    def __init__(self, owner: str, conn: AnswerConnection) -> None:
        self.owner, self.conn = owner, conn
        self.charged = 0


def _last_active(session: SseSession) -> float:
    """When ``session`` last had a request come or a request's handling end (``time.monotonic()``)."""
    return max(session.last_active, session.protocol.last_done)


class SessionManager:
    """The table of live sessions, capped at ``max_sessions`` in all and at
    ``max_sessions_per_principal`` for each principal, both transports counted together (SPEC §1.4, §1.7).

    Args:
        cfg: the daemon config (``max_sessions``, ``session_queue_size``, ``session_queue_bytes``,
            ``principal_queue_bytes``, ``total_queue_bytes``).
        dispatcher: shared by every session.
    """

    def __init__(self, cfg: Config, dispatcher: Dispatcher) -> None:
        self._cfg = cfg
        self._dispatcher = dispatcher
        self._sessions: dict[str, SseSession] = {}
        #: seconds a request waits for room in its session's queue before it is refused, and how
        #: many requests, holding about how many bytes together, may wait in one session
        self.admit_seconds = cfg.workers.timeout_seconds
        self.max_waiting, self.waiting_bytes = cfg.max_in_flight, cfg.max_body_bytes
        #: seconds a client may take nothing while its session's queue is full before it is disconnected
        self.stall_seconds = cfg.connections.idle_seconds
        self.closed_since_trim = 0  # sessions closed since the heap was last trimmed
        self._last_close = 0.0  # time.monotonic() of the last close
        self._ticker: asyncio.TimerHandle | None = None
        #: outgoing bytes held by principal and in all (the sessions', /mcp POST streams' and answers')
        self.outgoing = OutgoingBytes(cfg.principal_queue_bytes, cfg.total_queue_bytes)
        #: what hold_answer counts of each answer being written (or POST stream), by principal and
        #: by what cuts it (its ``cut``)
        self._answers: dict[str, dict[Callable[[], None], int]] = {}
        #: the answers written whose connections still hold some of them (keep_answer), by connection
        self._kept: dict[AnswerConnection, KeptAnswer] = {}
        #: what a cut gave up of answers that their writers release later (by ``cut``: principal,
        #: bytes): still in ``outgoing`` until then, but no longer held for the total's rule
        self._leaving: dict[Callable[[], None], tuple[str, int]] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def dispatcher(self) -> Dispatcher:
        """The tools and resources every session reaches (also one-request stateless ones)."""
        return self._dispatcher

    def open(self, principal: Principal, token: str = "", kind: str = "sse") -> SseSession:
        """Create a session of ``kind`` (``"sse"`` or ``"mcp"``) owned by ``principal`` opened with
        bearer ``token`` (kept in memory only, so a revoked or rotated token closes it).

        At a full cap, the ``"mcp"`` session idle longest (of ``principal`` for its own cap, of
        anyone for ``max_sessions``) makes room when it has been idle for at least
        ``mcp_session_evict_seconds`` (:meth:`evict_idle`): a client that never ends its sessions
        does not lock its principal out until they expire. The principal's own cap is checked
        first: a principal refused for it evicts no one else's session.

        Raises:
            SessionRefused: ``503`` when ``max_sessions`` are open, ``429`` when ``principal``
                holds ``max_sessions_per_principal``; both count the two kinds together.
        """
        held = 0
        for other in self._sessions.values():
            if other.principal.name == principal.name:
                held += 1
                if other.principal == principal:  # one object for all the sessions of a token
                    principal, token = other.principal, other.token if other.token == token else token
        full = len(self._sessions) >= self._cfg.max_sessions
        # (the principal's own cap first: one refused for it must not have evicted anyone else's
        # session; its own evicted session frees a place in all as well)
        if held >= self._cfg.max_sessions_per_principal and not self.evict_idle(principal.name):
            if full:
                metrics.limit_hit("sessions_total")
                raise SessionRefused(503, "too many sessions")
            metrics.limit_hit("sessions_per_principal")
            raise SessionRefused(429, "too many sessions for this principal")
        if len(self._sessions) >= self._cfg.max_sessions and not self.evict_idle(None):
            metrics.limit_hit("sessions_total")
            raise SessionRefused(503, "too many sessions")
        sid = secrets.token_hex(16)
        session = SseSession(sid, principal, self._cfg.session_queue_size, self, self._dispatcher, kind,
                             self._cfg.session_queue_bytes)
        session.token = token
        self._sessions[sid] = session
        return session

    def find(self, session_id: str, principal: Principal, kind: str = "sse") -> SseSession | None:
        """The live session ``session_id`` of ``kind`` if ``principal`` owns it, else ``None``
        (all answer 404: an id never reveals that another principal's or transport's session exists)."""
        session = self._sessions.get(session_id)
        if session is None or session.closed or session.kind != kind or session.principal.name != principal.name:
            return None
        return session

    def _idle(self, session: SseSession, now: float, seconds: float) -> bool:
        """Whether ``session`` is a ``"mcp"`` one with no GET stream, no request in flight and no
        request for more than ``seconds`` (since the last one came or was answered)."""
        return (session.kind == "mcp" and not session.stream_open and not session.protocol.busy
                and now - _last_active(session) > seconds)

    def evict_idle(self, name: str | None, now: float | None = None) -> bool:
        """Close the ``"mcp"`` session (of principal ``name``; of anyone for ``None``) that has
        been idle longest, if it has been idle (:meth:`_idle`) for ``mcp_session_evict_seconds``
        (``0``: never); whether one was. Its client's next request gets ``404`` and initializes
        again. Reads every session: called only at a full cap."""
        after = self._cfg.mcp_session_evict_seconds
        if not after > 0:
            return False
        now = time.monotonic() if now is None else now
        idle = [s for s in self._sessions.values()
                if (name is None or s.principal.name == name) and self._idle(s, now, after)]
        if not idle:
            return False
        oldest = min(idle, key=_last_active)
        log.info("session %s of %s closed after %.0f s idle to make room for a new one", oldest.id,
                 oldest.principal.name, now - _last_active(oldest))
        metrics.session_evicted()
        self.close(oldest)
        return True

    def expire_idle(self, idle_seconds: float, now: float | None = None) -> int:
        """Close the ``"mcp"`` sessions with no GET stream, no request in flight and no request
        for ``idle_seconds`` (a Streamable HTTP session has no stream whose end would close it);
        return how many were closed. ``now``: ``time.monotonic()`` by default."""
        now = time.monotonic() if now is None else now
        idle = [s for s in self._sessions.values() if self._idle(s, now, idle_seconds)]
        for session in idle:
            log.info("session %s closed after %.0f s idle", session.id, idle_seconds)
            self.close(session)
        return len(idle)

    def still_over(self, name: str, measured: SseSession | None = None) -> str | None:
        """The bytes principal ``name`` holds grew past its or the total budget: measure afresh
        what the sessions' streams hold (it may have gone out since they were last measured; but
        ``measured``'s, just measured), and return the limit kind still passed
        (``"queue_bytes_per_principal"``, ``"queue_bytes_total"``), or ``None``. Only then: it
        reads every session.

        The total's rule: while it is passed, the principal holding the most gives up what it
        holds (:meth:`cut`); ``name`` when none other holds more (``"queue_bytes_total"`` is then
        returned for it to give up its own). So a principal holding at most ``total_queue_bytes``
        divided by the number of principals holding bytes is never cut for the total (were none
        holding more, all together would hold no more than the total). What a cut gave up and its
        writers have not released yet counts for no one (else the next charge would cut another
        principal for bytes already given up)."""
        for other in self._sessions.values():
            if other is not measured and other.stale():
                other.held()
        for kept in list(self._kept.values()):
            self._measure_kept(kept)
        outgoing = self.outgoing
        leaving: dict[str, int] = {}
        for owner, size in self._leaving.values():
            leaving[owner] = leaving.get(owner, 0) + size
        own = outgoing.held(name) - leaving.get(name, 0)
        if own > outgoing.per_principal:
            return "queue_bytes_per_principal"
        total, done = outgoing.total - sum(leaving.values()), {name}
        while total > outgoing.budget:
            top, most = max(((n, b - leaving.get(n, 0)) for n, b in outgoing.holders() if n not in done),
                            key=lambda nb: nb[1], default=("", 0))
            if most <= own:
                return "queue_bytes_total"
            done.add(top)
            total -= self.cut(top, "queue_bytes_total")
        return None

    def cut(self, name: str, kind: str) -> int:
        """Principal ``name``'s clients stopped reading (``kind``: the bound passed): close its
        sessions holding bytes and drop its answers and POST streams charged with a ``cut``
        (:meth:`hold_answer`) and its kept answers (:meth:`keep_answer`), each counted in
        ``limits_hit``. Returns the bytes this gives up: released now (sessions, kept answers, POST
        streams) or by their writers as they end (answers being written: counted as leaving until
        then, :meth:`still_over`)."""
        before = self.outgoing.held(name)
        for session in [s for s in self._sessions.values() if s.principal.name == name and s.held()]:
            session.overflow(kind)
        charged = self._answers.pop(name, {})
        for drop, size in charged.items():
            self._leaving[drop] = (name, size)
        drops = list(charged)
        for kept in [k for k in self._kept.values() if k.owner == name]:
            self._forget_kept(kept)
            drops.append(kept.conn.abort)
        for drop in drops:
            metrics.limit_hit(kind)
            log.warning("a POST's answer of %s: %s, dropping a client that stopped reading", name, FULL[kind])
            drop()
        # (a POST stream's cut released its bytes at once, through hold_answer: no longer leaving)
        return before - self.outgoing.held(name) + sum(self._leaving[d][1] for d in charged if d in self._leaving)

    def keep_answer(self, name: str, conn: AnswerConnection) -> str | None:
        """A ``/mcp`` answer was written whole (``PiecedAnswer`` in ``streamable.py``) on ``conn``
        (the server's :class:`~mcpd.front.connguard.ConnectionOffer`): charge what the connection
        still holds (:meth:`AnswerConnection.unsent`) to principal ``name``'s and the total budgets
        while that is more than :data:`~mcpd.front.connguard.UNSEEN` bytes, measured again by the
        keep-alive ticker and before any cut for a budget; forgotten once it holds no more (or is
        gone). One answer kept per connection: a later one replaces it.

        Returns, when the charge passed a bound (:meth:`still_over`), its limit kind: the caller
        then drops the connection (nothing is kept); else ``None``."""
        held = conn.unsent()
        if held <= UNSEEN:  # (a client keeping up: nothing kept)
            return None
        kept = KeptAnswer(name, conn)
        earlier = self._kept.pop(conn, None)
        if earlier is not None:
            self._forget_kept(earlier)
        self._kept[conn] = kept
        self.stream_attached()  # (the ticker measures it again)
        if self._measure_kept(kept, held):
            kind = self.still_over(name)
            if kind is not None:
                self._forget_kept(kept)
                return kind
        return None

    def _measure_kept(self, kept: KeptAnswer, held: int | None = None) -> bool:
        """Charge what ``kept``'s connection holds now (``held``, measured just now, or measured
        here) instead of what it held; forget it once that is at most
        :data:`~mcpd.front.connguard.UNSEEN`. Whether the charge passed a bound."""
        if held is None:
            held = kept.conn.unsent()
        if held <= UNSEEN:
            held = 0
        delta, kept.charged = held - kept.charged, held
        over = self.outgoing.charge(kept.owner, delta) is not None
        if not held:
            self._kept.pop(kept.conn, None)
        return over

    def _forget_kept(self, kept: KeptAnswer) -> None:
        """Release what ``kept`` is charged and forget it (its connection is dropped or gone)."""
        self._kept.pop(kept.conn, None)
        if kept.charged:
            self.outgoing.charge(kept.owner, -kept.charged)
            kept.charged = 0

    def hold_answer(self, name: str, delta: int, cut: Callable[[], None] | None = None) -> str | None:
        """Charge ``delta`` bytes (negative: released) of a ``/mcp`` answer its connection has not
        taken yet (``PiecedAnswer`` in ``streamable.py``) to principal ``name``'s and the total
        budgets (:attr:`outgoing`). Not to the session's ``session_queue_bytes``: each answer has
        a connection of its own, and a client reading several large answers at once on one
        session is normal (each is held whole until its last piece is written, and a reader
        keeping up is behind for most of that time). ``cut``: drops the answer's connection (or
        cuts the POST stream); what is charged with it is counted for :meth:`cut`.

        Returns, when a charge (``delta > 0``) passed a bound, its limit kind
        (``"queue_bytes_per_principal"``, ``"queue_bytes_total"``: still passed once every stream
        was measured afresh and the total's rule applied, :meth:`still_over`); the caller then
        drops its connection and releases what it charged. Else ``None``."""
        if cut is not None and delta < 0 and cut in self._leaving:  # a release of what a cut gave up
            owner, size = self._leaving.pop(cut)
            if size + delta > 0:
                self._leaving[cut] = (owner, size + delta)
        elif cut is not None:
            answers = self._answers.setdefault(name, {})
            left = answers.get(cut, 0) + delta
            if left > 0:
                answers[cut] = left
            else:
                answers.pop(cut, None)
                if not answers:
                    del self._answers[name]
        if self.outgoing.charge(name, delta) is not None:
            return self.still_over(name)
        return None

    def close(self, session: SseSession) -> None:
        """Close ``session`` and forget it."""
        if self._sessions.pop(session.id, None) is not None:
            self.closed_since_trim += 1
            self._last_close = time.monotonic()
        session.close()

    def stream_attached(self) -> None:
        """A GET stream was attached: start the keep-alive ticker unless it runs (it stops once no
        stream is left)."""
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().call_later(tick_seconds(self._cfg.keepalive_seconds),
                                                                self._tick)

    def keep_alive(self, now: float | None = None) -> tuple[int, int]:
        """Queue a ``: ping`` comment on every attached stream that has sent nothing for
        ``keepalive_seconds``; return (streams attached, streams pinged). One ticker for every
        stream (rather than a timer each) calls it every :func:`tick_seconds`, so a comment follows
        between ``keepalive_seconds`` and that much more after a stream's last event. A stream
        whose client was behind when last written to is measured again (:meth:`SseSession.held`),
        so what it no longer holds is not counted against its principal's budget for long. A
        session whose client has taken nothing for ``connections.idle_seconds`` while its queue is
        full (:meth:`SseSession.stalled`) is closed, as a client that stopped reading."""
        now = time.monotonic() if now is None else now
        due = now - self._cfg.keepalive_seconds
        attached = pinged = 0
        stalled = []
        for session in self._sessions.values():
            if session.stream_open:
                attached += 1
                if session.last_write <= due:
                    session.ping()
                    pinged += 1
                elif session.stale():  # what its stream held when last measured may have gone out
                    session.held()
                if session.stalled(now, self.stall_seconds):
                    stalled.append(session)
        for session in stalled:  # (closing changes the table)
            session.overflow("queue_overflow", self.stall_seconds)
        for kept in list(self._kept.values()):
            self._measure_kept(kept)
        return attached, pinged

    def _tick(self) -> None:
        self._ticker = None
        attached = 1
        try:
            attached, _ = self.keep_alive()
        finally:
            if attached or self._kept:
                self.stream_attached()

    def give_back_memory(self, after: int = TRIM_AFTER, now: float | None = None) -> bool:
        """Once ``after`` sessions were closed since the last trim and closing has paused for
        :data:`TRIM_QUIET` seconds (or ``8 * after`` were closed, however busy), collect the
        cycles closed streams leave (a full ``gc.collect``: until the collector's rare full pass,
        cancelled tasks, their exceptions and frames keep a closed session's memory) and hand the
        C heap's free pages back to the system (glibc ``malloc_trim``). Returns whether it trimmed.
        Meant to be called every second."""
        now = time.monotonic() if now is None else now
        quiet = now - self._last_close >= TRIM_QUIET
        if self.closed_since_trim < after or not (quiet or self.closed_since_trim >= 8 * after):
            return False
        self.closed_since_trim = 0
        self._sessions = dict(self._sessions)  # a dict keeps the table of its largest size: this one fits
        gc.collect()  # a closed stream leaves cycles (cancelled tasks, their exceptions and frames)
        return trim_heap()


    def sessions(self) -> list[SseSession]:
        """A snapshot of the open sessions."""
        return list(self._sessions.values())

    def close_all(self) -> None:
        """Close every session (server shutdown)."""
        for session in list(self._sessions.values()):
            self.close(session)


#: The ASGI scope key under which the front's app (``mcpd.front.app.FrontApp``) offers to run a
#: session's stream itself, once the middleware and routing frames have returned: a list that
#: :class:`SessionStream` appends itself to.
HANDOFF = "mcpd.stream_handoff"


_CLOSE = (b"connection", b"close")


class SessionStream(Response):
    """A session's GET stream: ``GET /sse``, whose end closes its session (SPEC §1.2, §1.4), or
    ``GET /mcp`` (``endpoint`` ``None``, ``close_on_end`` false: the session outlives it).

    The response is started through the middleware like any other; the stream itself (:meth:`run`)
    is then run by the app's outermost layer when the scope offers it (:data:`HANDOFF`), so an open
    stream holds none of the middleware's and router's frames, only a wait for the client's
    disconnect: queued events are written by the session's short-lived writer task
    (:meth:`SseSession.attach`) and keep-alive comments come from the manager's ticker (issue
    "hostile load": an idle session holds little). Server shutdown closes the sessions first
    (:meth:`SessionManager.close_all`), which ends every stream.

    Args:
        session: the session whose queue feeds the stream.
        manager: its table.
        endpoint: the ``endpoint`` event's data, or ``None`` for no such event.
        close_on_end: close the session when the stream ends.
        headers: extra response headers.
    """

    media_type = "text/event-stream; charset=utf-8"

    def __init__(self, session: SseSession, manager: SessionManager, endpoint: str | None,
                 close_on_end: bool = True, headers: dict[str, str] | None = None) -> None:
        # (not Response.__init__: a stream has no body, so no content-length; nor StreamingResponse,
        # whose body iterator each open stream would hold)
        self.status_code = 200
        self.background = None
        self.init_headers({**STREAM_HEADERS, **(headers or {})})
        self.session = session
        self.manager = manager
        self.endpoint = endpoint
        self.close_on_end = close_on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Start the response, then stream (:meth:`run`), here or, when the scope offers it, from
        the app's outermost layer. ``HEAD`` gets the headers only. A stream's response says
        ``Connection: close``: its end (the session's close, or the client's) closes the
        connection, which a client must not then reuse for its next request."""
        self.session.stream_open = True
        head = scope.get("method") == "HEAD"
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers if head else [*self.raw_headers, _CLOSE]})
            self.raw_headers = []  # sent: an open stream need not keep them
            if head:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                self.end()
                return
        except BaseException:
            self.end()
            raise
        handoff = scope.get(HANDOFF)
        if handoff is not None:
            handoff.append(self)
            return
        await self.run(receive, send)

    async def run(self, receive: Receive, send: Send, drop: Callable[[], None] | None = None) -> None:
        """Stream until the client leaves or the session is closed (its writer then completes the
        response, which ends the wait here), then :meth:`end`. ``send`` and ``receive`` are the
        request's, with or without the middleware's wrappers; ``drop``, when the server offers it,
        drops the connection (a stream cut because it stalled: see :class:`AsgiStream`)."""
        try:
            self.session.attach(AsgiStream(send, asyncio.current_task(), drop), self.endpoint)
            self.endpoint = None  # queued, encoded
            self.manager.stream_attached()
            while (await receive())["type"] != "http.disconnect":
                pass
        finally:
            self.end()

    def take_over(self, offer: Callable[[], StreamConnection | None]) -> bool:
        """Stream on the connection itself: ``offer`` (the server's,
        :class:`~mcpd.front.connguard.ConnectionOffer`) hands it over, and the session writes to
        it directly; the stream then needs no task, and it ends when the client leaves or the
        session's close ends the response. ``False`` when the server kept the connection
        (:meth:`run` it then)."""
        conn = offer()
        if conn is None:
            return False
        conn.on_lost = functools.partial(end_stream, self.session, self.manager, self.close_on_end)
        self.session.attach(conn, self.endpoint)
        self.endpoint = None
        self.manager.stream_attached()
        return True

    def end(self) -> None:
        """The stream is over: :func:`end_stream`. Also for a stream that never ran."""
        end_stream(self.session, self.manager, self.close_on_end)


def end_stream(session: SseSession, manager: SessionManager, close_session: bool) -> None:
    """A session's stream is over: detach it, and close the session (when ``close_session``: a
    ``GET /sse`` stream) or only mark it active now (``GET /mcp``: the session outlives it)."""
    session.detach()
    session.last_active = time.monotonic()
    if close_session:
        manager.close(session)


class Transport:
    """The ``/sse`` and ``/message`` endpoints over one :class:`SessionManager`.

    Args:
        cfg: the daemon config (``base_path``, ``keepalive_seconds``, ``max_body_bytes`` ...).
        manager: the session table.
    """

    def __init__(self, cfg: Config, manager: SessionManager) -> None:
        self.cfg = cfg
        self.manager = manager

    def routes(self) -> list[Route]:
        """Starlette routes, mounted at the server root (the public ``base_path`` only prefixes the endpoint URL)."""
        return [
            Route("/sse", self.sse, methods=["GET"]),
            Route("/message", self.message, methods=["POST"]),
        ]

    async def sse(self, request: Request) -> Response:
        """``GET /sse`` (SPEC §1.2): open a session; ``503`` when ``max_sessions`` are open."""
        user: McpUser = request.user
        try:
            session = self.manager.open(user.principal, user.token)
        except SessionRefused as exc:
            return PlainTextResponse(exc.reason, status_code=exc.status)
        endpoint = f"{self.cfg.base_path}/message?session_id={session.id}"
        return SessionStream(session, self.manager, endpoint)

    async def message(self, request: Request) -> Response:
        """``POST /message?session_id=`` (SPEC §1.3): validate, then hand the body to the session."""
        user: McpUser = request.user
        query = request.scope["query_string"]
        if _SESSION_QUERY_RE.fullmatch(query):  # the usual ``session_id=<id>`` alone, nothing to unquote
            ids = [query[11:].decode("ascii")]
        else:
            ids = request.query_params.getlist("session_id")
        if len(ids) != 1 or not SESSION_ID_RE.fullmatch(ids[0]):
            return PlainTextResponse("missing or malformed session_id", status_code=400)
        session = self.manager.find(ids[0], user.principal)
        if session is None:
            return PlainTextResponse("no such session", status_code=404)
        try:
            payload = await read_json(request, self.cfg.max_body_bytes)
        except BodyRefused as exc:
            return exc.response()
        if session.closed:  # closed while the body was read: as for any closed session
            return PlainTextResponse("no such session", status_code=404)
        peer = f"{request.client.host}:{request.client.port}" if request.client else "unknown"
        if session.protocol.receive(payload, Caller(user.principal, user.token, peer)) is not None:
            # let the call start first: it reaches its worker (or the helper) and runs there while
            # this request's 202 is written, rather than after it
            await asyncio.sleep(0)
        return Response(status_code=202)

