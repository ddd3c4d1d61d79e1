"""What the MCP methods reach, shared by every session (docs/REFERENCE.md §2.4, §2.5): the
tools (run in the caller's worker, or forwarded to the policy process when ``privileged``) and
the resources, behind the method handlers ``tools/*`` and ``resources/*``.

Holds no session state: who calls and on which session comes in each :class:`RequestContext`;
the lifecycle methods (``initialize``, ``ping``, ``server/discover``) are the session's.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from mcpd.common.identity import Principal
from mcpd.common.redaction import with_redaction
from mcpd.core.tools import TOOLS, ToolModule, by_any_name, portable_name
from mcpd.front.access import AccessLog, Call
from mcpd.front.limits import LimitsTracker
from mcpd.front.mcp.confirm import elicit_then_retry, hitl_of, input_required
from mcpd.front.mcp.jsonrpc import INVALID_PARAMS, RpcError, Send, encodable
from mcpd.front.mcp.results import tool_error_result
from mcpd.front.mcp.tasks import TASK_TOOLS, TaskStore
from mcpd.front.mcp.versions import STRUCTURED_SINCE, session_tasks
from mcpd.front.privileged import PrivilegedBackend
from mcpd.helper.wire.errors import INTERNAL_ERROR, PERMISSION_DENIED, ToolError

log = logging.getLogger(__name__)

READ_ONLY_ANNOTATIONS = {"readOnlyHint": True, "openWorldHint": False}


@dataclass(frozen=True)
class Caller:
    """Who sent a POST: the authenticated principal, its bearer token (never logged) and peer ``host:port``."""

    principal: Principal
    token: str = field(repr=False)
    peer: str
    origin: str = ""  # ``https://host:port`` and base path the request came to (the confirmation page's)


@dataclass
class RequestContext:
    """What a method handler knows about its request; ``progress`` sends ``notifications/progress``."""

    caller: Caller
    session_id: str
    progress_token: str | int | None
    send: Send = field(repr=False)
    modern: bool = False  # a 2026-07-28 request (its resource errors use that revision's codes)
    protocol_version: str | None = None  # the session's (or the stateless request's) version
    #: ``traceparent``/``tracestate`` of the request's ``_meta``, when valid (for the records)
    trace: dict[str, str] = field(default_factory=dict)
    #: what the session's client declared at ``initialize`` (session era; empty otherwise)
    client_capabilities: dict[str, Any] = field(default_factory=dict)
    #: ``(method, params, timeout) -> result``: a request to the session's client on this request's
    #: stream (:class:`mcpd.front.mcp.outgoing.Outgoing`); None in the stateless era
    ask: Callable[[str, dict[str, Any], float], Awaitable[dict[str, Any]]] | None = None

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


#: A method handler: ``(context, params) -> result``; raises :class:`RpcError` for an error answer.
Handler = Callable[[RequestContext, dict[str, Any]], Awaitable[dict[str, Any]]]


class ToolPool(Protocol):
    """The worker pool's interface as the front uses it (``mcpd.front.workers.pool.WorkerPool``)."""

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


