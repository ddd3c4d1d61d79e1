"""Tool calls run as MCP tasks (docs/REFERENCE.md §2.6): ``files/find`` and ``files/grep`` may
answer at once with a task, which the client polls, reads and cancels by its id.

Two revisions shape them differently; one :class:`TaskStore` serves both:

- 2025-11-25 (sessions): the client asks with ``params.task`` (``{"ttl": ms}``) on ``tools/call``
  and gets ``{"task": Task}``; ``tasks/get``, ``tasks/result`` (waits for the end, then answers
  what the call would have), ``tasks/cancel`` (answers the cancelled task) and ``tasks/list``.
  A result with ``isError`` is a ``failed`` task. ``initialize`` declares ``capabilities.tasks``
  and ``tools/list`` marks the two tools ``execution.taskSupport: "optional"``.
- 2026-07-28 (stateless), the ``io.modelcontextprotocol/tasks`` extension: a client that lists
  the extension in its request's capabilities gets a task (``resultType: "task"``) for every call
  of those tools; ``tasks/get`` carries the result (or the JSON-RPC error) once the task ended;
  ``tasks/update`` and ``tasks/cancel`` are acknowledged with an empty result. A result with
  ``isError`` is a ``completed`` task. ``server/discover`` declares the extension.

A task belongs to the principal that made it, in the revision it was made in: anyone else asking
for its id is told it does not exist. A principal keeps at most ``max_per_principal`` tasks
(running or finished) and ``max_result_bytes`` of their results; each one ends when its time to live does (from its creation): its work
is cancelled and its result freed. The work itself is the dispatcher's ``tools/call`` (same
argument checks, limits, policy decision and records as a direct call); cancelling a task
cancels that coroutine, as ``notifications/cancelled`` cancels a request, which stops the
worker's job. The token that made a task is re-checked with the open sessions' tokens
(:meth:`TaskStore.working`); once it is refused, its working tasks are cancelled
(:meth:`TaskStore.revoke`), session or none.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from mcpd.common import wirejson
from mcpd.front import metrics
from mcpd.front.mcp.jsonrpc import INTERNAL, INVALID_PARAMS, METHOD_NOT_FOUND, SERVER_BUSY, RpcError, approx_size
from mcpd.front.mcp.results import tool_error_result
from mcpd.front.mcp.versions import META_CLIENT_CAPABILITIES, session_tasks
from mcpd.front.mcp.versions import TASKS_EXTENSION as EXTENSION
from mcpd.helper.wire.errors import FILE_TOO_LARGE, ToolError

if TYPE_CHECKING:
    from mcpd.front.mcp.dispatcher import RequestContext

log = logging.getLogger(__name__)

#: the tools that may run as tasks (``execution.taskSupport: "optional"``); the others may not
TASK_TOOLS = frozenset({"files/find", "files/grep"})
RELATED_TASK = "io.modelcontextprotocol/related-task"
#: a 2026-07-28 request for a task method from a client that did not declare the extension
MISSING_CAPABILITY = -32021
#: the task methods of the 2025-11-25 sessions only (the 2026-07-28 extension has neither)
SESSION_ONLY_METHODS = frozenset({"tasks/list", "tasks/result"})
TERMINAL = frozenset({"completed", "failed", "cancelled"})
LIST_PAGE = 50  # tasks per tasks/list page
CANCEL_WAIT_SECONDS = 5.0  # how long tasks/cancel waits for the work to have stopped
MAX_ID_CHARS = 128
NOT_FOUND = "task not found (unknown, expired, or not yours)"

#: runs one ``tools/call``: ``(context, name, arguments) -> CallToolResult``
Runner = Callable[["RequestContext", str, Any], Awaitable[dict[str, Any]]]


def _iso(ts: float) -> str:
    """``ts`` (seconds since the epoch) as ISO 8601 UTC with milliseconds: ``2026-07-28T10:30:00.000Z``."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def encoded_once(result: dict[str, Any]) -> dict[str, Any]:
    """A task's ``CallToolResult`` as it is held: each member that is an object, array or
    string (``content``, ``structuredContent``) encoded once
    (:class:`~mcpd.common.wirejson.Embedded`), so that every read of the result splices those
    bytes into its reply instead of encoding the result again, and the decoded strings are freed;
    ``_meta`` (merged with the related-task one by ``tasks/result``) and flags stay as they are."""
    return {key: value if key == "_meta" or not isinstance(value, (dict, list, str)) else wirejson.embedded(value)
            for key, value in result.items()}


