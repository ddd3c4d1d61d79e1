"""The front's ASGI application: routes plus the middleware stack, assembled in :func:`build_app`.

Order of the stack, outermost first (read it top to bottom in :func:`build_app`):

0. ``RefusalLogMiddleware`` (``mcpd.front.refused``) — one log line for every answer of status
   400 or more, with the reason and the peer, never the token.
1. ``OriginMiddleware`` — an ``Origin`` header not in ``allowed_origins`` → ``403`` (docs/REFERENCE.md §1.3);
   then ``HostMiddleware`` — with ``allowed_hosts`` set, a ``Host`` it does not name → ``421``.
2. ``AuthenticationMiddleware`` with :class:`BearerBackend` — no or bad bearer token on any route
   → ``401`` with an RFC 6750 challenge (docs/REFERENCE.md §1.3), a token that cannot be checked now (the
   policy process busy or down) → ``503`` with ``Retry-After``; tokens in the query string are ignored. Paths
   under ``/.well-known/`` need no token and are all ``404`` unless OAuth is configured: then the
   protected-resource metadata is served there (``mcpd.front.oauth``), every ``401`` names it, and
   an OAuth token without ``files:read`` gets ``403 insufficient_scope``.
3. The router: ``GET /sse`` and ``POST /message`` (``mcpd.front.transport.sse``), ``GET``, ``POST``
   and ``DELETE /mcp`` (``mcpd.front.transport.streamable``), ``POST /login`` and
   ``POST /logout`` (``mcpd.front.login``; ``/login`` alone needs no bearer), at the root and,
   when set, also under ``base_path``.

The app itself (:class:`FrontApp`) wraps the stack: a session's GET stream, once started through
it, is streamed from there, after the middleware and the router have returned; and ``POST /message``
and ``POST /mcp`` skip the stack for :class:`PostRoute`, which makes the same checks with the same
objects.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, AuthenticationError
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from mcpd.common.config import Config, ConfigError
from mcpd.common.oauthconfig import SCOPE_READ, OAuth
from mcpd.front import oauth as oauth_front
from mcpd.front.auth import CHECKER_DOWN_RETRY, Authenticator, CheckerDown, McpUser, TokenUndecided, parse_bearer
from mcpd.front.confirm import ConfirmRoutes
from mcpd.front.connections.handover import DETACH
from mcpd.front.hosts import HostMiddleware, HostRule
from mcpd.front.login import LoginBackend, LoginRoutes, NoLogin
from mcpd.front.mcp.confirm import PREFIX as CONFIRM_PREFIX
from mcpd.front.mcp.dispatcher import Dispatcher
from mcpd.front.refused import CheckMiddleware, RefusalLogMiddleware
from mcpd.front.sessions.table import SessionManager
from mcpd.front.transport.sse import Transport
from mcpd.front.transport.stream import HANDOFF, SessionStream
from mcpd.front.transport.streamable import StreamableTransport


class OriginMiddleware(CheckMiddleware):
    """Refuse requests whose ``Origin`` header is present and not allowed (docs/REFERENCE.md §1.3: ``403``).

    Args:
        app: the wrapped ASGI app.
        allowed_origins: exact ``Origin`` values accepted (scheme://host[:port]); empty allows none.
    """

    def __init__(self, app: ASGIApp, allowed_origins: tuple[str, ...], exempt: tuple[str, ...] = ()) -> None:
        self.app = app
        self.allowed = frozenset(allowed_origins)
        self.exempt = exempt  # path prefixes that hold their own origin rule (the confirmation page's)

    def refusal(self, scope: Scope) -> Response | None:
        """The ``403`` for an HTTP request with an ``Origin`` header not allowed, else ``None``
        (paths under ``exempt`` check their origin themselves: :mod:`mcpd.front.confirm`)."""
        if self.exempt and scope.get("path", "").startswith(self.exempt):
            return None
        origins = [v for k, v in scope["headers"] if k == b"origin"]
        if origins and any(o.decode("latin-1") not in self.allowed for o in origins):
            return PlainTextResponse("origin not allowed", status_code=403)
        return None


WELL_KNOWN = "/.well-known/"
INVALID_TOKEN_DESCRIPTION = "the token is unknown, expired or revoked"
INVALID_TOKEN_CHALLENGE = f'Bearer error="invalid_token", error_description="{INVALID_TOKEN_DESCRIPTION}"'


class BearerRefused(AuthenticationError):
    """A ``401``; ``error`` is the RFC 6750 error code, or ``None`` when no bearer token was sent
    (RFC 6750 §3.1: then the challenge carries no error attribute)."""

    def __init__(self, message: str, error: str | None, challenge: str | None = None) -> None:
        super().__init__(message)
        self.error = error
        self.challenge = challenge  # the WWW-Authenticate value, when OAuth is on (mcpd.front.oauth)


class InsufficientScope(AuthenticationError):
    """A ``403 insufficient_scope`` (an OAuth token without ``files:read``): ``response`` is it."""

    def __init__(self, response: Response) -> None:
        super().__init__("insufficient scope")
        self.response = response


class TokenCheckBusy(AuthenticationError):
    """A ``503`` with ``Retry-After`` (``retry_after`` seconds): the token could be neither
    accepted nor refused now."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


#: the answer to a token that cannot be checked because the policy process, which checks tokens,
#: is down; the seconds to wait are :data:`~mcpd.front.auth.CHECKER_DOWN_RETRY`
CHECKER_DOWN = "the policy process is not reachable, so the token cannot be checked now; retry in a moment"


class BearerBackend(AuthenticationBackend):
    """Starlette authentication backend for ``Authorization: Bearer TOKEN`` (docs/REFERENCE.md §1.3, §5.1).

    Raises :class:`BearerRefused` (→ 401): ``error`` ``None`` for no bearer token (no header,
    another scheme), ``"invalid_token"`` for a malformed, unknown, expired or revoked one.

    Args:
        authenticator: token → principal.
        open_paths: exact paths that need no token (``/login``).
        open_prefixes: path prefixes never authenticated, token or not (``/.well-known/``: all ``404``).
    """

    def __init__(self, authenticator: Authenticator, open_paths: frozenset[str] = frozenset(),
                 open_prefixes: tuple[str, ...] = (), oauth: OAuth | None = None) -> None:
        self.authenticator = authenticator
        self.open_paths = open_paths
        self.open_prefixes = open_prefixes
        self.oauth = oauth if oauth is not None and oauth.enabled else None
        self._challenges = {None: "Bearer", "invalid_token": INVALID_TOKEN_CHALLENGE} if self.oauth is None else {
            None: oauth_front.challenge(self.oauth),
            "invalid_token": oauth_front.challenge(self.oauth, "invalid_token", INVALID_TOKEN_DESCRIPTION)}

    def refused(self, message: str, error: str | None) -> BearerRefused:
        """The ``401`` for ``error`` (None: no token sent), with its challenge."""
        return BearerRefused(message, error, self._challenges[error])

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, McpUser] | None:
        header = conn.headers.get("authorization")
        token = parse_bearer(header)
        path = conn.scope.get("path", "")
        if path.startswith(self.open_prefixes):
            return None  # nothing is served there (404), whatever the token
        if token is None and path in self.open_paths:
            return None  # POST /login: the password is the credential (docs/REFERENCE.md §5.2)
        if token is None:
            sent_bearer = header is not None and header.strip().lower().startswith("bearer")
            raise self.refused("invalid token" if sent_bearer else "bearer token required",
                               "invalid_token" if sent_bearer else None)
        # Opening a stream (GET) always asks the policy process; a POST within a couple of seconds of the
        # token's last check (the session re-check renews it every second) needs no round trip.
        try:
            principal = await self.authenticator.authenticate(token, fresh=conn.scope.get("method") != "POST")
        except CheckerDown:
            raise TokenCheckBusy(CHECKER_DOWN, CHECKER_DOWN_RETRY) from None
        except TokenUndecided:
            raise TokenCheckBusy("the token could not be checked now; retry in a moment") from None
        if principal is None:
            raise self.refused("invalid token", "invalid_token")
        if self.oauth is not None and principal.scopes is not None:
            refusal = oauth_front.scope_refusal(self.oauth, principal, (SCOPE_READ,))
            if refusal is not None:
                raise InsufficientScope(refusal)
        return AuthCredentials(["mcp"]), McpUser(principal, token)


