"""One MCP session's JSON-RPC state (docs/REFERENCE.md §2): its lifecycle (``initialize``,
``ping``, ``server/discover``) and version, its requests in flight and their cancellation, its
batches and their bounds, and the backpressure of its outgoing stream (:class:`Room`).

:class:`McpSession` receives parsed POST bodies (an object or a batch array), runs every request
as its own asyncio task (docs/REFERENCE.md §1.5) and hands each reply to a ``send`` callback. What
the other methods do is the :class:`~mcpd.front.mcp.dispatcher.Dispatcher`'s; keeping sessions
(tables, expiry, streams) is the transports'.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable
from typing import Any, Protocol

from mcpd.common.deadline import deadline_seconds
from mcpd.common.tracecontext import trace_fields
from mcpd.front import metrics
from mcpd.front.mcp.dispatcher import Caller, Dispatcher, Handler, RequestContext
from mcpd.front.mcp.jsonrpc import (
    INTERNAL,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    SERVER_BUSY,
    Message,
    RpcError,
    Send,
    answered,
    approx_size,
    error_reply,
    id_key,
    params_of,
    valid_id,
)
from mcpd.front.mcp.outgoing import Outgoing
from mcpd.front.mcp.tasks import SESSION_ONLY_METHODS
from mcpd.front.mcp.versions import (
    INSTRUCTIONS,
    MODERN_VERSIONS,
    NO_BATCHES_SINCE,
    SERVER_INFO,
    SUPPORTED_VERSIONS,
    capabilities,
    modern_result,
    negotiate,
)

log = logging.getLogger(__name__)


class Room(Protocol):
    """Backpressure of a session's own outgoing stream (:class:`~mcpd.front.sessions.session.Session`):
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


class AnswerBudget(Protocol):
    """The outgoing-byte budgets of a principal's answers (the session table,
    :class:`~mcpd.front.sessions.budgets.Budgets`): an answer that may be large reserves room
    there before its bytes are made (:meth:`reserve`) and gives it back (:meth:`unreserve`) as it
    hands the answer to what holds it, which charges it from then on."""

    admit_seconds: float

    async def reserve(self, name: str, size: int, seconds: float) -> int:
        """Wait for room for about ``size`` bytes of principal ``name``'s; the bytes reserved
        (0 for a small answer). Raises :class:`RpcError` (``-32000``) when none can come."""
        ...

    def unreserve(self, name: str, size: int) -> None:
        """Give back ``size`` bytes :meth:`reserve` reserved."""
        ...

    def start_call_now(self, name: str) -> bool:
        """Count a call that may answer large as in hand if there is room now; whether it did."""
        ...

    async def start_call(self, name: str, seconds: float) -> None:
        """:meth:`start_call_now`, else wait; raises :class:`RpcError` (``-32000``) when no
        start comes within ``seconds``."""
        ...

    def call_placed(self, name: str) -> None:
        """A call counted in hand has its answer placed."""
        ...


#: Methods whose reply may be large (a worker's answer): each takes :attr:`Room.call_cost`.
HEAVY_METHODS = frozenset({"tools/call", "resources/read", "tasks/result", "tasks/get"})
#: Of those, the ones that make their answer (a worker's run): each is a call in hand
#: (:meth:`AnswerBudget.start_call`) until its answer is placed.
MAKING_METHODS = frozenset({"tools/call", "resources/read"})


def heavy(msg: Any) -> bool:
    """Whether ``msg`` asks for a method whose reply may be large (:data:`HEAVY_METHODS`)."""
    method = msg.get("method") if isinstance(msg, dict) else None
    return isinstance(method, str) and method in HEAVY_METHODS


def makes_on_workers(msg: Any) -> bool:
    """Whether request ``msg`` makes its answer in the caller's workers (:data:`MAKING_METHODS`,
    not ``privileged``: those calls are bounded by the privileged route)."""
    if not isinstance(msg, dict) or "id" not in msg:
        return False
    method = msg.get("method")
    if not isinstance(method, str) or method not in MAKING_METHODS:
        return False
    params = msg.get("params")
    args = params.get("arguments") if isinstance(params, dict) else None
    return not (isinstance(args, dict) and args.get("privileged") is True)


def admit_seconds(msg: Any, default: float) -> float:
    """How long a request may wait for room: its own deadline
    (:func:`~mcpd.common.deadline.deadline_seconds`: a find's time budget, at most
    :data:`~mcpd.common.deadline.BUDGET_MAX_SECONDS`, plus the margin, else ``default``), read
    from its raw arguments."""
    params = msg.get("params") if isinstance(msg, dict) else None
    args = params.get("arguments") if isinstance(params, dict) else None
    name = params.get("name") if isinstance(params, dict) else None
    return deadline_seconds(args, default, name if isinstance(name, str) else None) if isinstance(args, dict) else default


