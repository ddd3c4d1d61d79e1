"""The Streamable HTTP transport at ``/mcp`` (docs/REFERENCE.md §1.6), beside the HTTP+SSE one of ``sse.py``.

Session era (protocol versions 2025-03-26 … 2025-11-25):

- ``POST /mcp`` with an ``initialize`` request and no ``Mcp-Session-Id`` opens a session in the
  one :class:`~mcpd.front.sessions.table.SessionManager` table (kind ``"mcp"``, so ``max_sessions``
  counts ``/sse`` and ``/mcp`` together) and answers with its id in ``Mcp-Session-Id``. Every later
  request names it; another principal's, an ended or an unknown id is ``404``, none is ``400``.
- A POST holding requests is answered with ``application/json`` (the reply), or with
  ``text/event-stream`` when the client accepts it and a request asked for progress
  (``_meta.progressToken``): the progress notifications, then the reply, then the stream ends.
  Only notifications and responses: ``202``.
- ``GET /mcp`` opens the session's stream for server messages (one at a time: ``409``); its end
  does not end the session. ``DELETE /mcp`` ends the session.
- ``MCP-Protocol-Version``: an unsupported value is ``400`` on GET, POST and DELETE alike (checked
  with the session lookup); absent means the negotiated one.
- ``Accept`` is read with its weights (:mod:`mcpd.front.transport.accept`): ``q=0`` refuses a type;
  a malformed header is ``400``. Every refusal answered here has a JSON-RPC error body
  (:func:`~mcpd.front.transport.body.rpc_refusal`), ``406``, ``413`` and ``415`` included;
  refusals of a POST holding one request carry its id, all others ``id: null``.
- A session with no request and no GET stream for ``mcp_session_idle_seconds`` expires (``404``
  afterwards, so the client initializes again).

Stateless era (2026-07-28): a POST whose ``_meta`` names a protocol version (or that carries no
session and names an ``MCP-Protocol-Version`` outside the session era) is one self-contained
request, served by a one-request :class:`~mcpd.front.mcp.session.McpSession` in modern mode, and no
session is minted. The body must be one object with ``jsonrpc`` ``"2.0"`` and a string ``method``
(else ``400``, ``-32600``). Before it runs, :func:`~mcpd.front.transport.modern.check_modern` holds
the headers against the body:
``_meta`` version and client capabilities present (``400``, ``-32602``), ``MCP-Protocol-Version``
equal to the ``_meta`` one, ``Mcp-Method`` equal to the method and ``Mcp-Name`` (plain or
``=?base64?…?=``) equal to ``params.name``/``params.uri`` (``400``, ``-32020``), a version served
(``400``, ``-32022`` listing them). An unknown method is ``404`` with ``-32601``. The client closing
the response (a stream, or the connection of a JSON answer) cancels the request.

The JSON-RPC handling is the same :class:`~mcpd.front.mcp.session.McpSession` as ``/sse``'s: each
POST hands its body over with its own ``send``, so the replies and progress of that POST come
back on that POST's response, written by ``answers.py``. Authentication, the ``Origin`` check and
the body cap are the same middleware and functions as for ``/sse``.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from mcpd.common.config import Config
from mcpd.front.auth import McpUser
from mcpd.front.connections.handover import DETACH
from mcpd.front.events import STREAM_HEADERS, event_of
from mcpd.front.mcp.confirm import may_elicit
from mcpd.front.mcp.dispatcher import Caller
from mcpd.front.mcp.jsonrpc import INVALID_REQUEST, METHOD_NOT_FOUND, valid_id
from mcpd.front.mcp.session import McpSession
from mcpd.front.mcp.versions import SUPPORTED_VERSIONS
from mcpd.front.oauth import needed_scopes, scope_refusal
from mcpd.front.sessions.session import Session
from mcpd.front.sessions.table import SESSION_ID_RE, SessionManager, SessionRefused
from mcpd.front.transport.accept import MalformedAccept, acceptable
from mcpd.front.transport.answers import PiecedAnswer, PostStream, Queued, disconnected, post_events
from mcpd.front.transport.body import BodyRefused, read_json, rpc_refusal
from mcpd.front.transport.modern import VERSION_HEADER, HeaderRefused, check_modern, modern_version, one_header
from mcpd.front.transport.stream import SessionStream

SESSION_HEADER = "Mcp-Session-Id"
SSE_TYPE = "text/event-stream"
JSON_TYPE = "application/json"


def _accepts(request: Request, needed: tuple[str, ...]) -> set[str] | Response:
    """Which of ``needed`` (our media types) the ``Accept`` header accepts (a weight above 0:
    :mod:`mcpd.front.transport.accept`), or the refusal: ``406`` when it accepts none of them,
    ``400`` (``-32600``) when the header is malformed."""
    try:
        types = acceptable(request.headers.getlist("accept"), needed)
    except MalformedAccept as exc:
        return rpc_refusal(400, INVALID_REQUEST, f"malformed Accept header: {exc}")
    if not types:
        return rpc_refusal(406, INVALID_REQUEST, "Accept must include " + " or ".join(needed))
    return types


def _members(payload: Any) -> list[Any]:
    return payload if isinstance(payload, list) else [payload]


def _is_request(msg: Any) -> bool:
    return isinstance(msg, dict) and "method" in msg and "id" in msg


def _wants_progress(msg: Any) -> bool:
    params = msg.get("params") if isinstance(msg, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and meta.get("progressToken") is not None


def request_id(payload: Any) -> Any:
    """The id an error answer to ``payload`` (a parsed POST body) carries: the id of a single
    request object when it is a valid one (:func:`~mcpd.front.mcp.jsonrpc.valid_id`), else ``None``
    (a batch, a notification, an invalid id, a client response: an object with no ``method`` and a
    ``result`` or ``error``, whose id names no request of the client's), as JSON-RPC 2.0 wants
    whenever the id could be read."""
    if not isinstance(payload, dict) or not valid_id(payload.get("id")):
        return None
    if "method" not in payload and ("result" in payload or "error" in payload):
        return None
    return payload["id"]


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
        """Dispatch on the method (the route admits GET, POST and DELETE, and HEAD, which Starlette
        adds to every GET route: it is a GET answered with headers only, never a DELETE)."""
        if request.method == "POST":
            return await self.post(request)
        if request.method in ("GET", "HEAD"):
            return await self.get(request)
        return await self.delete(request)

    def _post_stream(self, replies_only: bool = False, owner: str | None = None,
                     drop: Callable[[], None] | None = None) -> PostStream:
        """A POST's bounded outgoing queue (``session_queue_size`` messages, ``session_queue_bytes``),
        charged to principal ``owner``'s and the total outgoing budgets when given (an event
        stream: a JSON answer holds its one reply only while the POST waits for it)."""
        return PostStream(self.cfg.session_queue_size, self.cfg.session_queue_bytes, replies_only,
                          None if owner is None else self.manager, owner or "", drop)

    def _answer(self, reply: Queued, accepts: set[str], owner: str, session_id: str | None = None,
                headers: dict[str, str] | None = None, held: PostStream | None = None) -> Response:
        """A POST's answer of one reply (already encoded): JSON (``400`` for an error without an
        id), or one event for a client that accepts only event streams; a :class:`PiecedAnswer`
        (charged to principal ``owner``'s and the total budgets while its client is behind).
        ``session_id``: the session the POST named, for the log. ``held``: the POST's stream that
        charges the reply's bytes (released once the answer is written)."""
        data = reply.data
        if JSON_TYPE not in accepts:  # an SSE-only client: the reply as a one-event stream
            return PiecedAnswer(event_of(data), 200, {**STREAM_HEADERS, **(headers or {})}, SSE_TYPE,
                                self.manager, owner, session_id, held)
        return PiecedAnswer(data, 400 if reply.refused else 200, headers, JSON_TYPE, self.manager, owner, session_id,
                            held)

    # -- session lookup ---------------------------------------------------------------------------

    def _session(self, request: Request, rid: Any = None) -> Session | Response:
        """The caller's session named by ``Mcp-Session-Id``, or the error answer with id ``rid``:
        first :meth:`_version_refused` (so every request naming a session, GET, POST and DELETE
        alike, has its ``MCP-Protocol-Version`` checked), then ``400`` for a missing, repeated
        or malformed ``Mcp-Session-Id``, ``404`` for an unknown, ended or other principal's one."""
        refused = self._version_refused(request, rid)
        if refused is not None:
            return refused
        try:
            sid = one_header(request.headers, SESSION_HEADER, INVALID_REQUEST)
        except HeaderRefused as exc:
            return rpc_refusal(exc.status, exc.code, exc.message, rid=rid)
        if sid is None:
            return rpc_refusal(400, INVALID_REQUEST, f"{SESSION_HEADER} header required", rid=rid)
        if not SESSION_ID_RE.fullmatch(sid):
            return rpc_refusal(400, INVALID_REQUEST, f"malformed {SESSION_HEADER}", rid=rid)
        user: McpUser = request.user
        session = self.manager.find(sid, user.principal, kind="mcp")
        if session is None:
            return rpc_refusal(404, INVALID_REQUEST, "no such session", rid=rid)
        session.last_active = time.monotonic()
        return session

    @staticmethod
    def _version_refused(request: Request, rid: Any = None) -> Response | None:
        """The session era's ``MCP-Protocol-Version`` check: ``400`` (``-32600``, id ``rid``) for
        a value this server does not speak in that era, or the header sent twice; absent is fine
        (the negotiated version)."""
        try:
            version = one_header(request.headers, VERSION_HEADER, INVALID_REQUEST)
        except HeaderRefused as exc:
            return rpc_refusal(exc.status, exc.code, exc.message, rid=rid)
        if version is not None and version not in SUPPORTED_VERSIONS:
            return rpc_refusal(400, INVALID_REQUEST, f"unsupported {VERSION_HEADER}: supported are "
                              + ", ".join(SUPPORTED_VERSIONS), rid=rid)
        return None

    # -- methods ----------------------------------------------------------------------------------

    async def get(self, request: Request) -> Response:
        """``GET /mcp``: the session's stream for server messages (``409`` if one is open)."""
        accepts = _accepts(request, (SSE_TYPE,))
        if isinstance(accepts, Response):
            return accepts
        session = self._session(request)
        if isinstance(session, Response):
            return session
        if session.stream_open:
            return rpc_refusal(409, INVALID_REQUEST, "this session already has a GET stream")
        return SessionStream(session, self.manager, None, close_on_end=False)

    async def delete(self, request: Request) -> Response:
        """``DELETE /mcp``: end the session (its requests are cancelled; ``404`` afterwards)."""
        session = self._session(request)
        if isinstance(session, Response):
            return session
        self.manager.close(session)
        return Response(status_code=200)

    async def post(self, request: Request) -> Response:
        """``POST /mcp``: one JSON-RPC message (or a batch) of the session era, or one request of
        the stateless era (:meth:`_stateless`), told apart as the module docstring says."""
        accepts = _accepts(request, (JSON_TYPE, SSE_TYPE))
        if isinstance(accepts, Response):
            return accepts
        try:
            payload = await read_json(request, self.cfg.max_body_bytes)
        except BodyRefused as exc:
            return exc.response(always_rpc=True)
        user: McpUser = request.user
        if user.principal.scopes is not None:  # an OAuth token: a privileged call needs files:privileged (403)
            refused = scope_refusal(self.cfg.oauth, user.principal, needed_scopes(payload))
            if refused is not None:
                return refused
        sid = request.headers.get(SESSION_HEADER)
        is_initialize = isinstance(payload, dict) and payload.get("method") == "initialize"
        header_version = request.headers.get(VERSION_HEADER)
        if modern_version(payload) is not None or (
                sid is None and not is_initialize and header_version is not None
                and header_version not in SUPPORTED_VERSIONS):
            return await self._stateless(request, payload, accepts, user)
        rid = request_id(payload)
        headers: dict[str, str] = {}
        opened = False
        if sid is None and is_initialize:
            refused = self._version_refused(request, rid)
            if refused is not None:
                return refused
            try:
                session = self.manager.open(user.principal, user.token, kind="mcp")
            except SessionRefused as exc:
                return rpc_refusal(exc.status, INVALID_REQUEST, exc.reason, rid=rid)
            opened = True
        else:
            found = self._session(request, rid)
            if isinstance(found, Response):
                return found
            session = found
        headers[SESSION_HEADER] = session.id
        peer = f"{request.client.host}:{request.client.port}" if request.client else "unknown"
        caller = Caller(user.principal, user.token, peer, self._origin(request))
        members = _members(payload)
        # (an initialize is answered as JSON: a failed one must not leave its session behind)
        # (an event stream too for a call that may ask its client to open a page: mcpd.front.confirm)
        if not opened and SSE_TYPE in accepts and any(_is_request(m) and (_wants_progress(m) or may_elicit(
                session.protocol.client_capabilities, m)) for m in members):
            return self._event_response(self._events(session, payload, caller, _drop(request)), headers)
        out = self._post_stream(replies_only=True, owner=user.principal.name, drop=_drop(request))
        task = session.protocol.receive(payload, caller, out.put)
        if task is not None:
            await asyncio.wait({task})
        replies = out.drain()
        if opened and not (replies and replies[0].result):
            self.manager.close(session)  # a failed initialize leaves no session behind
            headers.pop(SESSION_HEADER)
        if not replies:
            out.close()
            if task is not None and task.cancelled() and session.closed:
                return rpc_refusal(404, INVALID_REQUEST, "session ended", rid, headers=headers)
            # (a request cancelled by notifications/cancelled gets no reply: 202, the session lives)
            return Response(status_code=202, headers=headers)
        return self._answer(replies[0], accepts, user.principal.name, session.id, headers, out)

    def _origin(self, request: Request) -> str:
        """``https://`` and the request's ``Host`` (held to ``allowed_hosts`` already) and the base
        path: where the confirmation page of a call is (mcpd.front.confirm)."""
        host = request.headers.get("host", "")
        return f"https://{host}{self.cfg.base_path}" if host else ""

    async def _stateless(self, request: Request, payload: Any, accepts: set[str], user: McpUser) -> Response:
        """One 2026-07-28 request: checked by :func:`check_modern`, run, answered; no session."""
        rid = request_id(payload)
        if not isinstance(payload, dict) or not isinstance(payload.get("method"), str) \
                or payload.get("jsonrpc") != "2.0":
            return rpc_refusal(400, INVALID_REQUEST, 'the body must be one JSON-RPC request or notification '
                               '(jsonrpc "2.0", a string method)', rid=rid)
        if "id" not in payload:
            return Response(status_code=202)  # no client notification means anything over HTTP here
        try:
            check_modern(request.headers, payload)
        except HeaderRefused as exc:
            return rpc_refusal(exc.status, exc.code, exc.message, rid, exc.data)
        protocol = McpSession(self.manager.dispatcher, secrets.token_hex(16), _discard, modern=True,
                              budget=self.manager)
        if not protocol.knows(payload["method"]):
            return rpc_refusal(404, METHOD_NOT_FOUND, "method not found", rid)
        peer = f"{request.client.host}:{request.client.port}" if request.client else "unknown"
        caller = Caller(user.principal, user.token, peer, self._origin(request))
        if SSE_TYPE in accepts and _wants_progress(payload):
            out = self._post_stream(owner=caller.principal.name, drop=_drop(request))
            return self._event_response(post_events(protocol, payload, caller, out, self.cfg.keepalive_seconds,
                                                    "stateless", cancel_on_close=True))
        out = self._post_stream(replies_only=True, owner=user.principal.name, drop=_drop(request))
        task = protocol.receive(payload, caller, out.put)
        if task is None:
            out.close()
            return Response(status_code=202)
        gone = asyncio.ensure_future(disconnected(request.receive))
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not task.done():  # the client left: closing is cancelling in this era
                protocol.close()
        replies = out.drain()
        if not replies:
            out.close()
            return Response(status_code=202)
        return self._answer(replies[0], accepts, user.principal.name, held=out)

    def _event_response(self, events: AsyncIterator[bytes], headers: dict[str, str] | None = None,
                        ) -> EventSourceResponse:
        """A POST answered as an event stream. Its keep-alive comments come from ``events`` itself
        (:func:`~mcpd.front.transport.answers.post_events`), not from the response's own ticker, which could write one between the
        pieces of a large event."""
        return EventSourceResponse(events, headers={**STREAM_HEADERS, **(headers or {})}, ping=0, sep="\n")

    def _events(self, session: Session, payload: Any, caller: Caller,
                drop: Callable[[], None] | None = None) -> AsyncIterator[bytes]:
        """One session-era POST's response stream. The client going away is not a cancellation
        in this era (it sends ``notifications/cancelled`` for that)."""
        out = self._post_stream(owner=caller.principal.name, drop=drop)
        return post_events(session.protocol, payload, caller, out, self.cfg.keepalive_seconds, session.id,
                           cancel_on_close=False)


def _drop(request: Request) -> Callable[[], None] | None:
    """What drops the request's connection (the server's offer), if it offers one."""
    offer = request.scope.get(DETACH)
    return None if offer is None else offer.abort


def _discard(message: Any) -> None:
    """The ``send`` of a one-request session: every message goes to that request's own response."""