def unauthorized(conn: HTTPConnection, exc: AuthenticationError) -> Response:
    """The ``401`` answer with its RFC 6750 challenge (docs/REFERENCE.md §1.3): ``Bearer`` alone when no token
    was sent, ``Bearer error="invalid_token", error_description=...`` for a refused one; ``503``
    with ``Retry-After`` for a token that could not be checked now (:class:`TokenCheckBusy`: the
    policy process busy, 1 s, or not reachable, :data:`CHECKER_DOWN_RETRY` s), never a ``401``: a client
    told its token is bad would stop, or ask its user for a new one."""
    if isinstance(exc, TokenCheckBusy):
        return PlainTextResponse(str(exc), status_code=503, headers={"Retry-After": str(exc.retry_after)})
    if isinstance(exc, InsufficientScope):
        return exc.response
    error = exc.error if isinstance(exc, BearerRefused) else "invalid_token"
    challenge = "Bearer" if error is None else INVALID_TOKEN_CHALLENGE
    if isinstance(exc, BearerRefused) and exc.challenge is not None:
        challenge = exc.challenge
    return PlainTextResponse(str(exc), status_code=401, headers={"WWW-Authenticate": challenge})


class PostRoute:
    """``POST /message`` and ``POST /mcp`` (and both under ``base_path``) without the generic stack:
    the requests every tool call makes (``/message`` on the HTTP+SSE transport, ``/mcp`` on
    Streamable HTTP), so the ones worth running lean.

    It makes the stack's checks, in the stack's order and with the stack's own objects, and nothing
    else: the ``Origin`` check (:meth:`OriginMiddleware.refusal`), the ``Host`` check
    (:meth:`HostMiddleware.refusal`), the bearer token (:meth:`BearerBackend.authenticate`, a
    refusal answered by :func:`unauthorized`), then the path's own handler
    (:meth:`Transport.message` or :meth:`StreamableTransport.post`). Every answer of status 400 or
    more is logged by the same :class:`RefusalLogMiddleware`. What it leaves out is what does
    nothing on these routes: the router (the path and method are known), starlette's exception
    middlewares (an exception reaches the server, which answers ``500`` as they would) and one
    wrapper of ``send`` per layer.

    Args:
        handlers: exact path → the handler of a ``POST`` to it.
        origin: the origin check. host: the host check. backend: the bearer check.
    """

    def __init__(self, handlers: Mapping[str, Callable[[Request], Awaitable[Response]]], origin: OriginMiddleware,
                 host: HostMiddleware, backend: BearerBackend) -> None:
        self.handlers = handlers
        self.origin, self.host, self.backend = origin, host, backend

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = self.origin.refusal(scope) or self.host.refusal(scope)
        if refused is None:
            conn = HTTPConnection(scope)
            try:
                authenticated = await self.backend.authenticate(conn)
            except AuthenticationError as exc:
                refused = unauthorized(conn, exc)
            else:
                if authenticated is None:  # (never for these routes: no open path is one of them)
                    refused = PlainTextResponse("Not Found", status_code=404)
                else:
                    scope["auth"], scope["user"] = authenticated
        if refused is None:
            refused = response = await self.handlers[scope["path"]](Request(scope, receive))
            if response.status_code < 400:
                await response(scope, receive, send)
                return
        await RefusalLogMiddleware(refused)(scope, receive, send)


