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
(else ``400``, ``-32600``). Before it runs, :func:`check_modern` holds the headers against the body:
``_meta`` version and client capabilities present (``400``, ``-32602``), ``MCP-Protocol-Version``
equal to the ``_meta`` one, ``Mcp-Method`` equal to the method and ``Mcp-Name`` (plain or
``=?base64?…?=``) equal to ``params.name``/``params.uri`` (``400``, ``-32020``), a version served
(``400``, ``-32022`` listing them). An unknown method is ``404`` with ``-32601``. The client closing
the response (a stream, or the connection of a JSON answer) cancels the request.

The JSON-RPC handling is the same :class:`~mcpd.front.mcp.session.McpSession` as ``/sse``'s: each
POST hands its body over with its own ``send``, so the replies and progress of that POST come
back on that POST's response. Authentication, the ``Origin`` check and the body cap are the same
middleware and helpers as for ``/sse``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from mcpd.common.config import Config
from mcpd.front import metrics
from mcpd.front.connguard import DETACH, PIECE, UNSEEN
from mcpd.front.mcp.dispatcher import Caller
from mcpd.front.mcp.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, Message, valid_id
from mcpd.front.mcp.session import McpSession
from mcpd.front.mcp.versions import (
    HEADER_MISMATCH, META_CLIENT_CAPABILITIES, META_VERSION, MODERN_VERSIONS, SUPPORTED_VERSIONS,
    UNSUPPORTED_VERSION,
)
from mcpd.front.transport.accept import MalformedAccept, acceptable
from mcpd.front.transport.body import BodyRefused, read_json, rpc_refusal
from mcpd.front.transport.sse import (
    FULL, PING, SESSION_ID_RE, STREAM_HEADERS, McpUser, SessionManager, SessionRefused,
    SessionStream, SseSession, encode_message, event_of, pieces,
)

log = logging.getLogger(__name__)

SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"
# Methods whose Mcp-Name header mirrors a body field (2026-07-28 Streamable HTTP, "Request Metadata").
NAME_FIELDS = {"tools/call": "name", "resources/read": "uri", "prompts/get": "name"}
_B64_PREFIX, _B64_SUFFIX = "=?base64?", "?="
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


def _is_reply(msg: Any) -> bool:
    return isinstance(msg, list) or (isinstance(msg, dict) and "method" not in msg)


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


