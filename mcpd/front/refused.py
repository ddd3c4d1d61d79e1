"""One log line for every refused request, outermost in the front's middleware stack.

Every answer with a status of 400 or more (401 no or bad token, 403 origin, 404 no such route or
session, 413 body too large, 415 wrong content type, 421 wrong host, 429 too many, 431 request line
and headers too large (written by the connection guard, ``mcpd.front.connections.guarded``, before any
request exists), 503 ...) gets one line on the ``mcpd.front.refused`` logger::

    refused 401 POST /message from 127.0.0.1:50312: invalid token (token id 0123456789ab)

The reason is the answer's own text (a plain-text body, or a JSON body's ``error`` or
``error.message``), cut to :data:`REASON_CHARS`. The line never holds a token, a query string, a
header or a request body: only the method, the path (a token-shaped part replaced by its id), the
peer address and, for a bearer token, its id, which is not secret (``mcpd users list`` shows it).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcpd.common.printable import printable
from mcpd.front.auth import parse_bearer

log = logging.getLogger("mcpd.front.refused")

REASON_CHARS = 200  # longest reason logged
PATH_CHARS = 200  # longest path logged
_BODY_KEPT = 2048  # bytes of a refusal's body read for its reason

_TOKEN_RE = re.compile(r"mcpd_([0-9a-f]{12})_[A-Za-z0-9_-]*")


def clean(text: str, limit: int) -> str:
    """``text`` fit for one log line: tokens shown by id only, at most ``limit`` characters (then
    ``…``), then everything not plainly visible escaped (:func:`~mcpd.common.printable.printable`:
    control characters, terminal escapes, bidi overrides), so it never forges or hides a line."""
    text = _TOKEN_RE.sub(lambda m: f"mcpd_{m.group(1)}_…", text)
    return printable(text if len(text) <= limit else text[:limit] + "…")


def log_refusal(status: int, method: str, path: str, client: tuple[str, int] | None, reason: str,
                extra: str = "") -> None:
    """Write one refusal line (the format above): ``method``, ``path`` and ``reason`` made fit for
    the log (:func:`clean`), ``client`` the peer's (host, port) or ``None``, then ``extra`` as is
    (the token note: the server's own text, never cut)."""
    peer = f"{client[0]}:{client[1]}" if client else "unknown"
    log.info("refused %d %s %s from %s: %s%s", status, clean(method, 16), clean(path, PATH_CHARS), peer,
             clean(reason, REASON_CHARS), extra)


def reason_of(body: bytes, content_type: str) -> str:
    """The reason a refusal's answer gives: a JSON body's ``error`` (a string, or an object's
    ``message``), else the body as text; ``-`` for an empty body."""
    text = body.decode("utf-8", "replace").strip()
    if "json" in content_type:
        try:
            data: Any = json.loads(text)
        except ValueError:
            data = None
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return text or "-"


class RefusalLogMiddleware:
    """Log one line per HTTP answer with status >= 400 (see the module docstring).

    Args:
        app: the wrapped ASGI app.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0
        challenge = False  # a 401 of the bearer check (not of a password login)
        content_type = ""
        body = bytearray()
        logged = False

        def emit() -> None:
            nonlocal logged
            logged = True
            extra = ""
            if status == 401 and challenge:
                # the first Authorization header: the one the bearer check reads
                header = next((v for k, v in scope["headers"] if k == b"authorization"), b"").decode("latin-1")
                token = parse_bearer(header)
                match = _TOKEN_RE.fullmatch(token or "")
                if match:
                    extra = f" (token id {match.group(1)})"
                elif token is not None:
                    extra = " (not an mcpd token)"
                elif header.strip().lower().startswith("bearer"):
                    extra = " (malformed bearer token)"
                else:
                    extra = " (no bearer token)"
            log_refusal(status, scope.get("method", ""), scope.get("path", ""), scope.get("client"),
                        reason_of(bytes(body), content_type), extra)

        async def watch(message: Message) -> None:
            nonlocal status, content_type, challenge
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if status >= 400:
                    for key, value in message.get("headers", ()):
                        if key.lower() == b"content-type":
                            content_type = value.decode("latin-1").lower()
                        elif key.lower() == b"www-authenticate":
                            challenge = True
            elif message["type"] == "http.response.body" and status >= 400 and not logged:
                if len(body) < _BODY_KEPT:
                    body.extend(message.get("body", b"")[:_BODY_KEPT - len(body)])
                if not message.get("more_body", False):
                    emit()
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            if status >= 400 and not logged:
                emit()


class CheckMiddleware:
    """A middleware that answers an HTTP request with its check's refusal, or passes it on.
    Subclasses give :meth:`refusal`; the lean ``POST /message`` route calls it directly, so each
    check has one definition whichever way a request comes.

    Args:
        app: the wrapped ASGI app.
    """

    app: ASGIApp

    def refusal(self, scope: Scope) -> Response | None:
        """The answer refusing this HTTP request, or ``None`` to let it through."""
        raise NotImplementedError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (refused := self.refusal(scope)) is not None:
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)