class Dispatcher:
    """Tool and resource dispatch for every session.

    Args:
        pool: runs unprivileged ops as the caller's OS account.
        privileged: forwards ``privileged: true`` calls to the policy process.
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
        self.access: AccessLog | None = None  # set by the server: every call's record (docs/REFERENCE.md §7.1)
        # per session (docs/REFERENCE.md §1.7): requests in flight at once, and members of one batch
        # that are run; set by the server from mcpd.yaml (max_in_flight, max_batch)
        self.max_in_flight = 64
        self.max_batch = 256
        self.max_batch_bytes = 16 * 1024 * 1024  # one batch's answer (session_queue_bytes): beyond, -32000 per member
        #: method → handler, for the methods that need an initialized session (shared by every session)
        self.handlers: dict[str, Handler] = {
            "tools/list": self.tools_list,
            "tools/call": self.tools_call,
            "resources/list": self.resources_list,
            "resources/templates/list": self.resource_templates_list,
            "resources/read": self.resources_read,
        }
        #: tool calls run as tasks, and the tasks/* methods (docs/REFERENCE.md §2.6); bounds set by the server
        self.tasks = TaskStore(self.call_tool)
        self.handlers.update(self.tasks.handlers())

    def list_tools(self, structured: bool = True, tasks: bool = False) -> list[dict[str, Any]]:
        """The ``tools`` array of ``tools/list``; ``structured``: with each tool's ``outputSchema``
        (sessions of 2025-06-18 and later, where the field exists); ``tasks``: with
        ``execution.taskSupport`` (sessions of 2025-11-25 and later)."""
        out = []
        for t in self.tools.values():
            tool = {
                "name": portable_name(t.NAME) if self._portable else t.NAME,
                "description": t.DESCRIPTION,
                "inputSchema": t.INPUT_SCHEMA,
                "annotations": dict(READ_ONLY_ANNOTATIONS),
            }
            if structured and t.OUTPUT_SCHEMA is not None:
                tool["outputSchema"] = t.OUTPUT_SCHEMA
            if tasks:
                tool["execution"] = {"taskSupport": "optional" if t.NAME in TASK_TOOLS else "forbidden"}
            out.append(tool)
        return out

    async def call_tool(self, ctx: RequestContext, name: Any, arguments: Any,
                        hitl: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run one ``tools/call`` by either spelling of the tool's name; tool failures become
        ``isError`` results. Grants, limits and records always see the ``files/…`` name.

        ``hitl``: a person in the loop (:func:`mcpd.front.mcp.confirm.hitl_of`); a privileged call
        that needs one answers the revision's input-required result (:func:`mcpd.front.mcp.confirm.input_required`).

        Raises:
            RpcError: ``-32602`` for an unknown tool name.
        """
        tool = self._callable.get(name) if isinstance(name, str) else None
        c = ctx.caller
        if tool is None:
            if self.access is not None:  # every call leaves one record, this one too
                self.access.unknown_tool(c.principal, c.peer, ctx.session_id, name, arguments, ctx.trace)
            raise RpcError(INVALID_PARAMS, "unknown tool")
        try:
            with Call(self.access, c.principal, c.peer, ctx.session_id, tool.NAME, arguments, ctx.trace) as call:
                args = tool.parse_args({} if arguments is None else arguments)
                if self.limits is not None:  # per-principal quota and answer size
                    args = self.limits.charge_call(c.principal.name, args)
                args = with_redaction(tool.NAME, args, c.principal.redact)  # the policy process decides its own
                if args.get("privileged"):
                    call.stage = "forwarded"
                    if (hitl or {}).get("declined"):
                        raise ToolError(PERMISSION_DENIED, "permission denied: the user declined the confirmation",
                                        reason="declined")
                    extra = {k: v for k, v in (hitl or {}).items() if k in ("interactive", "confirm", "why")}
                    try:
                        call.result = await self.privileged.call(c.token, c.principal, ctx.session_id, c.peer,
                                                                 tool.NAME, args, ctx.trace, **extra)
                    except ToolError as exc:  # a 2025-11-25 session: URL-mode elicitation, then the retry
                        if not (hitl or {}).get("elicit"):
                            raise
                        call.result = await elicit_then_retry(ctx, exc, lambda cid: self.privileged.call(
                            c.token, c.principal, ctx.session_id, c.peer, tool.NAME, args, ctx.trace,
                            **dict(extra, confirm=cid)))
                else:
                    call.stage = "unprivileged"
                    call.result = await self.pool.call(
                        c.principal.os_user, tool.NAME, args,
                        on_progress=ctx.progress if ctx.progress_token is not None else None,
                        token=c.token, owner=c.principal.name,
                    )
                return tool.format_result(readable(call.result))
        except ToolError as exc:
            asked = input_required(exc, c.origin) if ctx.modern and (hitl or {}).get("interactive") else None
            return asked if asked is not None else tool_error_result(exc)
        except Exception:
            log.exception("tool %s failed unexpectedly (session %s)", tool.NAME, ctx.session_id)
            return tool_error_result(ToolError(INTERNAL_ERROR, "internal error"))

    # -- method handlers ----------------------------------------------------------------------

    async def tools_list(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        """``tools/list``: every tool, in one page (with ``outputSchema`` from 2025-06-18 on)."""
        version = ctx.protocol_version
        return {"tools": self.list_tools(version is not None and version >= STRUCTURED_SINCE,
                                         not ctx.modern and session_tasks(version))}

    async def tools_call(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        """``tools/call``: :meth:`call_tool`, or a task running it when asked (docs/REFERENCE.md
        §2.6, :meth:`TaskStore.wanted`); ``-32602`` when ``name`` is not a string."""
        name = params.get("name")
        if not isinstance(name, str):
            raise RpcError(INVALID_PARAMS, "name must be a string")
        tool = self._callable.get(name)
        ttl = self.tasks.wanted(ctx, tool.NAME, params) if tool is not None else None
        if ttl is not None:
            return self.tasks.create(ctx, name, params.get("arguments"), ttl)
        return await self.call_tool(ctx, name, params.get("arguments"), hitl_of(params, ctx))

    async def resources_list(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        """``resources/list``: none (files are reached through the template)."""
        return {"resources": []}

    async def resource_templates_list(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        """``resources/templates/list``: the provider's templates."""
        provider = self.resources
        return {"resourceTemplates": provider.list_templates() if provider else []}

    async def resources_read(self, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
        """``resources/read``: the provider's answer; ``-32602`` for a ``uri`` that is not a string
        or when there is no provider."""
        uri = params.get("uri")
        if not isinstance(uri, str):
            raise RpcError(INVALID_PARAMS, "uri must be a string")
        provider = self.resources
        if provider is None:
            raise RpcError(INVALID_PARAMS, "unknown resource")
        return await provider.read(ctx, uri, params)
