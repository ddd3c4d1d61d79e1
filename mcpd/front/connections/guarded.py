"""Bounds on client connections (docs/REFERENCE.md §1.7): the caps of ``count.py``, and
deadlines for the TLS handshake, a request's headers and its body.

uvicorn has a keep-alive timeout (``connections.idle_seconds`` is passed to it) but none for a
client that trickles its headers or body, and no per-address count. :func:`guarded_protocol`
returns uvicorn's httptools protocol class with those added, its per-connection objects the lean
ones of ``lean.py``, and the offer of its connection to the app (``handover.py``);
:class:`GuardedLoop` is uvloop's event loop with a TLS handshake deadline on every server it
creates. A connection over a count, or past a deadline, is closed: it never holds a slot or
delays anyone else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httptools
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mcpd.common.config import Connections
from mcpd.front.connections.count import ConnectionCount
from mcpd.front.connections.handover import DETACH, UNCOUNTED, ConnectionOffer, StreamConnection
from mcpd.front.connections.lean import LeanFlowControl, Pipeline, Waiters
from mcpd.front.refused import log_refusal

log = logging.getLogger(__name__)


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
        # usual case, arms none); ``None`` when none is armed; or ``UNCOUNTED`` (the class's
        # default): not admitted yet, refused, or released.
        _timer: Any = UNCOUNTED

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
            if self._timer is not UNCOUNTED:
                self._disarm()
                count.release(self._peer())
                self._timer = UNCOUNTED
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._timer is UNCOUNTED:  # over a cap: closing, read nothing
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
            self._timer = UNCOUNTED  # the count is the stream's to release now
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
            if self._timer is not None and self._timer is not UNCOUNTED:
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
