"""JSON-RPC 2.0 envelope and the MCP lifecycle for one session (SPEC §2).

:class:`McpSession` receives parsed POST bodies (an object or a batch array), runs every request
as its own asyncio task (SPEC §1.5) and hands each reply to the session's ``send`` callback, which
puts it on the SSE stream. :class:`Dispatcher` owns what the methods reach: the tool registry, the
worker pool, the privileged backend, and the resource hooks.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from mcpd.common.version import version
from mcpd.helper.wire.errors import INTERNAL_ERROR, ToolError
from mcpd.common.identity import Principal
from mcpd.front import metrics
from mcpd.front.access import AccessLog, Call
from mcpd.front.limits import LimitsTracker
from mcpd.front.privileged import PrivilegedBackend
from mcpd.core.tools import TOOLS, ToolModule, by_any_name, deadline_seconds, portable_name
from mcpd.core.walk import FIND_MAX_BUDGET

log = logging.getLogger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL = -32603
SERVER_BUSY = -32000  # implementation-defined server error: a per-session bound was reached

SUPPORTED_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_VERSION = SUPPORTED_VERSIONS[-1]
# The stateless era (no initialize; version and capabilities in each request's _meta), served on
# Streamable HTTP only (mcpd.front.transport.streamable).
MODERN_VERSIONS = ("2026-07-28",)
HEADER_MISMATCH = -32020
UNSUPPORTED_VERSION = -32022
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
SERVER_INFO = {"name": "mcpd", "version": version()}
CAPABILITIES = {"tools": {"listChanged": False}, "resources": {"listChanged": False}}
# Caching hints the 2026-07-28 revision requires on these results: (ttlMs, cacheScope). The lists
# change only with the daemon's configuration; a file can change at any time and is the caller's.
LIST_TTL_MS = 300_000
CACHE_HINTS: dict[str, tuple[int, str]] = {
    "server/discover": (LIST_TTL_MS, "public"),
    "tools/list": (LIST_TTL_MS, "public"),
    "resources/list": (LIST_TTL_MS, "public"),
    "resources/templates/list": (LIST_TTL_MS, "public"),
    "resources/read": (0, "private"),
}
INSTRUCTIONS = (
    "mcpd serves this Linux server's files read-only. Call files/read with an absolute path; "
    "use start_line/end_line or offset/limit for large files, and privileged: true only where a "
    "sudo-style grant exists."
)
READ_ONLY_ANNOTATIONS = {"readOnlyHint": True, "openWorldHint": False}

Message = dict[str, Any]
Send = Callable[[Any], None]


class RpcError(Exception):
    """A JSON-RPC error answer (SPEC §2.3): ``code`` (-32xxx), ``message``, optional ``data``."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def error_reply(req_id: Any, code: int, message: str, data: Any = None) -> Message:
    """The JSON-RPC error object for ``req_id`` (``None`` when the id is unknown or invalid)."""
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": req_id, "error": err}


def tool_error_result(exc: ToolError) -> dict[str, Any]:
    """The ``CallToolResult`` for a tool failure (SPEC §2.5): ``isError`` with the code in ``structuredContent``."""
    return {
        "content": [{"type": "text", "text": exc.message}],
        "isError": True,
        "structuredContent": {"error": exc.to_dict()},
    }


@dataclass(frozen=True)
class Caller:
    """Who sent a POST: the authenticated principal, its bearer token (never logged) and peer ``host:port``."""

    principal: Principal
    token: str = field(repr=False)
    peer: str


