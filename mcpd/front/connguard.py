"""Bounds on client connections (SPEC §1.7): counts in total and per address, and deadlines for
the TLS handshake, a request's headers and its body.

uvicorn has a keep-alive timeout (``connections.idle_seconds`` is passed to it) but none for a
client that trickles its headers or body, and no per-address count. :func:`guarded_protocol`
returns uvicorn's httptools protocol class with those added; :class:`GuardedLoop` is uvloop's
event loop with a TLS handshake deadline on every server it creates. A connection over a count,
or past a deadline, is closed: it never holds a slot or delays anyone else.

The protocol also holds less per connection than uvicorn's (an idle SSE stream holds its connection
for hours): no ``collections.deque`` (760 bytes each, empty) for the pipelined requests, the
request's message event or the write flow control; see :class:`Waiters`, :class:`Pipeline` and
:class:`LeanFlowControl`. Once a request's response has become an event stream, the app takes its
connection over (:data:`DETACH`): a :class:`StreamConnection` then holds it instead of uvicorn's
protocol, request cycle, parser and task.
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import logging
import struct
import termios
import weakref
from collections.abc import Callable
from typing import Any

import httptools
import uvloop
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mcpd.common.config import Connections
from mcpd.front.refused import log_refusal

log = logging.getLogger(__name__)


class ConnectionCount:
    """Connections held, in total and per client address (a plain counter: one event loop)."""

    def __init__(self, limits: Connections) -> None:
        self.limits = limits
        self.total = 0
        self.by_address: collections.Counter[str] = collections.Counter()

    def admit(self, address: str) -> str | None:
        """Count one more connection from ``address``; ``None``, or (nothing counted) the cap it is
        over: ``"connections_total"`` or ``"connections_per_address"``."""
        if self.total >= self.limits.max_total:
            return "connections_total"
        if self.by_address[address] >= self.limits.max_per_address:
            return "connections_per_address"
        self.total += 1
        self.by_address[address] += 1
        return None

    def release(self, address: str) -> None:
        """Forget one admitted connection from ``address``."""
        self.total -= 1
        self.by_address[address] -= 1
        if self.by_address[address] <= 0:
            del self.by_address[address]


class Waiters:
    """``asyncio.Event``'s interface (``set``, ``clear``, ``is_set``, ``wait``) in 2 slots, for
    uvicorn's per-request message event and per-connection "writable" event: an ``asyncio.Event``
    keeps an empty ``collections.deque`` of waiters (760 bytes) for the connection's life; this
    keeps a list, made by the first wait. Same rule as ``asyncio.Event``: ``set`` wakes every
    waiter and later waits return at once until ``clear``."""

    __slots__ = ("_value", "_waiters")

    def __init__(self, value: bool = False) -> None:
        self._value = value
        self._waiters: list[asyncio.Future[bool]] | None = None

    def is_set(self) -> bool:
        """Whether set (and not cleared since)."""
        return self._value

    def set(self) -> None:
        """Set it and wake every waiter."""
        if not self._value:
            self._value = True
            for fut in self._waiters or ():
                if not fut.done():
                    fut.set_result(True)

    def clear(self) -> None:
        """Unset it: later waits block until the next :meth:`set`."""
        self._value = False

    async def wait(self) -> bool:
        """Return ``True`` once set (at once if it is)."""
        if self._value:
            return True
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(fut)
        try:
            await fut
            return True
        finally:
            self._waiters.remove(fut)


class Pipeline(list):  # type: ignore[type-arg]
    """uvicorn's queue of pipelined requests (``appendleft`` and ``pop``, oldest popped first) as a
    list: almost always empty, and an empty deque is 760 bytes, an empty list 56."""

    def appendleft(self, item: Any) -> None:
        """Queue ``item`` behind the others (``pop`` takes from the other end)."""
        self.insert(0, item)


class LeanFlowControl(FlowControl):
    """uvicorn's write flow control whose "writable" event (:class:`Waiters`) is made only when
    the transport first asks to pause writing: until then ``drain`` returns at once, as uvicorn's
    does while its event is set."""

    def __init__(self, transport: asyncio.Transport) -> None:  # (not FlowControl's: no Event)
        self._transport = transport
        self.read_paused = False
        self.write_paused = False
        self._is_writable_event: Any = None

    async def drain(self) -> None:
        if self._is_writable_event is not None:
            await self._is_writable_event.wait()

    def pause_writing(self) -> None:
        if not self.write_paused:
            self.write_paused = True
            if self._is_writable_event is None:
                self._is_writable_event = Waiters()
            self._is_writable_event.clear()

    def resume_writing(self) -> None:
        if self.write_paused:
            self.write_paused = False
            self._is_writable_event.set()


#: The scope key under which each GET and POST request's guarded protocol offers its connection:
#: a :class:`ConnectionOffer` (call it for a :class:`StreamConnection`, or ``None`` when the
#: connection cannot be handed over, see ``detach_stream`` in :func:`guarded_protocol`; or ask it
#: whether the client is behind, :meth:`ConnectionOffer.behind`, and drop the connection,
#: :meth:`ConnectionOffer.abort`: a large answer written in pieces).
DETACH = "mcpd.detach"

_FINAL_CHUNK = b"0\r\n\r\n"

#: The bytes of an answer a connection may hold uncounted: a larger answer, once written, is
#: charged what its connection still holds (:meth:`ConnectionOffer.unsent`); a smaller one costs
#: nothing more than its write (bounded in all by the connection caps).
UNSEEN = 64 * 1024

#: The largest write a stream hands its transport at once (bytes): a larger event goes in pieces of
#: this size, each once the transport takes writes (so a client that stops reading leaves at most
#: about one piece, plus the transport's high-water mark, in the transport, not the whole event).
PIECE = 256 * 1024


class StreamConnection(asyncio.Protocol):
    """A connection whose response is an event stream, once uvicorn's protocol handed it over: the
    response's headers are written, its body is chunked (``Transfer-Encoding: chunked``) and ends
    only when :meth:`end` is called or the client leaves. What it holds for an idle stream is this
    object and the transport, where uvicorn kept a protocol, a request cycle, a parser, the scope
    and the request's task.

    Writes are synchronous (:meth:`write`) while the transport takes them (:meth:`writable`); past
    its high-water mark the writer waits (:meth:`send` drains first). An event larger than
    :data:`PIECE` is handed to the transport a piece at a time, each once it takes writes (the
    rest from :meth:`resume_writing`; meanwhile the stream counts as paused): a client that stops
    reading leaves at most about a piece and the TLS layer's high-water mark in the transport,
    however large the event, and the event itself here (:meth:`held` says how much). Anything the client sends on
    the connection ends the stream: HTTP/1.1 could answer a request queued behind a response that
    never ends only never. When the server ends the stream (:meth:`end`), the last chunk is written
    and the connection closed: the response said ``Connection: close``, so no client reuses it.
    ``on_lost()`` is called once the stream is over: at once when the client sent data or its
    goodbye or the server ended the stream (the connection is then closing), else once the
    connection is gone (the client left, or the stream was aborted). The connection's count is
    released (``release()``) only once the connection is gone. ``on_progress()``, when set, is
    called each time the transport drained after a pause (the client took some of what it holds).

    Args:
        transport: the connection's transport, its response headers written.
        write_paused: whether the transport had asked to pause writing (before the hand-over).
        release: forgets the connection in the connection count; called once, when it is lost.
        peer: the client's address, for the log.
    """

    __slots__ = ("transport", "write_paused", "on_lost", "on_progress", "_release", "_resumed", "_peer", "_big",
                 "_poured")

    def __init__(self, transport: asyncio.Transport, write_paused: bool, release: Callable[[], None],
                 peer: str) -> None:
        self.transport = transport
        self.write_paused = write_paused
        self.on_lost: Callable[[], None] | None = None
        self.on_progress: Callable[[], None] | None = None
        self._release: Callable[[], None] | None = release
        self._resumed: asyncio.Future[None] | None = None  # made by the first wait for the transport
        self._peer = peer
        self._big: memoryview | None = None  # an event larger than PIECE, being written piece by piece
        self._poured = 0  # bytes of it written

    def writable(self) -> bool:
        """Whether a :meth:`write` now is taken without waiting (not paused, not closing)."""
        return not self.write_paused and not self.transport.is_closing()

    def write(self, data: bytes) -> None:
        """Write ``data`` (not empty) as one chunk of the response body (never blocks; a closing
        connection takes nothing). Past :data:`PIECE` bytes, the pieces the transport does not
        take now follow as it does (the stream is not :meth:`writable` until the last is written)."""
        if self.transport.is_closing():
            return
        size = len(data)
        if size <= PIECE:
            self.transport.write(b"%x\r\n%b\r\n" % (size, data))
            return
        self.transport.write(b"%x\r\n" % size)
        self._big, self._poured = memoryview(data), 0
        self._pour()

    def _pour(self) -> None:
        """Write the pieces of the large event while the transport takes them; its chunk's end
        after the last. Stops, the rest kept, when the transport asks to pause (or closes)."""
        big = self._big
        transport = self.transport
        while big is not None and not self.write_paused:
            if transport.is_closing():
                self._big = None
                return
            start = self._poured
            end = start + PIECE
            if end >= len(big):
                self._big = None
                transport.write(big[start:])
                transport.write(b"\r\n")
                return
            self._poured = end
            transport.write(big[start:end])

    def held(self) -> int:
        """Bytes this stream holds that the client has not taken: the large event being written
        (all of it: its pieces are views of it) and what the transport buffers."""
        big = self._big
        return (len(big) if big is not None else 0) + self.transport.get_write_buffer_size()

    async def send(self, data: bytes) -> None:
        """Wait until the transport takes writes, then :meth:`write` ``data``.

        Raises:
            ConnectionError: the connection was lost (nothing written).
        """
        while self.write_paused and not self.transport.is_closing():
            if self._resumed is None or self._resumed.done():
                self._resumed = asyncio.get_running_loop().create_future()
            await self._resumed
        if self.transport.is_closing():
            raise ConnectionError("the stream's connection is closed")
        self.write(data)

    def end(self) -> None:
        """Complete the response (its last chunk) and close the connection once that is written
        (the response said ``Connection: close``), then call ``on_lost``. While a large event is
        still being written its rest never will be: the connection is dropped (:meth:`abort`)."""
        if self._big is not None:
            self._big = None
            self.transport.abort()
        elif not self.transport.is_closing():
            self.transport.write(_FINAL_CHUNK)
            self.transport.close()
        self._over()

    async def finish(self) -> None:
        """:meth:`end`, for a writer that awaits (nothing to wait for: the transport flushes it)."""
        self.end()

    def abort(self) -> None:
        """Drop the connection without completing the response (writing it failed)."""
        self._big = None
        self.transport.abort()

    def _over(self) -> None:
        """The stream is over (the client sent data or its goodbye, or the server ended it): call
        ``on_lost`` now, not once the connection is gone (the TLS goodbye may wait up to its
        shutdown timeout for a client that stops answering: the session must not keep writing to,
        or waiting for, a closing connection meanwhile)."""
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            on_lost()

    # asyncio.Protocol
    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        log.info("connection from %s closed: it sent data on its event stream", self._peer)
        self.transport.close()
        self._over()

    def eof_received(self) -> bool:
        self._over()
        return False  # the client is done: close

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._big is not None:
            self._pour()  # (the transport may pause again: the stream is then still not writable)
        if not self.write_paused and self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)
        if self.on_progress is not None:
            self.on_progress()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()

    def _lost(self) -> None:
        """The stream is over: wake a waiting writer, release the count, call ``on_lost`` (once)."""
        self._big = None
        self.write_paused = False
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)
        release, self._release = self._release, None
        if release is not None:
            release()
        self._over()


class ConnectionOffer:
    """What a GET or POST request's guarded protocol offers the app (:data:`DETACH`), through a
    weak reference (the scope must not keep its protocol: the cycle would hold a closed
    connection's objects until the collector's next full pass).

    Calling it hands the connection over to a :class:`StreamConnection` (or returns ``None``:
    see ``detach_stream``; always for a POST, whose answer is not an event stream the app takes
    over); :meth:`behind` says whether the client is behind (the connection stopped taking
    writes); :meth:`abort` drops the connection, for a stream the server kept or an answer that
    must be cut (its request's ``receive`` then answers ``http.disconnect``)."""

    __slots__ = ("_protocol",)

    def __init__(self, protocol: HttpToolsProtocol) -> None:
        self._protocol = weakref.ref(protocol)

    def __eq__(self, other: object) -> bool:  # (the offers of one connection's requests are equal)
        return isinstance(other, ConnectionOffer) and other._protocol == self._protocol

    def __hash__(self) -> int:
        return hash(self._protocol)

    def __call__(self) -> StreamConnection | None:
        live: Any = self._protocol()
        return None if live is None else live.detach_stream()

    def behind(self) -> bool:
        """Whether the connection asked to pause writing (what it buffers passed its high-water
        mark: the client is not taking what was written); ``False`` once it is gone (the request's
        ``send`` then writes nothing and returns at once)."""
        live: Any = self._protocol()
        return live is not None and live.flow is not None and live.flow.write_paused

    def abort(self) -> None:
        """Drop the connection at once (no TLS goodbye, nothing more written)."""
        live = self._protocol()
        if live is not None and live.transport is not None:
            live.transport.abort()

    def unsent(self) -> int:
        """Bytes written to the connection that its client has not taken yet: what its transport
        buffers and what the kernel's socket still queues, unsent or unacknowledged (``SIOCOUTQ``:
        one system call); ``0`` once the connection is gone."""
        live: Any = self._protocol()
        if live is None or live.transport is None or live._timer is _UNCOUNTED:  # (released: gone)
            return 0
        sock = live.transport.get_extra_info("socket")
        try:
            queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        except (AttributeError, OSError):  # (no socket: closed)
            return 0
        return int(queued) + int(live.transport.get_write_buffer_size())


_UNCOUNTED = "uncounted"  # GuardedHttpToolsProtocol._timer of a connection not (or no longer) counted


def guarded_protocol(count: ConnectionCount,
                     on_refused: Callable[[str], None] = lambda kind: None) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with ``count``'s caps and the header and body deadlines.

    Deadlines (seconds, from ``count.limits``): ``header_seconds`` from the connection's start or a
    request's first byte to its last header; ``body_seconds`` from then to the body's last byte.
    A response that streams (SSE) is not limited: its request was complete. A request whose line
    and headers are still unfinished once ``max_header_bytes`` arrived is answered ``431`` and its
    connection closed: what the parser holds is bounded by the cap plus one read. Counted are the
    reads from the one that began the request (all of it: a request pipelined behind a large
    one may be counted its predecessor's bytes too) until the one that completes its headers.
    ``on_refused(kind)`` is called for each connection closed by a cap: ``connections_total``,
    ``connections_per_address``, ``header_deadline``, ``body_deadline`` or ``header_bytes``.
    """
    limits = count.limits
    # bytes received of each connection's request whose headers are still coming (keyed by the
    # protocol object's id: instances keep one attribute only, see below); -1 once refused
    header_bytes: dict[int, int] = {}
    # the cycle still answering on each connection with a request queued behind it (pipelined),
    # keyed as above: uvicorn tells only its latest cycle (the queued one) that the connection was
    # lost, so a response that waits for the client to leave (an event stream) would wait forever
    answering: dict[int, Any] = {}

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        # One instance attribute only: past 30 in all (uvicorn's own, this, and ``url``), an
        # instance's dict no longer shares its keys with the other instances' and costs 1.5 KiB
        # more, for every connection; ``url`` (uvicorn sets it first in ``on_message_begin``) is set
        # in ``__init__`` for the same reason: added after the instance is made, it too cost each
        # connection a dict of its own (measured with tracemalloc on Python 3.11). ``_timer``: the
        # deadline's timer; a pending deadline ``(loop time, kind)`` whose timer is made only if
        # the bytes received so far leave the request unfinished (a request that arrives whole, the
        # usual case, arms none); ``None`` when none is armed; or ``_UNCOUNTED`` (the class's
        # default): not admitted yet, refused, or released.
        _timer: Any = _UNCOUNTED

        def _peer(self) -> str:
            return self.client[0] if self.client else "unknown"

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.pipeline = Pipeline()  # type: ignore[assignment]
            self.url = b""  # (see above: uvicorn would add it with the first request)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.flow = LeanFlowControl(transport)  # (uvicorn's own, with its Event, is dropped at once)
            address = self._peer()
            over = count.admit(address)
            if over is not None:
                log.info("connection from %s closed: over %s", address, over.replace("_", " "))
                on_refused(over)
                transport.close()
                return
            self._timer = None
            self._arm(limits.header_seconds)
            self._start_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            header_bytes.pop(id(self), None)
            cycle = answering.pop(id(self), None)
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
            if self._timer is not _UNCOUNTED:
                self._disarm()
                count.release(self._peer())
                self._timer = _UNCOUNTED
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._timer is _UNCOUNTED:  # over a cap: closing, read nothing
                return
            key = id(self)
            seen = header_bytes.get(key)
            if seen is not None:  # the request's headers are still coming: count what arrives
                if seen < 0:
                    return  # refused: closing, read nothing
                header_bytes[key] = seen + len(data)
            super().data_received(data)
            now = header_bytes.get(key)
            if now == 0:  # a request began in this read, its headers unfinished: the whole read counts
                header_bytes[key] = now = len(data)
            if now is not None and now > limits.max_header_bytes:  # and they are still not all here
                self._refuse_oversized()
            self._start_timer()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            header_bytes[id(self)] = 0
            self._arm(limits.header_seconds)

        def on_headers_complete(self) -> None:
            header_bytes.pop(id(self), None)
            self._arm(limits.body_seconds, "body_deadline")
            if self.url[:1] not in (b"/", b"*"):  # absolute-form: its authority is the request's host
                self._host_from_target()
            before = self.cycle
            super().on_headers_complete()
            if self.cycle is not before:  # a new request's cycle (not an upgrade): nothing waits on it yet
                if before is not None and not before.response_complete:  # queued behind ``before``
                    answering.setdefault(id(self), before)  # (unless one queued earlier is behind it already)
                self.cycle.message_event = Waiters()  # type: ignore[assignment]
                method = self.scope["method"]
                # (a stream's request, or a POST whose answer may be large; a weak reference: no cycle)
                if method == "GET" or method == "POST":
                    self.scope[DETACH] = ConnectionOffer(self)  # type: ignore[literal-required]

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            super()._start_asgi_task(cycle, app)
            if cycle is self.cycle:  # the latest request: uvicorn tells it itself
                answering.pop(id(self), None)
            else:  # a queued request started, another still queued behind it
                answering[id(self)] = cycle

        def detach_stream(self) -> StreamConnection | None:
            """Hand the connection over to a :class:`StreamConnection`, which then writes the
            rest of the current response (an event stream, its headers written) and keeps the
            connection's count until it is lost. ``None`` (nothing changed) unless the request is
            complete, nothing follows it on the connection, reading is on, and the response has
            started, chunked, and not ended. uvicorn's protocol then lets go of the connection:
            the request's task ends quietly and the protocol, its cycle, scope and parser are freed.
            """
            cycle = self.cycle
            if (cycle is None or self._timer is not None or self.pipeline or id(self) in header_bytes
                    or self.flow.read_paused or not cycle.response_started or cycle.response_complete
                    or not cycle.chunked_encoding or self.transport.is_closing()):
                return None
            peer = self._peer()
            conn = StreamConnection(self.transport, self.flow.write_paused, lambda: count.release(peer), peer)
            self._timer = _UNCOUNTED  # the count is the stream's to release now
            self.connections.discard(self)
            cycle.response_complete = True  # (the app returns next: uvicorn then ends the task quietly)
            self.transport.set_protocol(conn)
            # (no cycle left for the collector: freed as soon as the request's task ends)
            self.cycle = self.parser = self.scope = None  # type: ignore[assignment]
            return conn

        def _host_from_target(self) -> None:
            """An absolute-form target (``POST https://host/message``) names the host: RFC 9112
            §3.2.2 says to use it and ignore ``Host``, so the request's ``host`` header becomes the
            target's authority (the ``allowed_hosts`` check then judges that). A target that is
            not a URL raises the parser's error, as uvicorn's own parse would (answered 400)."""
            url = httptools.parse_url(self.url)
            host = url.host or b""
            authority = (b"[" + host + b"]" if b":" in host else host) + (b":%d" % url.port if url.port else b"")
            self.headers[:] = [(k, v) for k, v in self.headers if k != b"host"] + [(b"host", authority)]

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def _refuse_oversized(self) -> None:
            """The request's line and headers, still unfinished, passed the cap: answer ``431``
            and close (nothing more of the connection is parsed)."""
            header_bytes[id(self)] = -1
            on_refused("header_bytes")
            text = f"request line and headers over {limits.max_header_bytes} bytes"
            # the refusal log's line, as for any refused request (the method and path as far as known)
            try:
                method = self.parser.get_method().decode("latin-1")
            except Exception:  # (the request line is not that far yet)
                method = "-"
            log_refusal(431, method, self.url.split(b"?", 1)[0].decode("latin-1") or "-", self.client, text)
            reason = text.encode("ascii")
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; "
                                 b"charset=utf-8\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                                 % (len(reason), reason))
            self.transport.close()

        def _arm(self, seconds: float, kind: str = "header_deadline") -> None:
            self._disarm()
            if self._timer is None:
                self._timer = (self.loop.time() + seconds, kind)

        def _start_timer(self) -> None:
            """Make the pending deadline's timer (the request is still unfinished)."""
            if type(self._timer) is tuple:
                when, kind = self._timer
                self._timer = self.loop.call_at(when, self._too_slow, kind)

        def _disarm(self) -> None:
            if self._timer is not None and self._timer is not _UNCOUNTED:
                if type(self._timer) is not tuple:
                    self._timer.cancel()
                self._timer = None

        def _too_slow(self, kind: str) -> None:
            self._timer = None
            if not self.transport.is_closing():
                log.info("connection from %s closed: past its %s", self._peer(), kind.replace("_", " "))
                on_refused(kind)
                self.transport.close()

    return GuardedHttpToolsProtocol


class GuardedLoop(uvloop.Loop):  # type: ignore[misc]
    """uvloop's loop whose TLS servers give up on a handshake after :attr:`handshake_seconds`."""

    handshake_seconds: float = 10.0

    async def create_server(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", self.handshake_seconds)
        return await super().create_server(*args, **kwargs)


def loop_factory(limits: Connections) -> Any:
    """A factory of :class:`GuardedLoop` with ``limits.handshake_seconds`` (for ``asyncio.Runner``)."""

    def make() -> GuardedLoop:
        loop = GuardedLoop()
        loop.handshake_seconds = limits.handshake_seconds
        return loop

    return make
