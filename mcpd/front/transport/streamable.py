"""The Streamable HTTP transport at ``/mcp`` (SPEC §1.6), beside the HTTP+SSE one of ``sse.py``.

Session era (protocol versions 2025-03-26 … 2025-11-25):

- ``POST /mcp`` with an ``initialize`` request and no ``Mcp-Session-Id`` opens a session in the
  one :class:`~mcpd.front.transport.sse.SessionManager` table (kind ``"mcp"``, so ``max_sessions``
  counts ``/sse`` and ``/mcp`` together) and answers with its id in ``Mcp-Session-Id``. Every later
  request names it; another principal's, an ended or an unknown id is ``404``, none is ``400``.
- A POST holding requests is answered with ``application/json`` (the reply), or with
  ``text/event-stream`` when the client accepts it and a request asked for progress
  (``_meta.progressToken``): the progress notifications, then the reply, then the stream ends.
  Only notifications and responses: ``202``.
- ``GET /mcp`` opens the session's stream for server messages (one at a time: ``409``); its end
  does not end the session. ``DELETE /mcp`` ends the session.
- ``MCP-Protocol-Version``: an unsupported value is ``400``; absent means the negotiated one.
- A session with no request and no GET stream for ``mcp_session_idle_seconds`` expires (``404``
  afterwards, so the client initializes again).

The JSON-RPC handling is the same :class:`~mcpd.front.protocol.McpSession` as ``/sse``'s: each
POST hands its body over with its own ``send``, so the replies and progress of that POST come
back on that POST's response. Authentication, the ``Origin`` check and the body cap are the same
middleware and helpers as for ``/sse``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from mcpd.common.config import Config
from mcpd.front.protocol import INVALID_REQUEST, SUPPORTED_VERSIONS, Caller, Message, error_reply
from mcpd.front.transport.body import BodyRefused, read_json
from mcpd.front.transport.sse import (
    SESSION_ID_RE, STREAM_HEADERS, McpUser, SessionManager, SessionStream, SseSession, encode_message,
)

log = logging.getLogger(__name__)

SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
SSE_TYPE = "text/event-stream"
JSON_TYPE = "application/json"


def _accepts(request: Request) -> set[str]:
    """The media types of the ``Accept`` header (``*/*`` and no header accept both of ours)."""
    header = request.headers.get("accept")
    if header is None:
        return {JSON_TYPE, SSE_TYPE}
    types = {part.split(";", 1)[0].strip().lower() for part in header.split(",")}
    if "*/*" in types or {"text/*", "application/*"} <= types:
        return {JSON_TYPE, SSE_TYPE}
    if "application/*" in types:
        types.add(JSON_TYPE)
    if "text/*" in types:
        types.add(SSE_TYPE)
    return types & {JSON_TYPE, SSE_TYPE}


def _members(payload: Any) -> list[Any]:
    return payload if isinstance(payload, list) else [payload]


def _is_request(msg: Any) -> bool:
    return isinstance(msg, dict) and "method" in msg and "id" in msg


def _wants_progress(msg: Any) -> bool:
    params = msg.get("params") if isinstance(msg, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and meta.get("progressToken") is not None


def _is_reply(msg: Any) -> bool:
    return isinstance(msg, list) or (isinstance(msg, dict) and "method" not in msg)


def _rpc_error(status: int, code: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """An HTTP error whose body is a JSON-RPC error without an id (what the specification allows)."""
    return JSONResponse(error_reply(None, code, message), status_code=status, headers=headers)


class PostStream:
    """The messages one POST's requests produce, in order, bounded like a session's queue.

    ``put`` is the ``send`` handed to :meth:`McpSession.receive`; past ``limit`` queued messages
    the client has stopped reading, and the stream is cut (``overflowed``).
    """

    def __init__(self, limit: int) -> None:
        self._items: collections.deque[Message | list[Message]] = collections.deque()
        self._limit = limit
        self._ready = asyncio.Event()
        self.overflowed = False

    def put(self, message: Any) -> None:
        """Queue one message (never blocks)."""
        if self.overflowed:
            return
        if len(self._items) >= self._limit:
            self.overflowed = True
        else:
            self._items.append(message)
        self._ready.set()

    def drain(self) -> list[Any]:
        """Take everything queued so far."""
        items = list(self._items)
        self._items.clear()
        self._ready.clear()
        return items

    async def wait(self, task: asyncio.Task[Any]) -> None:
        """Wait until something is queued or ``task`` ends."""
        waiter = asyncio.ensure_future(self._ready.wait())
        try:
            await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()


class StreamableTransport:
    """``GET``, ``POST`` and ``DELETE /mcp`` over the shared :class:`SessionManager`.

    Args:
        cfg: the daemon config (``max_body_bytes``, ``keepalive_seconds``, ``session_queue_size``).
        manager: the session table shared with ``/sse``.
    """

    def __init__(self, cfg: Config, manager: SessionManager) -> None:
        self.cfg = cfg
        self.manager = manager

    def routes(self) -> list[Route]:
        """The one MCP endpoint."""
        return [Route("/mcp", self.endpoint, methods=["GET", "POST", "DELETE"])]

    async def endpoint(self, request: Request) -> Response:
        """Dispatch on the method (the route admits only GET, POST and DELETE)."""
        if request.method == "POST":
            return await self.post(request)
        if request.method == "GET":
            return await self.get(request)
        return await self.delete(request)

    # -- session lookup ---------------------------------------------------------------------------

    def _session(self, request: Request) -> SseSession | Response:
        """The caller's session named by ``Mcp-Session-Id``, or the error answer (400/404)."""
        sid = request.headers.get(SESSION_HEADER)
        if sid is None:
            return _rpc_error(400, INVALID_REQUEST, f"{SESSION_HEADER} header required")
        if not SESSION_ID_RE.fullmatch(sid):
            return _rpc_error(400, INVALID_REQUEST, f"malformed {SESSION_HEADER}")
        user: McpUser = request.user
        session = self.manager.find(sid, user.principal, kind="mcp")
        if session is None:
            return _rpc_error(404, INVALID_REQUEST, "no such session")
        session.last_active = time.monotonic()
        return session

    @staticmethod
    def _version_refused(request: Request) -> Response | None:
        """``400`` for an ``MCP-Protocol-Version`` this server does not speak (absent is fine)."""
        version = request.headers.get(VERSION_HEADER)
        if version is not None and version not in SUPPORTED_VERSIONS:
            return _rpc_error(400, INVALID_REQUEST, f"unsupported {VERSION_HEADER}: supported are "
                              + ", ".join(SUPPORTED_VERSIONS))
        return None

    # -- methods ----------------------------------------------------------------------------------

    async def get(self, request: Request) -> Response:
        """``GET /mcp``: the session's stream for server messages (``409`` if one is open)."""
        if SSE_TYPE not in _accepts(request):
            return PlainTextResponse(f"Accept must include {SSE_TYPE}", status_code=406)
        refused = self._version_refused(request)
        if refused is not None:
            return refused
        session = self._session(request)
        if isinstance(session, Response):
            return session
        if session.stream_open:
            return _rpc_error(409, INVALID_REQUEST, "this session already has a GET stream")
        return SessionStream(session, self.manager, None, self.cfg.keepalive_seconds, close_on_end=False)

    async def delete(self, request: Request) -> Response:
        """``DELETE /mcp``: end the session (its requests are cancelled; ``404`` afterwards)."""
        session = self._session(request)
        if isinstance(session, Response):
            return session
        self.manager.close(session)
        return Response(status_code=200)

    async def post(self, request: Request) -> Response:
        """``POST /mcp``: one JSON-RPC message (or a batch) of the session era."""
        accepts = _accepts(request)
        if not accepts:
            return PlainTextResponse(f"Accept must include {JSON_TYPE} or {SSE_TYPE}", status_code=406)
        try:
            payload = await read_json(request, self.cfg.max_body_bytes)
        except BodyRefused as exc:
            return exc.response()
        refused = self._version_refused(request)
        if refused is not None:
            return refused
        user: McpUser = request.user
        headers: dict[str, str] = {}
        opened = False
        if request.headers.get(SESSION_HEADER) is None and isinstance(payload, dict) \
                and payload.get("method") == "initialize":
            session = self.manager.open(user.principal, user.token, kind="mcp")
            if session is None:
                return _rpc_error(503, INVALID_REQUEST, "too many sessions")
            opened = True
        else:
            found = self._session(request)
            if isinstance(found, Response):
                return found
            session = found
        headers[SESSION_HEADER] = session.id
        peer = f"{request.client.host}:{request.client.port}" if request.client else "unknown"
        caller = Caller(user.principal, user.token, peer)
        members = _members(payload)
        stream = SSE_TYPE in accepts and any(_is_request(m) and _wants_progress(m) for m in members)
        if stream:
            return EventSourceResponse(
                self._events(session, payload, caller), headers={**STREAM_HEADERS, **headers},
                ping=self.cfg.keepalive_seconds, sep="\n",
                ping_message_factory=lambda: ServerSentEvent(comment="ping", sep="\n"),
            )
        out = PostStream(self.cfg.session_queue_size)
        task = session.protocol.receive(payload, caller, out.put)
        if task is not None:
            await asyncio.wait({task})
        replies = [m for m in out.drain() if _is_reply(m)]
        if opened and not (replies and "result" in replies[0]):
            self.manager.close(session)  # a failed initialize leaves no session behind
            headers.pop(SESSION_HEADER)
        if not replies:
            if task is not None and task.cancelled():
                return _rpc_error(404, INVALID_REQUEST, "session ended", headers)
            return Response(status_code=202, headers=headers)
        reply = replies[0]
        status = 400 if isinstance(reply, dict) and reply.get("id") is None and "error" in reply else 200
        if JSON_TYPE not in accepts:  # an SSE-only client: the reply as a one-event stream
            return EventSourceResponse(_once(reply), headers={**STREAM_HEADERS, **headers}, sep="\n")
        return JSONResponse(reply, status_code=status, headers=headers)

    async def _events(self, session: SseSession, payload: Any, caller: Caller) -> AsyncIterator[ServerSentEvent]:
        """One POST's response stream: its requests' progress, then the reply, then the end.

        The client going away is not a cancellation in this era (it sends
        ``notifications/cancelled`` for that); a client that stops reading is cut off.
        """
        out = PostStream(self.cfg.session_queue_size)
        task = session.protocol.receive(payload, caller, out.put)
        if task is None:
            return
        while True:
            await out.wait(task)
            done = task.done()  # then every message of the task is queued already
            for message in out.drain():
                yield ServerSentEvent(event="message", data=encode_message(message), sep="\n")
            if out.overflowed:
                log.warning("session %s: a POST stream's client stopped reading; cut off", session.id)
                return
            if done:
                return


async def _once(message: Any) -> AsyncIterator[ServerSentEvent]:
    yield ServerSentEvent(event="message", data=encode_message(message), sep="\n")