class FrontApp(Starlette):
    """Starlette, which also runs the session streams handed to it (:data:`~mcpd.front.transport.stream.HANDOFF`):
    a ``GET /sse`` or ``GET /mcp`` stream is started through the whole stack, and streamed from here
    once the middleware and the router have returned: on the connection itself when the server
    offers it (:data:`~mcpd.front.connections.handover.DETACH`: the stream then holds no task and none of the
    server's per-request objects), else with the request's own ``receive`` and ``send``; an open
    stream holds none of the middleware's frames and wrappers. ``POST /message`` and
    ``POST /mcp`` go to :attr:`post_route` when set (:class:`PostRoute`: the same checks, without
    the generic layers)."""

    post_route: PostRoute | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        fast = self.post_route
        if fast is not None and scope["method"] == "POST" and scope["path"] in fast.handlers:
            await fast(scope, receive, send)
            return
        handoff: list[SessionStream] = []
        # a copy for the stack to add its keys to: the server's own scope lives as long as the
        # connection's request does (a stream's), and would keep them, and grown
        inner = dict(scope)
        inner[HANDOFF] = handoff
        try:
            await super().__call__(inner, receive, send)
        except BaseException:
            for stream in handoff:
                stream.end()
            raise
        del inner
        if handoff:  # (one at most: one response per request)
            stream = handoff.pop()
            offer = scope.get(DETACH)  # (the server's: a handover.ConnectionOffer, on a GET)
            if offer is None or not stream.take_over(offer):
                await stream.run(receive, send, None if offer is None else offer.abort)