class McpSession:
    """The JSON-RPC state of one session (docs/REFERENCE.md §2): lifecycle, in-flight requests,
    cancellation, batches.

    Args:
        dispatcher: the shared :class:`Dispatcher`.
        session_id: the 32-hex session id (for logs and the privileged backend).
        send: puts one JSON-RPC message (object or array) on the session's stream; never blocks.
        modern: serve one 2026-07-28 request (docs/REFERENCE.md §1.6, stateless era): no ``initialize`` nor
            ``ping``, ``server/discover`` instead, results shaped by :func:`modern_result`. The
            transport has checked the request's ``_meta`` and headers already.
        room: the backpressure of the stream behind ``send`` (:class:`Room`), or ``None``: every
            request whose reply goes there (not one a transport hands its own ``send``) waits for
            room first, and is answered ``-32000`` without running when none comes in time.
        budget: the principals' outgoing-byte budgets (:class:`AnswerBudget`), or ``None``: the
            reply of a method that may answer large (:data:`HEAVY_METHODS`) reserves its size
            there before it is encoded, and is answered ``-32000`` instead when it can never fit
            or no room comes within the request's deadline.
    """

    # (slots: an idle session is held for hours, and an instance dict costs it about 280 bytes)
    __slots__ = ("dispatcher", "session_id", "send", "initialized", "protocol_version", "_in_flight", "_tasks",
                 "_closed", "_lifecycle", "modern", "last_done", "room", "client_capabilities", "outgoing", "budget")

    def __init__(self, dispatcher: Dispatcher, session_id: str, send: Send, modern: bool = False,
                 room: Room | None = None, budget: AnswerBudget | None = None) -> None:
        self.dispatcher = dispatcher
        self.session_id = session_id
        self.send = send
        self.room = room
        self.budget = budget
        self.initialized = False
        self.protocol_version: str | None = None
        # (both emptied by replacement, not by deletion: an idle session then holds two empty dicts,
        # not the tables its last requests grew them to)
        self._in_flight: dict[tuple[str, Any], asyncio.Task[Message | None]] = {}
        self._tasks: dict[asyncio.Task[Any], None] = {}
        self.last_done = 0.0  # time.monotonic() when a message's handling last ended (0: never)
        self._closed = False
        self._lifecycle = _MODERN_LIFECYCLE if modern else _LIFECYCLE
        self.modern = modern
        #: what the client declared at ``initialize`` (session era), and this server's requests to it
        self.client_capabilities: dict[str, Any] = {}
        self.outgoing = Outgoing()
        if modern:
            self.initialized = True
            self.protocol_version = MODERN_VERSIONS[-1]

    def knows(self, method: str) -> bool:
        """Whether ``method`` is served (in this session's era)."""
        if self.modern and method in SESSION_ONLY_METHODS:
            return False
        return method in self._lifecycle or method in self.dispatcher.handlers

    # -- intake -------------------------------------------------------------------------------

    def receive(self, payload: Any, caller: Caller, send: Send | None = None) -> asyncio.Task[Any] | None:
        """Take one parsed POST body (object or array) and schedule its handling; returns at once.

        Requests run as separate tasks and reply through ``send`` in any order (docs/REFERENCE.md §1.5); a
        batch replies with one array (docs/REFERENCE.md §2.3): every member is answered (``-32000`` for one past
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
            if self.protocol_version is not None and self.protocol_version >= NO_BATCHES_SINCE:
                out(error_reply(None, INVALID_REQUEST, f"batches are not part of MCP {self.protocol_version} "
                                f"(none since {NO_BATCHES_SINCE}): none of the batch's members was run; "
                                "send each message in a request of its own"))
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
            key = id_key(msg["id"])
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
        making = self.budget if self.budget is not None and makes_on_workers(msg) else None
        name = caller.principal.name
        try:
            refused = None
            if making is not None and not making.start_call_now(name):
                refused = await self._wait_to_make(making, name, msg)
                if refused is not None:
                    making = None  # (not counted)
            reply = refused if refused is not None else await self._reply_for(msg, caller, out)
            if budget is not None and reply is not None:  # a batch member: its array is bounded in bytes
                size = approx_size(reply)
                if size > budget[0]:
                    metrics.limit_hit("batch_bytes")
                    reply = error_reply(reply.get("id"), SERVER_BUSY,
                                        f"the batch's answer would pass {self.dispatcher.max_batch_bytes} bytes: "
                                        f"this reply was dropped; send it alone")
                    size = approx_size(reply)  # (counted too: the array's bound holds whatever the members)
                budget[0] -= size
            reserved = 0
            if send_reply and reply is not None and self.budget is not None and "result" in reply and heavy(msg):
                try:  # (room for its bytes before they are made)
                    reserved = await self.budget.reserve(name, approx_size(reply),
                                                         admit_seconds(msg, self.budget.admit_seconds))
                except RpcError as exc:
                    reply = error_reply(reply["id"], exc.code, exc.message, exc.data)
            if reserved:  # (what holds the reply charges it from here on, in this same step)
                self.budget.unreserve(name, reserved)
            if making is not None:
                making.call_placed(name)
                making = None
            if send_reply and reply is not None and not self._closed:
                if room is not None:
                    held, room = room, None
                    held.deliver(reply, cost)
                    return None  # (the reply is queued, encoded: the task need not keep it too)
                out(reply)
            return reply
        finally:
            if making is not None:
                making.call_placed(name)
            if room is not None:
                room.release(cost)

    @staticmethod
    async def _wait_to_make(making: AnswerBudget, name: str, msg: Message) -> Message | None:
        """Wait until principal ``name`` may start call ``msg`` (:meth:`AnswerBudget.start_call`,
        within the call's deadline); ``None`` once it is counted, else its ``-32000`` reply."""
        try:
            await making.start_call(name, admit_seconds(msg, making.admit_seconds))
        except RpcError as exc:
            rid = msg.get("id")
            return error_reply(rid if valid_id(rid) else None, exc.code, exc.message)
        return None

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
                self.outgoing.resolve(msg)  # a response to one of ours (mcpd.front.mcp.outgoing), else dropped
                return None
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
        if self._in_flight.get(id_key(req_id)) is not asyncio.current_task():
            return error_reply(req_id, INVALID_REQUEST, "invalid request: id already in flight")
        return await self._request(req_id, method, msg, caller, out)

    async def _request(self, req_id: Any, method: str, msg: Message, caller: Caller, out: Send) -> Message | None:
        name = self._lifecycle.get(method)
        handler: Handler | None = getattr(self, name) if name is not None else self.dispatcher.handlers.get(method)
        if handler is None:
            return error_reply(req_id, METHOD_NOT_FOUND, "method not found")
        if name is None and not self.initialized:
            return error_reply(req_id, INVALID_REQUEST, "session not initialized")
        try:
            params = params_of(msg)
            meta = params.get("_meta")
            token = meta.get("progressToken") if isinstance(meta, dict) else None
            ctx = RequestContext(caller, self.session_id, token if valid_id(token) else None, out, self.modern,
                                 self.protocol_version, trace_fields(meta), self.client_capabilities,
                                 None if self.modern else functools.partial(self.outgoing.ask, out))
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
                task = self._in_flight.pop(id_key(target), None)
                if task is not None:
                    task.cancel()
        # notifications/initialized and unknown notifications: nothing to do, never answered

    # -- lifecycle methods --------------------------------------------------------------------

    async def _initialize(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        requested = params.get("protocolVersion")
        if not isinstance(requested, str):
            raise RpcError(INVALID_PARAMS, "protocolVersion must be a string")
        self.protocol_version = negotiate(requested)
        caps = params.get("capabilities")
        self.client_capabilities = caps if isinstance(caps, dict) else {}
        self.initialized = True
        return {
            "protocolVersion": self.protocol_version,
            "capabilities": capabilities(self.protocol_version),
            "serverInfo": dict(SERVER_INFO),
            "instructions": INSTRUCTIONS,
        }

    async def _discover(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        """``server/discover`` (2026-07-28): every version served, newest first (the session-era
        ones need ``initialize``), capabilities and instructions; identity via :func:`modern_result`."""
        return {
            "supportedVersions": [*reversed(MODERN_VERSIONS), *reversed(SUPPORTED_VERSIONS)],
            "capabilities": capabilities(MODERN_VERSIONS[-1]),
            "instructions": INSTRUCTIONS,
        }

    async def _ping(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        return {}


# The lifecycle methods (McpSession handlers' names), which need no initialize; every other
# method is the dispatcher's (Dispatcher.handlers) and needs one. Shared by every session (an idle
# session should hold little), the stateless era's apart.
_LIFECYCLE = {"initialize": "_initialize", "ping": "_ping"}
_MODERN_LIFECYCLE = {"server/discover": "_discover"}