def declares_extension(params: dict[str, Any]) -> bool:
    """Whether a 2026-07-28 request's ``_meta`` client capabilities list the tasks extension."""
    meta = params.get("_meta")
    caps = meta.get(META_CLIENT_CAPABILITIES) if isinstance(meta, dict) else None
    ext = caps.get("extensions") if isinstance(caps, dict) else None
    return isinstance(ext, dict) and isinstance(ext.get(EXTENSION), dict)


@dataclass(eq=False)
class Task:
    """One task: its owner (principal name) and revision, times (epoch seconds), status and outcome."""

    task_id: str
    owner: str
    modern: bool
    seq: int
    created: float
    ttl_ms: int
    updated: float = 0.0
    status: str = "working"
    message: str | None = None
    result: dict[str, Any] | None = None  # the CallToolResult, once completed (or failed with isError): encoded_once
    held: int = 0  # bytes of ``result`` counted against its owner's max_result_bytes
    error: dict[str, Any] | None = None  # the JSON-RPC error object, once failed with one
    done: asyncio.Event = field(default_factory=asyncio.Event)
    runner: asyncio.Task[None] | None = None
    expiry: asyncio.TimerHandle | None = None
    token: str = field(default="", repr=False)  # the bearer token that made it (never logged)
    token_id: str = ""  # that token's id (the principal's ``token_id``)


