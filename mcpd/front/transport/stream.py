"""A session's GET stream as an HTTP response: ``GET /sse`` (whose end closes its session) and
``GET /mcp`` (the session outlives it). :class:`SessionStream` starts the response and binds the
stream to its session, which then writes its queued events to it (``mcpd.front.sessions.session``):
through the request's ASGI ``send`` (:class:`AsgiStream`), or on the connection itself once the
server handed it over (``mcpd.front.connections.handover.StreamConnection``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from mcpd.front.connections.handover import PIECE
from mcpd.front.events import STREAM_HEADERS, pieces
from mcpd.front.sessions.session import Session
from mcpd.front.sessions.table import SessionManager

if TYPE_CHECKING:
    from mcpd.front.connections.handover import StreamConnection

#: The ASGI scope key under which the front's app (``mcpd.front.app.FrontApp``) offers to run a
#: session's stream itself, once the middleware and routing frames have returned: a list that
#: :class:`SessionStream` appends itself to.
HANDOFF = "mcpd.stream_handoff"


_CLOSE = (b"connection", b"close")


class SessionStream(Response):
    """A session's GET stream: ``GET /sse``, whose end closes its session (docs/REFERENCE.md
    §1.2, §1.4), or ``GET /mcp`` (``endpoint`` ``None``, ``close_on_end`` false: the session
    outlives it).

    The response is started through the middleware like any other; the stream itself (:meth:`run`)
    is then run by the app's outermost layer when the scope offers it (:data:`HANDOFF`), so an open
    stream holds none of the middleware's and router's frames, only a wait for the client's
    disconnect: queued events are written by the session's short-lived writer task
    (:meth:`Session.attach`) and keep-alive comments come from the manager's ticker (an idle
    session holds little). Server shutdown closes the sessions first
    (:meth:`SessionManager.close_all`), which ends every stream.

    Args:
        session: the session whose queue feeds the stream.
        manager: its table.
        endpoint: the ``endpoint`` event's data, or ``None`` for no such event.
        close_on_end: close the session when the stream ends.
        headers: extra response headers.
    """

    media_type = "text/event-stream; charset=utf-8"

    def __init__(self, session: Session, manager: SessionManager, endpoint: str | None,
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
        :class:`~mcpd.front.connections.handover.ConnectionOffer`) hands it over, and the session writes to
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


def end_stream(session: Session, manager: SessionManager, close_session: bool) -> None:
    """A session's stream is over: detach it, and close the session (when ``close_session``: a
    ``GET /sse`` stream) or only mark it active now (``GET /mcp``: the session outlives it)."""
    session.detach()
    session.last_active = time.monotonic()
    if close_session:
        manager.close(session)


class AsgiStream:
    """A stream written through its request's ASGI ``send``: the stream's task (the one running
    :meth:`SessionStream.run`) waits for the client; events go through :meth:`send`, never at once.

    Args:
        send: the request's ASGI ``send``, the response started.
        task: the stream's task, cancelled by :meth:`abort` when there is no ``drop``.
        drop: drops the stream's connection (the server's offer,
            :meth:`~mcpd.front.connections.handover.ConnectionOffer.abort`): :meth:`abort` then cuts the
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
