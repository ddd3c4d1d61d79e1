"""A client connection offered to the app by the guarded protocol (``guarded.py``): a GET's
event stream takes the connection over (:class:`StreamConnection` then holds it instead of
uvicorn's protocol, request cycle, parser and task), and a POST's large answer asks whether its
client is behind, how much it has not taken, or drops it (:class:`ConnectionOffer`). Also the
sizes every writer of a large event or answer keeps to (:data:`PIECE`, :data:`UNSEEN`)."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mcpd.common import frames

log = logging.getLogger(__name__)

#: The scope key under which each GET and POST request's guarded protocol offers its connection:
#: a :class:`ConnectionOffer` (call it for a :class:`StreamConnection`, or ``None`` when the
#: connection cannot be handed over, see ``detach_stream`` in :func:`~mcpd.front.connections.guarded.guarded_protocol`; or ask it
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
        if live is None or live.transport is None or live._timer is UNCOUNTED:  # (released: gone)
            return 0
        sock = live.transport.get_extra_info("socket")
        try:
            queued = frames.queued_bytes(sock.fileno())
        except (AttributeError, OSError):  # (no socket: closed)
            return 0
        return int(queued) + int(live.transport.get_write_buffer_size())



#: The guarded protocol's ``_timer`` of a connection not (or no longer) counted: not admitted yet,
#: refused, released, or handed over to a :class:`StreamConnection`.
UNCOUNTED = "uncounted"