@dataclass
class RequestContext:
    """What a method handler knows about its request; ``progress`` sends ``notifications/progress``."""

    caller: Caller
    session_id: str
    progress_token: str | int | None
    send: Send = field(repr=False)
    modern: bool = False  # a 2026-07-28 request (its resource errors use that revision's codes)

    async def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """Send one ``notifications/progress`` on this session, if the request asked for it (``_meta.progressToken``)."""
        if self.progress_token is None:
            return
        params: dict[str, Any] = {"progressToken": self.progress_token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        self.send({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})


class ToolPool(Protocol):
    """The worker pool's interface as the front uses it (``mcpd.front.pool.WorkerPool``)."""

    async def call(
        self, os_user: str, op: str, args: dict[str, Any], timeout: float | None = None,
        on_progress: Callable[[int, int | None, str], Awaitable[None]] | None = None, *, token: str = "",
        owner: str | None = None,
    ) -> dict[str, Any]:
        """Run ``op`` as ``os_user`` (``timeout`` seconds, ``None``: the pool's default); return its
        result or raise ToolError. ``on_progress(done, total, message)`` gets the op's progress."""
        ...


class ResourceProvider(Protocol):
    """Hook for ``resources/templates/list`` and ``resources/read`` (``mcpd.front.resources.FileResources``)."""

    def list_templates(self) -> list[dict[str, Any]]:
        """The ``resourceTemplates`` list."""
        ...

    async def read(self, ctx: RequestContext, uri: str, params: dict[str, Any]) -> dict[str, Any]:
        """The ``ReadResourceResult`` for ``uri`` (``params``: the whole ``resources/read`` params);
        raise :class:`RpcError` for an unknown or failed resource."""
        ...


class Room(Protocol):
    """Backpressure of a session's own outgoing stream (``mcpd.front.transport.sse.SseSession``):
    a request whose reply goes to that stream takes room before it runs (:meth:`admit`) and gives
    it back with its reply (:meth:`deliver`) or without one (:meth:`release`)."""

    @property
    def call_cost(self) -> int:
        """Bytes a request that may answer large (``tools/call``, ``resources/read``) reserves."""
        ...

    @property
    def wait_seconds(self) -> float:
        """How long :meth:`admit` waits for room by default (a call's deadline, unless its own is longer)."""
        ...

    def admit_now(self, cost: int) -> bool:
        """Reserve ``cost`` bytes and one message if there is room now; whether it did."""
        ...

    async def admit(self, cost: int, size: int, seconds: float | None = None) -> bool:
        """:meth:`admit_now`, else wait for room holding about ``size`` bytes; ``False`` (nothing
        reserved) at once when too much waits already, once ``seconds`` (default
        :attr:`wait_seconds`) passed without room, or when the session closed."""
        ...

    def deliver(self, message: Any, cost: int | None) -> None:
        """Queue an admitted request's reply and give back its ``cost`` (``None``: nothing reserved)."""
        ...

    def release(self, cost: int) -> None:
        """Give back ``cost`` for an admitted request that sends no reply."""
        ...


class Dispatcher:
    """Tool and resource dispatch for every session (SPEC §2.4, §2.5).

    Args:
        pool: runs unprivileged ops as the caller's OS account.
        privileged: forwards ``privileged: true`` calls to the root helper.
        tools: name → tool module; defaults to :data:`mcpd.core.tools.TOOLS`.
        resources: resource hook, or ``None`` (no resources yet).
        tool_names: ``"slash"`` lists ``files/read`` …, ``"portable"`` lists ``files_read`` …;
            calls accept both spellings either way.
    """

    def __init__(
        self,
        pool: ToolPool,
        privileged: PrivilegedBackend,
        tools: Mapping[str, ToolModule] = TOOLS,
        resources: ResourceProvider | None = None,
        tool_names: str = "slash",
    ) -> None:
        self.pool = pool
        self.privileged = privileged
        self.tools = tools
        self._callable = by_any_name(tools)
        self._portable = tool_names == "portable"
        self.resources = resources
        self.limits: LimitsTracker | None = None  # set by the server when limits are configured
        self.access: AccessLog | None = None  # set by the server: every call's record (SPEC §7.1)
        # per session (SPEC §1.7): requests in flight at once, and members of one batch that are run;
        # set by the server from mcpd.yaml (max_in_flight, max_batch)
        self.max_in_flight = 64
        self.max_batch = 256
        self.max_batch_bytes = 16 * 1024 * 1024  # one batch's answer (session_queue_bytes): beyond, -32000 per member

    def list_tools(self) -> list[dict[str, Any]]:
        """The ``tools`` array of ``tools/list``."""
        return [
            {
                "name": portable_name(t.NAME) if self._portable else t.NAME,
                "description": t.DESCRIPTION,
                "inputSchema": t.INPUT_SCHEMA,
                "annotations": dict(READ_ONLY_ANNOTATIONS),
            }
            for t in self.tools.values()
        ]

    async def call_tool(self, ctx: RequestContext, name: Any, arguments: Any) -> dict[str, Any]:
        """Run one ``tools/call`` by either spelling of the tool's name; tool failures become
        ``isError`` results. Grants, limits and records always see the ``files/…`` name.

        Raises:
            RpcError: ``-32602`` for an unknown tool name.
        """
        tool = self._callable.get(name) if isinstance(name, str) else None
        c = ctx.caller
        if tool is None:
            if self.access is not None:  # every call leaves one record, this one too
                self.access.unknown_tool(c.principal, c.peer, ctx.session_id, name, arguments)
            raise RpcError(INVALID_PARAMS, "unknown tool")
        try:
            with Call(self.access, c.principal, c.peer, ctx.session_id, tool.NAME, arguments) as call:
                args = tool.parse_args({} if arguments is None else arguments)
                if self.limits is not None:  # per-principal quota and answer size (issue 5)
                    args = self.limits.charge_call(c.principal.name, args)
                if args.get("privileged"):
                    call.stage = "forwarded"
                    call.result = await self.privileged.call(c.token, c.principal, ctx.session_id, c.peer,
                                                             tool.NAME, args)
                else:
                    call.stage = "unprivileged"
                    call.result = await self.pool.call(
                        c.principal.os_user, tool.NAME, args, timeout=deadline_seconds(args, 0.0) or None,
                        on_progress=ctx.progress if ctx.progress_token is not None else None,
                        token=c.token, owner=c.principal.name,
                    )
                return tool.format_result(readable(call.result))
        except ToolError as exc:
            return tool_error_result(exc)
        except Exception:
            log.exception("tool %s failed unexpectedly (session %s)", tool.NAME, ctx.session_id)
            return tool_error_result(ToolError(INTERNAL_ERROR, "internal error"))


def valid_id(value: Any) -> bool:
    """A JSON-RPC id (SPEC §2.3): a string that is valid Unicode, an integer (any size), or a
    finite number that its reply can carry exactly; otherwise the request is answered ``-32600``
    with ``id: null``. ``1e400`` parses as infinity, which no reply could carry as JSON; a number
    whose text is not the number of the float it parses to (``9007199254740993.0``,
    ``1.00000000000000000001``) is an :class:`InexactNumber` (see :func:`json_float`), since its
    reply would carry another id (``9007199254740992.0``, ``1.0``)."""
    if type(value) is float:
        return math.isfinite(value)
    if isinstance(value, str):
        return encodable(value)
    return type(value) is int  # (not bool, whose type is bool)


_MIN_NORMAL = sys.float_info.min  # the smallest normal double (below: fewer digits are kept)


class InexactNumber(float):
    """A JSON number with a fraction or an exponent whose text is not exactly the number that
    its float (this value) writes back: never a valid id (:func:`valid_id`); anywhere else, a float."""

    __slots__ = ()


def json_float(text: str) -> float:
    """The ``parse_float`` hook of a request body's parser: ``text`` (a JSON number with a
    fraction or an exponent, as the parser found it) as a float, or as an :class:`InexactNumber`
    when the float's shortest form (what a reply writes) is not the same number as ``text``.

    ``0.1``, ``1E2`` and ``-0.0`` are exact in this sense (written back as ``0.1``, ``100.0``,
    ``-0.0``); ``9007199254740993.0`` (2**53 + 1) and ``1.00000000000000000001`` are not. Text of
    at most 16 characters has at most 15 digits, which a double in the normal range keeps
    (``DBL_DIG``): such text, the usual one, is answered without the exact comparison when it has no
    exponent (its value is then 0 or at least 1e-14) or its float is normal."""
    value = float(text)
    if len(text) <= 16 and (("e" not in text and "E" not in text) or _MIN_NORMAL <= abs(value) < math.inf):
        return value
    shortest = repr(value)
    if text == shortest or not math.isfinite(value) or Decimal(text) == Decimal(shortest):
        return value  # (infinity stays a float: valid_id refuses it as such)
    return InexactNumber(value)


def encodable(text: str) -> bool:
    """Whether ``text`` can be sent as UTF-8 (no lone surrogate, which a JSON body can spell as
    ``"\\ud800"``): an id that is not would make its own reply unencodable, so it is invalid."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def readable(value: Any) -> Any:
    """A tool result whose strings are all valid Unicode: a file name that is not UTF-8 comes from
    the worker with its bad bytes as lone surrogates (``surrogateescape``), which no reply can
    carry; such a string is shown with those bytes as ``\\xNN`` escapes, as ``ls -b`` shows them.
    (File text never holds them: the reading core decodes strictly.)"""
    if isinstance(value, str):
        return value if encodable(value) else value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(value, list):
        return [readable(v) for v in value]
    if isinstance(value, dict):
        return {k: readable(v) for k, v in value.items()}
    return value


def approx_size(value: Any) -> int:
    """About the bytes of ``value`` as JSON, without encoding it: characters of its strings plus a
    few bytes for each other item (a bound for what a reply holds, not an exact length)."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, dict):
        return sum(approx_size(k) + approx_size(v) + 2 for k, v in value.items()) + 2
    if isinstance(value, list):
        return sum(approx_size(v) + 1 for v in value) + 2
    if isinstance(value, int):  # (bool too) about 3.3 bits a digit: a 4,000-digit id is not 8 bytes
        return max(8, value.bit_length() // 3 + 2)
    if isinstance(value, float):
        return 24  # the longest shortest form: -1.2345678901234567e-308
    return 8


def _id_key(value: Any) -> tuple[str, Any]:
    return ("s", value) if isinstance(value, str) else ("n", value)


def _params(msg: Message) -> dict[str, Any]:
    """A request's ``params``: ``{}`` when absent. Raises :class:`RpcError` (``-32602``) when
    present and not an object (``null`` included: JSON-RPC 2.0 wants a structured value, and every
    method served takes named parameters)."""
    params = msg.get("params", {})
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "params must be an object")
    return params


def negotiate(requested: str) -> str:
    """Echo a supported protocol version, else offer the newest (SPEC §2.1)."""
    return requested if requested in SUPPORTED_VERSIONS else LATEST_VERSION


def modern_result(method: str, result: dict[str, Any]) -> dict[str, Any]:
    """A result as the 2026-07-28 revision shapes it: ``resultType: "complete"``, the server's
    identity in ``_meta``, and ``ttlMs``/``cacheScope`` on the cacheable methods (:data:`CACHE_HINTS`)."""
    out = dict(result)
    out["resultType"] = "complete"
    meta = out.get("_meta")
    out["_meta"] = {**(meta if isinstance(meta, dict) else {}), META_SERVER_INFO: dict(SERVER_INFO)}
    hint = CACHE_HINTS.get(method)
    if hint is not None:
        out["ttlMs"], out["cacheScope"] = hint
    return out


Handler = Callable[[RequestContext, dict[str, Any]], Awaitable[dict[str, Any]]]


#: Methods whose reply may be large (a worker's answer): each takes :attr:`Room.call_cost`.
HEAVY_METHODS = frozenset({"tools/call", "resources/read"})


def heavy(msg: Any) -> bool:
    """Whether ``msg`` asks for a method whose reply may be large (:data:`HEAVY_METHODS`)."""
    method = msg.get("method") if isinstance(msg, dict) else None
    return isinstance(method, str) and method in HEAVY_METHODS


def admit_seconds(msg: Any, default: float) -> float:
    """How long a request may wait for room: its own deadline
    (:func:`~mcpd.core.tools.deadline_seconds`: ``default``, or a find's time budget, at most
    :data:`~mcpd.core.walk.FIND_MAX_BUDGET`, plus the margin), read from its raw arguments."""
    params = msg.get("params") if isinstance(msg, dict) else None
    args = params.get("arguments") if isinstance(params, dict) else None
    budget = args.get("time_budget_seconds") if isinstance(args, dict) else None
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        return default
    return deadline_seconds({"time_budget_seconds": min(float(budget), FIND_MAX_BUDGET)}, default)


def answered(msg: Any) -> bool:
    """Whether handling ``msg`` (one message of a body) sends a reply: anything but a well-formed
    notification or a client's response (what :meth:`McpSession._reply_for` answers with nothing)."""
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        return True
    if "method" not in msg:
        return not ("id" in msg and ("result" in msg or "error" in msg))
    return not isinstance(msg["method"], str) or "id" in msg


class McpSession:
    """The JSON-RPC state of one session (SPEC §2): lifecycle, in-flight requests, cancellation.

    Args:
        dispatcher: the shared :class:`Dispatcher`.
        session_id: the 32-hex session id (for logs and the privileged backend).
        send: puts one JSON-RPC message (object or array) on the session's stream; never blocks.
        modern: serve one 2026-07-28 request (SPEC §1.6, stateless era): no ``initialize`` nor
            ``ping``, ``server/discover`` instead, results shaped by :func:`modern_result`. The
            transport has checked the request's ``_meta`` and headers already.
        room: the backpressure of the stream behind ``send`` (:class:`Room`), or ``None``: every
            request whose reply goes there (not one a transport hands its own ``send``) waits for
            room first, and is answered ``-32000`` without running when none comes in time.
    """

    # (slots: an idle session is held for hours, and an instance dict costs it about 280 bytes)
    __slots__ = ("dispatcher", "session_id", "send", "initialized", "protocol_version", "_in_flight", "_tasks",
                 "_closed", "_methods", "modern", "last_done", "room")

    def __init__(self, dispatcher: Dispatcher, session_id: str, send: Send, modern: bool = False,
                 room: Room | None = None) -> None:
        self.dispatcher = dispatcher
        self.session_id = session_id
        self.send = send
        self.room = room
        self.initialized = False
        self.protocol_version: str | None = None
        # (both emptied by replacement, not by deletion: an idle session then holds two empty dicts,
        # not the tables its last requests grew them to)
        self._in_flight: dict[tuple[str, Any], asyncio.Task[Message | None]] = {}
        self._tasks: dict[asyncio.Task[Any], None] = {}
        self.last_done = 0.0  # time.monotonic() when a message's handling last ended (0: never)
        self._closed = False
        self._methods = _MODERN_METHODS if modern else _METHODS
        self.modern = modern
        if modern:
            self.initialized = True
            self.protocol_version = MODERN_VERSIONS[-1]

    def knows(self, method: str) -> bool:
        """Whether ``method`` is served (in this session's era)."""
        return method in self._methods

    # -- intake -------------------------------------------------------------------------------

    def receive(self, payload: Any, caller: Caller, send: Send | None = None) -> asyncio.Task[Any] | None:
        """Take one parsed POST body (object or array) and schedule its handling; returns at once.

        Requests run as separate tasks and reply through ``send`` in any order (SPEC §1.5); a
        batch replies with one array (SPEC §2.3): every member is answered (``-32000`` for one past
        ``max_in_flight`` or whose reply would pass the batch's byte bound), or, for a batch of
        more than ``max_batch`` members, none is run and the batch is answered with one ``-32600``
        (``id: null``). Replies to the session's own stream (``send`` ``None``) first take room in
        it (:class:`Room`): one request each, one batch as a whole.

        Args:
            payload: the parsed body.
            caller: who sent it.
            send: where this body's replies and progress go; ``None``: the session's own ``send``
                (the SSE stream). Streamable HTTP passes the POST's own response here.

        Returns:
            The task that ends once every reply of this body was handed to ``send`` (``None`` when
            nothing was scheduled: a closed session, or an empty batch answered at once).
        """
        if self._closed:
            return None
        out = self.send if send is None else send
        room = self.room if send is None else None
        if isinstance(payload, list):
            if not payload:
                out(error_reply(None, INVALID_REQUEST, "invalid request: empty batch"))
                return None
            cap = self.dispatcher.max_batch
            if len(payload) > cap:
                metrics.limit_hit("batch")
                out(error_reply(None, INVALID_REQUEST, f"batch of {len(payload)} members is over max_batch "
                                f"({cap}): none of them was run; send at most {cap} per batch"))
                return None
            return self._spawn(self._batch(payload, caller, out, room))
        return self._start(payload, caller, out, send_reply=True, room=room)

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks[task] = None
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.last_done = time.monotonic()  # (a session is idle from its last request's end, not start)
        self._tasks.pop(task, None)
        if not self._tasks:
            self._tasks = {}

    def _start(self, msg: Any, caller: Caller, out: Send, send_reply: bool,
               budget: list[int] | None = None, room: Room | None = None) -> asyncio.Task[Message | None]:
        """Schedule one message; register it as in flight when it is a well-formed request.

        ``out`` gets the request's progress, and its reply when ``send_reply`` (a batch member's
        reply is only the task's result, gathered into the batch's array, which ``budget`` bounds:
        ``[bytes left]``, shared by the batch's members). ``room``: where the reply takes room
        first (:class:`Room`; a message answered by nothing takes none)."""
        request = isinstance(msg, dict) and isinstance(msg.get("method"), str) and valid_id(msg.get("id"))
        if request and len(self._in_flight) >= self.dispatcher.max_in_flight:
            metrics.limit_hit("in_flight")
            return self._refuse(msg, out, send_reply, SERVER_BUSY,
                                f"{self.dispatcher.max_in_flight} requests of this session are in flight; retry later")
        if room is not None and not answered(msg):
            room = None
        task: asyncio.Task[Message | None] = self._spawn(self._handle(msg, caller, out, send_reply, budget, room))
        if request:
            key = _id_key(msg["id"])
            if key not in self._in_flight:
                self._in_flight[key] = task
                task.add_done_callback(functools.partial(self._forget, key))
        return task

    def _refuse(self, msg: Any, out: Send, send_reply: bool, code: int, text: str) -> asyncio.Task[Message | None]:
        """Answer ``msg`` with error ``code`` without running it (a notification gets nothing)."""
        async def answer() -> Message | None:
            if not isinstance(msg, dict) or "id" not in msg:
                return None
            reply = error_reply(msg["id"] if valid_id(msg["id"]) else None, code, text)
            if send_reply:
                out(reply)
                return None
            return reply

        return self._spawn(answer())

    def _forget(self, key: tuple[str, Any], task: asyncio.Task[Any]) -> None:
        if self._in_flight.get(key) is task:
            del self._in_flight[key]
            if not self._in_flight:
                self._in_flight = {}

    async def _batch(self, payload: list[Any], caller: Caller, out: Send, room: Room | None) -> None:
        """Run a batch's members side by side and answer with one array of their replies, bounded
        in bytes by ``max_batch_bytes`` (a member whose reply would pass it gets ``-32000``). With
        a ``room``, the batch first takes room for all of its array (``max_batch_bytes``), or is
        refused whole (one ``-32000``, ``id: null``, none of its members run) when none comes in time."""
        cost = self.dispatcher.max_batch_bytes
        if room is not None and not room.admit_now(cost) and not await room.admit(cost, approx_size(payload)):
            self._no_room(room, None, "none of the batch's members was run")
            return
        try:
            budget = [self.dispatcher.max_batch_bytes]  # bytes the batch's array may still take
            members = [self._start(m, caller, out, send_reply=False, budget=budget) for m in payload]
            results = await asyncio.gather(*members, return_exceptions=True)
            replies = [r for r in results if isinstance(r, dict)]
            if replies and not self._closed:
                if room is not None:
                    admitted, room = room, None
                    admitted.deliver(replies, cost)
                else:
                    out(replies)
        finally:
            if room is not None:
                room.release(cost)

    def _no_room(self, room: Room, rid: Any, what: str) -> None:
        """Answer a request (or batch) that found no room with ``-32000`` (``rid``: its id),
        unless the session was closed meanwhile."""
        if self._closed:
            return
        metrics.limit_hit("queue_overflow")
        room.deliver(error_reply(rid, SERVER_BUSY, f"no room in the session's outgoing queue (its client is not "
                                 f"taking its answers, or its other calls still run): {what}; retry later"), None)

    @property
    def busy(self) -> bool:
        """Some message of this session is still being handled."""
        return bool(self._tasks)

    def close(self) -> None:
        """End the session: cancel every in-flight task (their worker jobs are stopped by the pool)."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        self._in_flight.clear()

    # -- one message --------------------------------------------------------------------------

    async def _handle(self, msg: Any, caller: Caller, out: Send, send_reply: bool,
                      budget: list[int] | None = None, room: Room | None = None) -> Message | None:
        cost = 0
        if room is not None:
            if heavy(msg):
                cost = room.call_cost
            if not room.admit_now(cost) and not await room.admit(cost, approx_size(msg),
                                                                 admit_seconds(msg, room.wait_seconds)):
                rid = msg.get("id") if isinstance(msg, dict) else None
                self._no_room(room, rid if valid_id(rid) else None, "this request was not run")
                return None
        try:
            reply = await self._reply_for(msg, caller, out)
            if budget is not None and reply is not None:  # a batch member: its array is bounded in bytes
                size = approx_size(reply)
                if size > budget[0]:
                    metrics.limit_hit("batch_bytes")
                    reply = error_reply(reply.get("id"), SERVER_BUSY,
                                        f"the batch's answer would pass {self.dispatcher.max_batch_bytes} bytes: "
                                        f"this reply was dropped; send it alone")
                    size = approx_size(reply)  # (counted too: the array's bound holds whatever the members)
                budget[0] -= size
            if send_reply and reply is not None and not self._closed:
                if room is not None:
                    held, room = room, None
                    held.deliver(reply, cost)
                    return None  # (the reply is queued, encoded: the task need not keep it too)
                out(reply)
            return reply
        finally:
            if room is not None:
                room.release(cost)

    async def _reply_for(self, msg: Any, caller: Caller, out: Send) -> Message | None:
        if not isinstance(msg, dict):
            return error_reply(None, INVALID_REQUEST, "invalid request: not an object")
        has_id = "id" in msg
        req_id = msg.get("id")
        reply_id = req_id if valid_id(req_id) else None
        if msg.get("jsonrpc") != "2.0":
            return error_reply(reply_id, INVALID_REQUEST, 'invalid request: jsonrpc must be "2.0"')
        if "method" not in msg:
            if has_id and ("result" in msg or "error" in msg):
                return None  # a response from the client; this server sends no requests
            return error_reply(reply_id, INVALID_REQUEST, "invalid request: no method")
        method = msg["method"]
        if not isinstance(method, str):
            return error_reply(reply_id, INVALID_REQUEST, "invalid request: method must be a string")
        if not has_id:
            self._notification(method, msg.get("params"))
            return None
        if not valid_id(req_id):
            return error_reply(None, INVALID_REQUEST, "invalid request: id must be a string or a number "
                                                      "(finite, and exactly as a reply would write it back)")
        if self._in_flight.get(_id_key(req_id)) is not asyncio.current_task():
            return error_reply(req_id, INVALID_REQUEST, "invalid request: id already in flight")
        return await self._request(req_id, method, msg, caller, out)

    async def _request(self, req_id: Any, method: str, msg: Message, caller: Caller, out: Send) -> Message | None:
        entry = self._methods.get(method)
        if entry is None:
            return error_reply(req_id, METHOD_NOT_FOUND, "method not found")
        handler_name, needs_init = entry
        handler: Handler = getattr(self, handler_name)
        if needs_init and not self.initialized:
            return error_reply(req_id, INVALID_REQUEST, "session not initialized")
        try:
            params = _params(msg)
            meta = params.get("_meta")
            token = meta.get("progressToken") if isinstance(meta, dict) else None
            ctx = RequestContext(caller, self.session_id, token if valid_id(token) else None, out, self.modern)
            result = await handler(ctx, params)
            if self.modern:
                result = modern_result(method, result)
        except RpcError as exc:
            return error_reply(req_id, exc.code, exc.message, exc.data)
        except Exception:
            log.exception("method %s failed unexpectedly (session %s)", method, self.session_id)
            return error_reply(req_id, INTERNAL, "internal error")
        return {"jsonrpc": "2.0", "id": req_id, "result": result}

    def _notification(self, method: str, params: Any) -> None:
        if method == "notifications/cancelled" and isinstance(params, dict):
            target = params.get("requestId")
            if valid_id(target):
                task = self._in_flight.pop(_id_key(target), None)
                if task is not None:
                    task.cancel()
        # notifications/initialized and unknown notifications: nothing to do, never answered

    # -- methods ------------------------------------------------------------------------------

    async def _initialize(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        requested = params.get("protocolVersion")
        if not isinstance(requested, str):
            raise RpcError(INVALID_PARAMS, "protocolVersion must be a string")
        self.protocol_version = negotiate(requested)
        self.initialized = True
        return {
            "protocolVersion": self.protocol_version,
            "capabilities": CAPABILITIES,
            "serverInfo": dict(SERVER_INFO),
            "instructions": INSTRUCTIONS,
        }

    async def _discover(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        """``server/discover`` (2026-07-28): every version served, newest first (the session-era
        ones need ``initialize``), capabilities and instructions; identity via :func:`modern_result`."""
        return {
            "supportedVersions": [*reversed(MODERN_VERSIONS), *reversed(SUPPORTED_VERSIONS)],
            "capabilities": CAPABILITIES,
            "instructions": INSTRUCTIONS,
        }

    async def _ping(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        return {}

    async def _tools_list(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        return {"tools": self.dispatcher.list_tools()}

    async def _tools_call(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("name")
        if not isinstance(name, str):
            raise RpcError(INVALID_PARAMS, "name must be a string")
        return await self.dispatcher.call_tool(ctx, name, params.get("arguments"))

    async def _resources_list(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        return {"resources": []}

    async def _resource_templates_list(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        provider = self.dispatcher.resources
        return {"resourceTemplates": provider.list_templates() if provider else []}

    async def _resources_read(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        uri = params.get("uri")
        if not isinstance(uri, str):
            raise RpcError(INVALID_PARAMS, "uri must be a string")
        provider = self.dispatcher.resources
        if provider is None:
            raise RpcError(INVALID_PARAMS, "unknown resource")
        return await provider.read(ctx, uri, params)


# method → (McpSession handler's name, needs initialize); shared by every session (an idle session
# should hold little), the stateless era's set apart.
_METHODS: dict[str, tuple[str, bool]] = {
    "initialize": ("_initialize", False),
    "ping": ("_ping", False),
    "tools/list": ("_tools_list", True),
    "tools/call": ("_tools_call", True),
    "resources/list": ("_resources_list", True),
    "resources/templates/list": ("_resource_templates_list", True),
    "resources/read": ("_resources_read", True),
}
_MODERN_METHODS = {**{k: v for k, v in _METHODS.items() if k not in ("initialize", "ping")},
                   "server/discover": ("_discover", False)}
