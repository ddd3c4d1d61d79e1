"""The HTTP+SSE transport (docs/REFERENCE.md §1.2–§1.5): the ``GET /sse`` and ``POST /message``
endpoints.

A session is born with its ``GET /sse`` stream and dies with it: the stream's end (client gone,
a client that stopped reading, server shutdown) closes the session at once, cancels its in-flight
requests and drops it from the table, so later POSTs get ``404``. The session, its bounded queue
and its backpressure are ``mcpd.front.sessions``; the stream's response is
``mcpd.front.transport.stream``.
"""

from __future__ import annotations

import asyncio
import re

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from mcpd.common.config import Config
from mcpd.front.auth import McpUser
from mcpd.front.mcp.dispatcher import Caller
from mcpd.front.oauth import needed_scopes, scope_refusal
from mcpd.front.sessions.table import SESSION_ID_RE, SessionManager, SessionRefused
from mcpd.front.transport.body import BodyRefused, read_json
from mcpd.front.transport.stream import SessionStream

_SESSION_QUERY_RE = re.compile(rb"session_id=[0-9a-f]{32}")  # a query string of one well-formed id


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
        """``GET /sse`` (docs/REFERENCE.md §1.2): open a session; ``503`` when ``max_sessions`` are open."""
        user: McpUser = request.user
        try:
            session = self.manager.open(user.principal, user.token)
        except SessionRefused as exc:
            return PlainTextResponse(exc.reason, status_code=exc.status)
        endpoint = f"{self.cfg.base_path}/message?session_id={session.id}"
        return SessionStream(session, self.manager, endpoint)

    async def message(self, request: Request) -> Response:
        """``POST /message?session_id=`` (docs/REFERENCE.md §1.3): validate, then hand the body to the session."""
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
        if user.principal.scopes is not None:  # an OAuth token: a privileged call needs files:privileged (403)
            refused = scope_refusal(self.cfg.oauth, user.principal, needed_scopes(payload))
            if refused is not None:
                return refused
        peer = f"{request.client.host}:{request.client.port}" if request.client else "unknown"
        if session.protocol.receive(payload, Caller(user.principal, user.token, peer)) is not None:
            # let the call start first: it reaches its worker (or the policy process) and runs there while
            # this request's 202 is written, rather than after it
            await asyncio.sleep(0)
        return Response(status_code=202)

