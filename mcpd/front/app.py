"""The front's ASGI application: routes plus the middleware stack, assembled in :func:`build_app`.

Order of the stack, outermost first (read it top to bottom in :func:`build_app`):

1. ``OriginMiddleware`` — an ``Origin`` header not in ``allowed_origins`` → ``403`` (SPEC §1.3).
2. ``AuthenticationMiddleware`` with :class:`BearerBackend` — no or bad bearer token on any route
   → ``401`` with ``WWW-Authenticate: Bearer`` (SPEC §1.3); tokens in the query string are ignored.
3. The router: ``GET /sse`` and ``POST /message`` (``mcpd.front.transport.sse``), ``GET``, ``POST``
   and ``DELETE /mcp`` (``mcpd.front.transport.streamable``), ``POST /login`` and
   ``POST /logout`` (``mcpd.front.transport.login``; ``/login`` alone needs no bearer), at the root and,
   when set, also under ``base_path``.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, AuthenticationError
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from mcpd.front.auth import Authenticator, parse_bearer
from mcpd.common.config import Config
from mcpd.front.protocol import Dispatcher
from mcpd.front.transport.login import LoginBackend, LoginRoutes, NoLogin
from mcpd.front.transport.sse import McpUser, SessionManager, Transport
from mcpd.front.transport.streamable import StreamableTransport


class OriginMiddleware:
    """Refuse requests whose ``Origin`` header is present and not allowed (SPEC §1.3: ``403``).

    Args:
        app: the wrapped ASGI app.
        allowed_origins: exact ``Origin`` values accepted (scheme://host[:port]); empty allows none.
    """

    def __init__(self, app: ASGIApp, allowed_origins: tuple[str, ...]) -> None:
        self.app = app
        self.allowed = frozenset(allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            origins = [v for k, v in scope["headers"] if k == b"origin"]
            if origins and any(o.decode("latin-1") not in self.allowed for o in origins):
                await PlainTextResponse("origin not allowed", status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BearerBackend(AuthenticationBackend):
    """Starlette authentication backend for ``Authorization: Bearer TOKEN`` (SPEC §1.3, §5.1).

    Raises ``AuthenticationError`` (→ 401) for a missing, malformed, unknown or expired token.
    """

    def __init__(self, authenticator: Authenticator, open_paths: frozenset[str] = frozenset()) -> None:
        self.authenticator = authenticator
        self.open_paths = open_paths

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, McpUser] | None:
        token = parse_bearer(conn.headers.get("authorization"))
        if token is None and conn.scope.get("path") in self.open_paths:
            return None  # POST /login: the password is the credential (SPEC §5.2)
        if token is None:
            raise AuthenticationError("bearer token required")
        # Opening a stream (GET) always asks the helper; a POST within a couple of seconds of the
        # token's last check (the session re-check renews it every second) needs no round trip.
        principal = await self.authenticator.authenticate(token, fresh=conn.scope.get("method") != "POST")
        if principal is None:
            raise AuthenticationError("invalid token")
        return AuthCredentials(["mcp"]), McpUser(principal, token)


def unauthorized(conn: HTTPConnection, exc: AuthenticationError) -> Response:
    """The ``401`` answer, with the challenge header (SPEC §1.3)."""
    return PlainTextResponse(str(exc), status_code=401, headers={"WWW-Authenticate": "Bearer"})


def build_app(
    cfg: Config, authenticator: Authenticator, dispatcher: Dispatcher, login: LoginBackend | None = None
) -> Starlette:
    """Assemble the front: middleware stack (outermost first) and routes.

    Args:
        cfg: validated daemon config.
        authenticator: token → principal.
        dispatcher: tools and resources for every session.
        login: password logins (``POST /login``, ``/logout``); ``None`` → 503 (no helper).

    The session table is exposed as ``app.state.sessions`` (closed on shutdown by the server).
    """
    manager = SessionManager(cfg, dispatcher)
    transport = Transport(cfg, manager)
    streamable = StreamableTransport(cfg, manager)
    logins = LoginRoutes(login or NoLogin())
    routes: list[BaseRoute] = [*transport.routes(), *streamable.routes(), *logins.routes()]
    if cfg.base_path:
        routes.append(Mount(cfg.base_path, routes=transport.routes() + streamable.routes() + logins.routes()))
    open_paths = frozenset({"/login", f"{cfg.base_path}/login"})
    middleware = [
        Middleware(OriginMiddleware, allowed_origins=cfg.allowed_origins),
        Middleware(AuthenticationMiddleware, backend=BearerBackend(authenticator, open_paths), on_error=unauthorized),
    ]
    app = Starlette(routes=routes, middleware=middleware)
    app.state.sessions = manager
    return app