class Refusal(Exception):
    """A stateless request refused before it runs: HTTP ``status`` with a JSON-RPC error body."""

    def __init__(self, status: int, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.data = status, code, message, data


def one_header(headers: Any, name: str, code: int) -> str | None:
    """The value of header ``name``, which carries one value, or ``None`` when absent.

    Args:
        headers: the request's headers (a Starlette ``Headers``: ``getlist`` sees every copy).
        name: the header. code: the JSON-RPC code of the refusal.

    Raises:
        Refusal: ``400``/``code`` when the header is sent more than once (a proxy reading another
            copy than this server would see another session, version, method or name).
    """
    values = headers.getlist(name)
    if len(values) > 1:
        raise Refusal(400, code, f"{name} header given more than once")
    return values[0] if values else None


def _header_value(raw: str, name: str) -> str:
    """A mirrored header's value: visible ASCII, space and tab only; ``=?base64?…?=`` decoded
    (UTF-8) for ``Mcp-Name``. Raises :class:`Refusal` (``-32020``) when malformed."""
    if any(not (0x20 <= ord(c) <= 0x7E or c == "\t") for c in raw):
        raise Refusal(400, HEADER_MISMATCH, f"{name} header holds invalid characters")
    if name == NAME_HEADER and raw.startswith(_B64_PREFIX) and raw.endswith(_B64_SUFFIX) \
            and len(raw) >= len(_B64_PREFIX) + len(_B64_SUFFIX):
        try:
            return base64.b64decode(raw[len(_B64_PREFIX):-len(_B64_SUFFIX)], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise Refusal(400, HEADER_MISMATCH, f"{name} header: bad base64 value") from None
    return raw


def modern_version(payload: Any) -> Any:
    """The ``_meta`` protocol version of a request body, or ``None`` when it names none."""
    params = payload.get("params") if isinstance(payload, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get(META_VERSION) if isinstance(meta, dict) else None


def check_modern(headers: Any, msg: Message) -> None:
    """Hold a 2026-07-28 request's headers against its body (``msg`` is a request object).

    Args:
        headers: the request's headers (a Starlette ``Headers``).
        msg: the JSON-RPC request.

    Raises:
        Refusal: ``400``/``-32602`` for missing ``_meta`` fields; ``400``/``-32020`` for a
            missing, repeated, malformed or mismatched ``MCP-Protocol-Version``, ``Mcp-Method``
            or ``Mcp-Name``; ``400``/``-32022`` for a version not served (``data`` lists them).
    """
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get(META_VERSION), str) \
            or not isinstance(meta.get(META_CLIENT_CAPABILITIES), dict):
        raise Refusal(400, INVALID_PARAMS, f"_meta must carry {META_VERSION} and {META_CLIENT_CAPABILITIES}")
    version = meta[META_VERSION]
    header_version = one_header(headers, VERSION_HEADER, HEADER_MISMATCH)
    if header_version is None:
        raise Refusal(400, HEADER_MISMATCH, f"{VERSION_HEADER} header required")
    if header_version != version:
        raise Refusal(400, HEADER_MISMATCH, f"{VERSION_HEADER} header does not match _meta")
    if version not in MODERN_VERSIONS:
        supported = [*reversed(MODERN_VERSIONS), *reversed(SUPPORTED_VERSIONS)]
        raise Refusal(400, UNSUPPORTED_VERSION, "Unsupported protocol version",
                      {"supported": supported, "requested": version})
    method = one_header(headers, METHOD_HEADER, HEADER_MISMATCH)
    if method is None:
        raise Refusal(400, HEADER_MISMATCH, f"{METHOD_HEADER} header required")
    if _header_value(method, METHOD_HEADER) != msg.get("method"):
        raise Refusal(400, HEADER_MISMATCH, f"{METHOD_HEADER} header does not match the method")
    field = NAME_FIELDS.get(str(msg.get("method")))
    if field is not None:
        name = one_header(headers, NAME_HEADER, HEADER_MISMATCH)
        if name is None:
            raise Refusal(400, HEADER_MISMATCH, f"{NAME_HEADER} header required")
        if _header_value(name, NAME_HEADER) != (params.get(field) if isinstance(params, dict) else None):
            raise Refusal(400, HEADER_MISMATCH, f"{NAME_HEADER} header does not match params.{field}")


async def _disconnected(receive: Receive) -> None:
    """Return once the client has gone away (the request's body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class PostStream:
    """The messages one POST's requests produce, in order, encoded, bounded like a session's queue.

    ``put`` is the ``send`` handed to :meth:`McpSession.receive`. A POST gets one reply (one
    request's, or one batch's array, bounded by the response cap or ``max_batch_bytes`` in
    :class:`~mcpd.front.mcp.session.McpSession`): it is always queued, however far behind the client
    is. Its progress notifications are dropped once the stream holds ``limit`` messages or
    ``limit_bytes`` bytes (``session_queue_size``, ``session_queue_bytes``: the client is behind,
    and progress is advisory), so a client reading a stream slowly is never cut for its own
    stream's bounds. The bytes count the messages queued and those taken (:meth:`drain`) until
    the response took them (:meth:`sent`).
    ``replies_only``: keep only replies (an answer sent as JSON, which carries no progress).
    ``manager`` and ``owner``: the session table, whose budgets of outgoing bytes by principal
    and in all are charged with what the stream holds (an event stream's; :meth:`close` releases
    it; :meth:`SessionManager.hold_answer`), and the principal's name: past either, the stream is
    cut too; when the total's rule cuts the principal (:meth:`SessionManager.still_over`), its
    connection is dropped as well (``drop``, the server's, when given).
    """

    def __init__(self, limit: int, limit_bytes: int = 16 * 1024 * 1024, replies_only: bool = False,
                 manager: SessionManager | None = None, owner: str = "",
                 drop: Callable[[], None] | None = None) -> None:
        self._items: collections.deque[Queued] = collections.deque()
        self._limit = limit
        self._limit_bytes = limit_bytes
        self._bytes = 0
        self._replies_only = replies_only
        self._manager = manager
        self._owner = owner
        self._drop = drop
        self._ready = asyncio.Event()
        self.overflowed = False
        self._closed = False

    def put(self, message: Any) -> None:
        """Encode and queue one message (never blocks); nothing once the stream was closed (its
        client left, or it was cut: a request still running puts its reply nowhere, and charges
        nothing no one would release)."""
        if self.overflowed or self._closed:
            return
        reply = _is_reply(message)
        if self._replies_only and not reply:
            return
        if not reply and len(self._items) >= self._limit:
            return  # (progress for a client that is behind: dropped)
        data = encode_message(message)
        size = len(data)
        if not reply and self._bytes and self._bytes + size > self._limit_bytes:
            return
        refused = isinstance(message, dict) and message.get("id") is None and "error" in message
        self._items.append(Queued(data, reply, refused, isinstance(message, dict) and "result" in message))
        self._bytes += size
        if self._manager is not None:
            kind = self._manager.hold_answer(self._owner, size, self._cut_off)
            if kind is not None:
                self._overflow(kind)
        self._ready.set()

    def _overflow(self, kind: str) -> None:
        """The client stopped reading: cut the stream, release what it holds, count ``kind``."""
        self.overflowed = True
        metrics.limit_hit(kind)
        self._items.clear()
        self.close()

    def _cut_off(self) -> None:
        """The total's rule cut the principal (:meth:`SessionManager.cut`): cut the stream,
        release what it holds, and drop its connection (its response may be waiting on a client
        that reads nothing, holding an event)."""
        self.overflowed = True
        self._items.clear()
        self.close()
        self._ready.set()
        if self._drop is not None:
            self._drop()

    def drain(self) -> list[Queued]:
        """Take everything queued so far (still counted until :meth:`sent`)."""
        items = list(self._items)
        self._items.clear()
        self._ready.clear()
        return items

    def sent(self, size: int) -> None:
        """A message of ``size`` bytes taken by :meth:`drain` was taken by the response."""
        if not self.overflowed:
            self._bytes -= size
            if self._manager is not None:
                self._manager.hold_answer(self._owner, -size, self._cut_off)

    def close(self) -> None:
        """Release what the stream still counts (it ended, or was cut); it takes nothing more."""
        self._closed = True
        if self._manager is not None and self._bytes:
            self._manager.hold_answer(self._owner, -self._bytes, self._cut_off)
        self._bytes = 0

    async def wait(self, task: asyncio.Task[Any], timeout: float | None = None) -> bool:
        """Wait until something is queued or ``task`` ends (``True``), or ``timeout`` seconds
        pass first (``False``)."""
        waiter = asyncio.ensure_future(self._ready.wait())
        try:
            done, _ = await asyncio.wait({waiter, task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        return bool(done)


@dataclasses.dataclass(frozen=True)
class Queued:
    """One encoded message of a :class:`PostStream`: its JSON ``data``, whether it is a ``reply``,
    whether it is an error without an id (``refused``: answered ``400`` as JSON), and whether it
    is a success (``result``)."""

    data: bytes
    reply: bool
    refused: bool
    result: bool


class PiecedAnswer(Response):
    """A ``/mcp`` POST's answer, its body known (a reply as JSON, or as one event for a client
    that accepts only event streams), written through the request's ``send`` a piece of at most
    :data:`~mcpd.front.connguard.PIECE` at a time: uvicorn's ``send`` waits while the connection
    asked to pause writing, so a client that stops reading leaves about two pieces in the
    connection's transport, and the rest here.

    The rule: while it is being written, the answer is charged, all of it, to principal
    ``owner``'s and the total budgets (``principal_queue_bytes``, ``total_queue_bytes``;
    :meth:`SessionManager.hold_answer`) whenever its connection is behind (the server's
    :meth:`~mcpd.front.connguard.ConnectionOffer.behind`, asked before each write; always, without
    the server's offer). Once written, an answer over :data:`~mcpd.front.connguard.UNSEEN` bytes
    is charged what its connection still holds, the kernel's queue included, until it holds
    nothing (:meth:`SessionManager.keep_answer`). Past a bound the client stopped reading: the
    connection is dropped, the charge released and the limit counted, as for a full queue. An
    answer of at most ``UNSEEN`` bytes to a client that keeps up costs one :meth:`behind` more
    than a plain response.

    Args:
        body: the answer's bytes. status: its HTTP status. headers: extra response headers.
        media_type: its ``Content-Type``. manager: the session table (its budgets).
        owner: the principal's name. session_id: the session the POST named (for the log), or ``None``.
    """

    def __init__(self, body: bytes, status: int, headers: dict[str, str] | None, media_type: str,
                 manager: SessionManager, owner: str, session_id: str | None) -> None:
        super().__init__(body, status_code=status, headers=headers, media_type=media_type)
        self._data = body  # (self.body, typed loosely: the same bytes)
        self._manager, self._owner, self._session_id = manager, owner, session_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        offer = scope.get(DETACH)
        data = self._data
        size = len(data)
        cut = None if offer is None else offer.abort
        charged = 0  # what hold_answer counts: 0, or the answer's size while its client is behind
        try:
            start: dict[str, Any] | None = {"type": "http.response.start", "status": self.status_code,
                                            "headers": self.raw_headers}
            for begin in range(0, size or 1, PIECE):
                owed = size if offer is None or offer.behind() else 0
                if owed != charged:
                    kind = self._manager.hold_answer(self._owner, owed - charged, cut)
                    charged = owed
                    if kind is not None:
                        self._manager.hold_answer(self._owner, -charged, cut)
                        charged = 0
                        self._cut(kind, cut)
                        if cut is not None:
                            await _disconnected(receive)
                        return
                if start is not None:  # (the headers, and the first piece right behind them)
                    await send(start)
                    start = None
                end = begin + PIECE
                await send({"type": "http.response.body", "body": data[begin:end], "more_body": end < size})
            if charged:
                self._manager.hold_answer(self._owner, -charged, cut)
                charged = 0
            if size > UNSEEN and offer is not None:  # written: what its connection still holds
                kind = self._manager.keep_answer(self._owner, offer)
                if kind is not None:
                    self._cut(kind, cut)
        finally:
            if charged:
                self._manager.hold_answer(self._owner, -charged, cut)

    def _cut(self, kind: str, cut: Callable[[], None] | None) -> None:
        """The client stopped reading (``kind``: the bound passed): count and log it, drop the
        connection (without the server's offer, the server closes the unfinished response)."""
        metrics.limit_hit(kind)
        log.warning("%s: a POST's answer: %s, dropping a client that stopped reading",
                    self._session_id or "stateless", FULL[kind])
        if cut is not None:
            cut()


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
                headers: dict[str, str] | None = None) -> Response:
        """A POST's answer of one reply (already encoded): JSON (``400`` for an error without an
        id), or one event for a client that accepts only event streams; a :class:`PiecedAnswer`
        (charged to principal ``owner``'s and the total budgets while its client is behind).
        ``session_id``: the session the POST named, for the log."""
        data = reply.data
        if JSON_TYPE not in accepts:  # an SSE-only client: the reply as a one-event stream
            return PiecedAnswer(event_of(data), 200, {**STREAM_HEADERS, **(headers or {})}, SSE_TYPE,
                                self.manager, owner, session_id)
        return PiecedAnswer(data, 400 if reply.refused else 200, headers, JSON_TYPE, self.manager, owner, session_id)

    # -- session lookup ---------------------------------------------------------------------------

    def _session(self, request: Request, rid: Any = None) -> SseSession | Response:
        """The caller's session named by ``Mcp-Session-Id``, or the error answer with id ``rid``:
        first :meth:`_version_refused` (so every request naming a session, GET, POST and DELETE
        alike, has its ``MCP-Protocol-Version`` checked), then ``400`` for a missing, repeated
        or malformed ``Mcp-Session-Id``, ``404`` for an unknown, ended or other principal's one."""
        refused = self._version_refused(request, rid)
        if refused is not None:
            return refused
        try:
            sid = one_header(request.headers, SESSION_HEADER, INVALID_REQUEST)
        except Refusal as exc:
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
        except Refusal as exc:
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
        caller = Caller(user.principal, user.token, peer)
        members = _members(payload)
        # (an initialize is answered as JSON: a failed one must not leave its session behind)
        if not opened and SSE_TYPE in accepts and any(_is_request(m) and _wants_progress(m) for m in members):
            return self._event_response(self._events(session, payload, caller, _drop(request)), headers)
        out = self._post_stream(replies_only=True)
        task = session.protocol.receive(payload, caller, out.put)
        if task is not None:
            await asyncio.wait({task})
        replies = out.drain()
        if opened and not (replies and replies[0].result):
            self.manager.close(session)  # a failed initialize leaves no session behind
            headers.pop(SESSION_HEADER)
        if not replies:
            if task is not None and task.cancelled() and session.closed:
                return rpc_refusal(404, INVALID_REQUEST, "session ended", rid, headers=headers)
            # (a request cancelled by notifications/cancelled gets no reply: 202, the session lives)
            return Response(status_code=202, headers=headers)
        return self._answer(replies[0], accepts, user.principal.name, session.id, headers)

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
        except Refusal as exc:
            return rpc_refusal(exc.status, exc.code, exc.message, rid, exc.data)
        protocol = McpSession(self.manager.dispatcher, secrets.token_hex(16), _discard, modern=True)
        if not protocol.knows(payload["method"]):
            return rpc_refusal(404, METHOD_NOT_FOUND, "method not found", rid)
        peer = f"{request.client.host}:{request.client.port}" if request.client else "unknown"
        caller = Caller(user.principal, user.token, peer)
        if SSE_TYPE in accepts and _wants_progress(payload):
            return self._event_response(self._stream(protocol, payload, caller, "stateless", cancel_on_close=True,
                                                     drop=_drop(request)))
        out = self._post_stream(replies_only=True)
        task = protocol.receive(payload, caller, out.put)
        if task is None:
            return Response(status_code=202)
        gone = asyncio.ensure_future(_disconnected(request.receive))
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not task.done():  # the client left: closing is cancelling in this era
                protocol.close()
        replies = out.drain()
        if not replies:
            return Response(status_code=202)
        return self._answer(replies[0], accepts, user.principal.name)

    def _event_response(self, events: AsyncIterator[bytes], headers: dict[str, str] | None = None,
                        ) -> EventSourceResponse:
        """A POST answered as an event stream. Its keep-alive comments come from ``events`` itself
        (:meth:`_stream`), not from the response's own ticker, which could write one between the
        pieces of a large event."""
        return EventSourceResponse(events, headers={**STREAM_HEADERS, **(headers or {})}, ping=0, sep="\n")

    def _events(self, session: SseSession, payload: Any, caller: Caller,
                drop: Callable[[], None] | None = None) -> AsyncIterator[bytes]:
        """One session-era POST's response stream. The client going away is not a cancellation
        in this era (it sends ``notifications/cancelled`` for that)."""
        return self._stream(session.protocol, payload, caller, session.id, cancel_on_close=False, drop=drop)

    async def _stream(self, protocol: McpSession, payload: Any, caller: Caller, label: str,
                      cancel_on_close: bool, drop: Callable[[], None] | None = None) -> AsyncIterator[bytes]:
        """One POST's response stream: its request's progress, then the reply, then the end, with
        a keep-alive comment after each ``keepalive_seconds`` without a message; a client that
        stops reading is cut off. An event larger than :data:`~mcpd.front.connguard.PIECE` goes
        out a piece at a time (each yield returns once the transport takes more), so a client that
        stops reading leaves about a piece in the transport, the rest counted in the stream's bytes
        until it went out. ``drop``: drops its connection, for a cut (:class:`PostStream`).
        ``cancel_on_close``: the stream ending early (the client left) cancels
        the request."""
        out = self._post_stream(owner=caller.principal.name, drop=drop)
        task = protocol.receive(payload, caller, out.put)
        if task is None:  # answered at once (a batch refused whole), or nothing to answer
            try:
                for item in out.drain():
                    yield event_of(item.data)
            finally:
                out.close()
            return
        try:
            while True:
                if not await out.wait(task, self.cfg.keepalive_seconds):
                    yield PING
                    continue
                done = task.done()  # then every message of the task is queued already
                for item in out.drain():
                    if out.overflowed:
                        break
                    if len(item.data) <= PIECE:
                        yield event_of(item.data)
                    else:
                        yield _EVENT_HEAD
                        for piece in pieces(item.data):
                            yield piece
                        yield _EVENT_END
                    out.sent(len(item.data))
                if out.overflowed:
                    log.warning("%s: a POST stream's client stopped reading; cut off", label)
                    return
                if done:
                    return
        finally:
            out.close()
            if cancel_on_close and not task.done():
                protocol.close()


def _drop(request: Request) -> Callable[[], None] | None:
    """What drops the request's connection (the server's offer), if it offers one."""
    offer = request.scope.get(DETACH)
    return None if offer is None else offer.abort


def _discard(message: Any) -> None:
    """The ``send`` of a one-request session: every message goes to that request's own response."""


_EVENT_END = b"\n\n"
_EVENT_HEAD = event_of(b"")[:-len(_EVENT_END)]  # what event_of puts before an event's data