def build_app(
    cfg: Config, authenticator: Authenticator, dispatcher: Dispatcher, login: LoginBackend | None = None
) -> FrontApp:
    """Assemble the front: middleware stack (outermost first) and routes.

    Args:
        cfg: validated daemon config.
        authenticator: token → principal.
        dispatcher: tools and resources for every session.
        login: password logins (``POST /login``, ``/logout``); ``None`` → 503 (no helper unit).

    The session table is exposed as ``app.state.sessions`` (closed on shutdown by the server).

    Raises:
        ConfigError: a malformed ``allowed_hosts`` entry, or ``auto`` with an unreadable certificate.
    """
    try:
        hosts = HostRule(cfg.allowed_hosts, cfg.tls.cert)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    manager = SessionManager(cfg, dispatcher)
    transport = Transport(cfg, manager)
    streamable = StreamableTransport(cfg, manager)
    logins = LoginRoutes(login or NoLogin(), cfg.login)
    logins.access = dispatcher.access  # the logins the front refuses itself are recorded too
    confirm = ConfirmRoutes(login, logins.in_flight)  # the confirmation page: no bearer, its own origin rule
    routes: list[BaseRoute] = [*transport.routes(), *streamable.routes(), *logins.routes(), *oauth_front.routes(cfg),
                               *confirm.routes()]
    if cfg.base_path:
        routes.append(Mount(cfg.base_path, routes=transport.routes() + streamable.routes() + logins.routes()
                            + confirm.routes()))
    open_paths = frozenset({"/login", f"{cfg.base_path}/login"})
    page = tuple({CONFIRM_PREFIX, f"{cfg.base_path}{CONFIRM_PREFIX}"})
    open_prefixes = tuple({WELL_KNOWN, f"{cfg.base_path}{WELL_KNOWN}"}) + page
    backend = BearerBackend(authenticator, open_paths, open_prefixes, cfg.oauth)
    middleware = [
        Middleware(RefusalLogMiddleware),
        Middleware(OriginMiddleware, allowed_origins=cfg.allowed_origins, exempt=page),
        Middleware(HostMiddleware, rule=hosts),
        Middleware(AuthenticationMiddleware, backend=backend, on_error=unauthorized),
    ]
    app = FrontApp(routes=routes, middleware=middleware)
    app.state.sessions = manager
    handlers = {f"{prefix}{path}": handler for prefix in {"", cfg.base_path}
                for path, handler in (("/message", transport.message), ("/mcp", streamable.post))}
    app.post_route = PostRoute(handlers, OriginMiddleware(app, cfg.allowed_origins), HostMiddleware(app, hosts),
                               backend)
    return app