class TaskStore:
    """Every task of the daemon, by id (docs/REFERENCE.md §2.6), with the ``tasks/*`` handlers.

    Args:
        run: the dispatcher's ``tools/call`` (``(ctx, name, arguments) -> CallToolResult``; an
            :class:`RpcError` it raises becomes a ``failed`` task).
        max_per_principal: tasks one principal keeps at once (>= 1); past it a 2025-11-25 request
            is refused ``-32000`` and a 2026-07-28 one runs as a plain call.
        default_ttl_ms, max_ttl_ms: a task's time to live when its client names none, and at most
            (milliseconds, from its creation).
        poll_ms: the ``pollInterval`` suggested (milliseconds).
        max_result_bytes: bytes of results one principal's tasks hold at once (about, counted on
            their strings); a result that would pass it is replaced by a ``FILE_TOO_LARGE`` error
            result.
    """

    def __init__(self, run: Runner, max_per_principal: int = 16, default_ttl_ms: int = 300_000,
                 max_ttl_ms: int = 3_600_000, poll_ms: int = 1000, max_result_bytes: int = 64 * 1024 * 1024) -> None:
        self.run = run
        self.max_result_bytes = max_result_bytes
        self.max_per_principal = max_per_principal
        self.default_ttl_ms = default_ttl_ms
        self.max_ttl_ms = max_ttl_ms
        self.poll_ms = poll_ms
        self._tasks: dict[str, Task] = {}
        self._owned: dict[str, int] = {}  # principal name -> tasks kept
        self._held: dict[str, int] = {}  # principal name -> bytes of results kept
        self._seq = 0
        self._running: set[asyncio.Task[None]] = set()  # (held: the loop keeps only weak references)

    def configure(self, max_per_principal: int, default_ttl_seconds: float, max_ttl_seconds: float,
                  poll_interval_seconds: float, max_result_bytes: int) -> None:
        """Set the bounds from ``mcpd.yaml``'s ``tasks`` section (counts, seconds, bytes)."""
        self.max_result_bytes = max_result_bytes
        self.max_per_principal = max_per_principal
        self.default_ttl_ms = int(default_ttl_seconds * 1000)
        self.max_ttl_ms = int(max_ttl_seconds * 1000)
        self.poll_ms = int(poll_interval_seconds * 1000)

    def handlers(self) -> dict[str, Callable[[RequestContext, dict[str, Any]], Awaitable[dict[str, Any]]]]:
        """The ``tasks/*`` method handlers, for the dispatcher's table."""
        return {"tasks/get": self.tasks_get, "tasks/result": self.tasks_result, "tasks/cancel": self.tasks_cancel,
                "tasks/list": self.tasks_list, "tasks/update": self.tasks_update}

    # -- creating ---------------------------------------------------------------------------------

    def wanted(self, ctx: RequestContext, tool: str, params: dict[str, Any]) -> int | None:
        """Whether a ``tools/call`` runs as a task: the time to live it gets (ms), or ``None``
        (a plain call).

        Args:
            ctx: the request's context. tool: the (known) tool's ``files/…`` name.
            params: the ``tools/call`` params.

        Raises:
            RpcError: in a 2025-11-25 session, ``-32602`` for a ``task`` that is not an object or
                whose ``ttl`` is not a positive integer, ``-32601`` for a tool that cannot run as a
                task, ``-32000`` when the principal keeps ``max_per_principal`` tasks already.
        """
        if ctx.modern:
            if tool not in TASK_TOOLS or not declares_extension(params) or self._full(ctx):
                return None  # (past the bound: served as a plain call, which the extension allows)
            return self.default_ttl_ms
        if "task" not in params or not session_tasks(ctx.protocol_version):
            return None  # (before 2025-11-25 the field means nothing and is ignored)
        spec = params["task"]
        if not isinstance(spec, dict):
            raise RpcError(INVALID_PARAMS, "task must be an object ({} or {\"ttl\": milliseconds})")
        ttl = spec.get("ttl", self.default_ttl_ms)
        if type(ttl) is not int or ttl < 1:
            raise RpcError(INVALID_PARAMS, "task.ttl must be a positive integer (milliseconds)")
        if tool not in TASK_TOOLS:
            raise RpcError(METHOD_NOT_FOUND, f"{tool} cannot run as a task (only {', '.join(sorted(TASK_TOOLS))} can)")
        if self._full(ctx):
            metrics.limit_hit("tasks_per_principal")
            raise RpcError(SERVER_BUSY, f"this principal keeps {self.max_per_principal} tasks already; cancel one "
                           "or wait until one's ttl ends", {"maxTasks": self.max_per_principal})
        return min(ttl, self.max_ttl_ms)

    def _full(self, ctx: RequestContext) -> bool:
        return self._owned.get(ctx.caller.principal.name, 0) >= self.max_per_principal

    def create(self, ctx: RequestContext, name: str, arguments: Any, ttl_ms: int) -> dict[str, Any]:
        """Start ``tools/call name(arguments)`` as a task living ``ttl_ms`` ms; its ``CreateTaskResult``.

        The work runs with ``ctx``'s caller and session (for the records) but sends no progress:
        the request that made the task is answered at once."""
        now = time.time()
        self._seq += 1
        task = Task(secrets.token_hex(16), ctx.caller.principal.name, ctx.modern, self._seq, now, ttl_ms, now,
                    message="the call is running", token=ctx.caller.token, token_id=ctx.caller.principal.token_id)
        self._tasks[task.task_id] = task
        self._owned[task.owner] = self._owned.get(task.owner, 0) + 1
        loop = asyncio.get_running_loop()
        task.expiry = loop.call_later(ttl_ms / 1000, self._expire, task.task_id)
        work_ctx = replace(ctx, progress_token=None)
        task.runner = loop.create_task(self._work(task, work_ctx, name, arguments))
        self._running.add(task.runner)
        task.runner.add_done_callback(self._running.discard)
        log.info("task %s: %s for %s (session %s, ttl %d ms)", task.task_id, name, task.owner, ctx.session_id, ttl_ms)
        if ctx.modern:
            return {**self._view(task), "resultType": "task"}
        return {"task": self._view(task)}

    async def _work(self, task: Task, ctx: RequestContext, name: str, arguments: Any) -> None:
        try:
            result = await self.run(ctx, name, arguments)
        except asyncio.CancelledError:
            self._finish(task, "cancelled", "the task was cancelled")
            raise
        except RpcError as exc:
            if task.status in TERMINAL:
                return
            error: dict[str, Any] = {"code": exc.code, "message": exc.message}
            if exc.data is not None:
                error["data"] = exc.data
            task.error = error
            self._finish(task, "failed", exc.message)
        except Exception:
            log.exception("task %s failed unexpectedly", task.task_id)
            task.error = {"code": INTERNAL, "message": "internal error"}
            self._finish(task, "failed", "internal error")
        else:
            if task.status in TERMINAL:
                return  # (cancelled meanwhile: the work ended before the cancellation reached it)
            result = self._hold(task, result)
            if result.get("isError") and not task.modern:  # (2025-11-25: a tool error is a failed task)
                content = result.get("content")
                text = content[0].get("text") if isinstance(content, list) and content and \
                    isinstance(content[0], dict) else None
                status, message = "failed", text if isinstance(text, str) else "the tool failed"
            else:
                status, message = "completed", "the call is done"
            task.result = encoded_once(result)
            self._finish(task, status, message)

    def _hold(self, task: Task, result: dict[str, Any]) -> dict[str, Any]:
        """``result`` counted against its owner's :attr:`max_result_bytes`, or, past it, the
        ``FILE_TOO_LARGE`` error result that takes its place."""
        size = approx_size(result)
        held = self._held.get(task.owner, 0)
        if held + size > self.max_result_bytes:
            return tool_error_result(ToolError(
                FILE_TOO_LARGE, "this result would pass the bytes this principal's tasks may hold", size=size,
                limit=self.max_result_bytes - held,
                suggestion="cancel or let expire your other tasks, narrow the search, or call without a task"))
        task.held = size
        self._held[task.owner] = held + size
        return result

    def _finish(self, task: Task, status: str, message: str) -> None:
        if task.status in TERMINAL:
            return  # (terminal is for good: a cancelled task stays cancelled)
        task.status, task.message, task.updated = status, message, time.time()
        task.done.set()

    # -- ending -----------------------------------------------------------------------------------

    def _expire(self, task_id: str) -> None:
        """A task's time to live ended: stop its work, free its result, forget it."""
        task = self._tasks.pop(task_id, None)
        if task is None:
            return
        for table, amount in ((self._owned, 1), (self._held, task.held)):
            left = table.get(task.owner, 0) - amount
            if left > 0:
                table[task.owner] = left
            else:
                table.pop(task.owner, None)
        if task.runner is not None and not task.runner.done():
            task.runner.cancel()
        task.result = task.error = None
        task.done.set()  # (tasks/result waiting on it answers "not found")
        log.info("task %s expired", task_id)

    def working(self) -> list[tuple[str, str, str]]:
        """``(token, owner, token_id)`` of every task still working: the tokens whose revocation
        must stop them (checked by :func:`mcpd.front.revalidate.revalidate_once`)."""
        return [(t.token, t.owner, t.token_id) for t in self._tasks.values() if t.status not in TERMINAL]

    def revoke(self, owner: str, token: str) -> int:
        """The bearer ``token`` of principal ``owner`` no longer authenticates: stop the work of
        the tasks it made, as its sessions' requests are stopped (each reads ``cancelled``; an
        ended one keeps its outcome, its principal's other tokens still read it until its ttl).
        Returns how many were stopped."""
        count, wanted = 0, token.encode("utf-8", "surrogatepass")  # (bytes: compare_digest takes ASCII str only)
        for task in list(self._tasks.values()):
            if task.owner != owner or task.status in TERMINAL or \
                    not hmac.compare_digest(task.token.encode("utf-8", "surrogatepass"), wanted):
                continue
            self._finish(task, "cancelled", "the task was cancelled: the token that made it was revoked")
            if task.runner is not None and not task.runner.done():
                task.runner.cancel()
            log.info("task %s cancelled: its token was revoked", task.task_id)
            count += 1
        return count

    def close(self) -> None:
        """Stop every task's work and forget them all (the daemon stops)."""
        for task_id in list(self._tasks):
            task = self._tasks[task_id]
            if task.expiry is not None:
                task.expiry.cancel()
            self._expire(task_id)

    # -- finding ----------------------------------------------------------------------------------

    def _find(self, ctx: RequestContext, params: dict[str, Any]) -> Task:
        """The caller's task named by ``params.taskId``.

        Raises:
            RpcError: ``-32021`` in a 2026-07-28 request without the extension; ``-32601`` in a
                session before 2025-11-25; ``-32602`` for a ``taskId`` that is not a string, or
                names no task of this principal in this revision.
        """
        self._era(ctx, params)
        task_id = params.get("taskId")
        if not isinstance(task_id, str) or not 0 < len(task_id) <= MAX_ID_CHARS:
            raise RpcError(INVALID_PARAMS, f"taskId must be a string of 1 to {MAX_ID_CHARS} characters")
        task = self._tasks.get(task_id)
        if task is None or task.owner != ctx.caller.principal.name or task.modern != ctx.modern:
            raise RpcError(INVALID_PARAMS, NOT_FOUND)
        return task

    @staticmethod
    def _era(ctx: RequestContext, params: dict[str, Any], modern_only: bool = False,
             session_only: bool = False) -> None:
        if ctx.modern:
            if session_only:
                raise RpcError(METHOD_NOT_FOUND, "method not found")
            if not declares_extension(params):
                raise RpcError(MISSING_CAPABILITY, "Missing required client capability",
                               {"requiredCapabilities": {"extensions": {EXTENSION: {}}}})
        elif modern_only or not session_tasks(ctx.protocol_version):
            raise RpcError(METHOD_NOT_FOUND, "method not found")

    def _view(self, task: Task, detailed: bool = False) -> dict[str, Any]:
        """The task as its revision writes it (2026-07-28 ``detailed``: with its result or error)."""
        out: dict[str, Any] = {"taskId": task.task_id, "status": task.status}
        if task.message is not None:
            out["statusMessage"] = task.message
        out["createdAt"], out["lastUpdatedAt"] = _iso(task.created), _iso(task.updated)
        if task.modern:
            out["ttlMs"], out["pollIntervalMs"] = task.ttl_ms, self.poll_ms
            if detailed and task.status == "completed" and task.result is not None:
                out["result"] = task.result
            elif detailed and task.status == "failed" and task.error is not None:
                out["error"] = task.error
        else:
            out["ttl"], out["pollInterval"] = task.ttl_ms, self.poll_ms
        return out

    # -- method handlers --------------------------------------------------------------------------

    async def tasks_get(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        """``tasks/get``: the task's state (2026-07-28: with its result or error once it ended)."""
        return self._view(self._find(ctx, params), detailed=True)

    async def tasks_result(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        """``tasks/result`` (2025-11-25): wait until the task ended, then answer what its call would
        have: the ``CallToolResult`` (with the related-task ``_meta``) or its JSON-RPC error;
        ``-32602`` for a cancelled task (no result) or one that expired meanwhile."""
        self._era(ctx, params, session_only=True)
        task = self._find(ctx, params)
        await task.done.wait()
        if self._tasks.get(task.task_id) is not task:
            raise RpcError(INVALID_PARAMS, NOT_FOUND)
        if task.error is not None:
            raise RpcError(task.error["code"], task.error["message"], task.error.get("data"))
        if task.result is None:
            raise RpcError(INVALID_PARAMS, "the task was cancelled: it has no result", {"taskId": task.task_id})
        meta = task.result.get("_meta")
        related = {RELATED_TASK: {"taskId": task.task_id}}
        return {**task.result, "_meta": {**(meta if isinstance(meta, dict) else {}), **related}}

    async def tasks_cancel(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        """``tasks/cancel``: stop the task's work (its worker job with it) and mark it ``cancelled``.
        2025-11-25: answers the cancelled task; ``-32602`` for a task already ended. 2026-07-28: an
        empty acknowledgement (a task already ended keeps its outcome)."""
        task = self._find(ctx, params)
        if task.status in TERMINAL:
            if ctx.modern:
                return {}
            raise RpcError(INVALID_PARAMS, f"cannot cancel task: already in terminal status '{task.status}'")
        self._finish(task, "cancelled", "the task was cancelled by request")
        runner = task.runner
        if runner is not None and not runner.done():
            runner.cancel()
            await asyncio.wait({runner}, timeout=CANCEL_WAIT_SECONDS)
        log.info("task %s cancelled", task.task_id)
        return {} if ctx.modern else self._view(task)

    async def tasks_list(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        """``tasks/list`` (2025-11-25): the caller's tasks, newest first, :data:`LIST_PAGE` a page;
        ``-32602`` for a ``cursor`` this server did not give (one of ASCII digits only: ``str.isdigit``
        also takes ``²`` and ``١``, which ``int`` refuses or reads as another number)."""
        self._era(ctx, params, session_only=True)
        cursor = params.get("cursor")
        below = None
        if cursor is not None:
            if not isinstance(cursor, str) or not (cursor.isascii() and cursor.isdigit()) or len(cursor) > 20:
                raise RpcError(INVALID_PARAMS, "invalid cursor")
            below = int(cursor)
        name = ctx.caller.principal.name
        mine = sorted((t for t in self._tasks.values() if t.owner == name and not t.modern
                       and (below is None or t.seq < below)), key=lambda t: -t.seq)
        page = mine[:LIST_PAGE]
        out: dict[str, Any] = {"tasks": [self._view(t) for t in page]}
        if len(mine) > LIST_PAGE:
            out["nextCursor"] = str(page[-1].seq)
        return out

    async def tasks_update(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        """``tasks/update`` (2026-07-28): acknowledged with an empty result. These tasks never ask
        for input, so every ``inputResponses`` entry answers nothing outstanding and is ignored;
        ``-32602`` when ``inputResponses`` is not an object."""
        self._era(ctx, params, modern_only=True)
        self._find(ctx, params)
        if not isinstance(params.get("inputResponses"), dict):
            raise RpcError(INVALID_PARAMS, "inputResponses must be an object")
        return {}
