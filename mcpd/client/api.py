"""The MCP client used by ``linuxctl`` and the tests: tools and resources over one session.

Usage::

    async with Client("https://127.0.0.1:9091", token, cafile="ca.crt", transport="auto") as c:
        tools = await c.list_tools()
        result = await c.call_tool("files/read", {"path": "/etc/hosts"})

The transports and the handshake are :class:`~mcpd.client.session.Session`'s; blocking forms for
scripts are :func:`run_sync`, :func:`read_resource_sync` and :func:`call_tool_sync`. This module
is the client's public face: it also names the error family (:mod:`mcpd.client.errors`, with a
refusal by HTTP status from :mod:`mcpd.client.refusal`) and the URL and TLS helpers
(:mod:`mcpd.client.endpoints`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mcpd.client.endpoints import endpoints, sse_url, ssl_context
from mcpd.client.errors import (
    AuthError,
    ConnectError,
    MCPClientError,
    ProtocolError,
    ResourceFailed,
    RPCError,
    ToolFailed,
    UsageError,
)
from mcpd.client.refusal import HTTPRefused, retry_after, server_message
from mcpd.client.session import PROTOCOL_VERSION, TRANSPORTS, ProgressHandler, Session

__all__ = [
    "PROTOCOL_VERSION", "TRANSPORTS", "AuthError", "Client", "ConnectError", "HTTPRefused", "MCPClientError",
    "ProgressHandler", "ProtocolError", "RPCError", "ResourceFailed", "ToolFailed", "UsageError", "call_tool_sync",
    "endpoints", "read_resource_sync", "retry_after", "run_sync", "server_message", "sse_url", "ssl_context",
    "text_of", "tool_failure",
]

T = TypeVar("T")


class Client(Session):
    """One MCP session (arguments and errors on entry: :class:`~mcpd.client.session.Session`) with
    MCP's requests: ``tools/list``, ``tools/call``, ``resources/read``, ``resources/templates/list``.
    """

    async def list_tools(self) -> list[dict[str, Any]]:
        """``tools/list``: the tool descriptions (name, description, inputSchema ...), docs/REFERENCE.md §2.4."""
        result = await self.request("tools/list", {})
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            raise ProtocolError("tools/list returned no tool list")
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any], *, check: bool = True,
                        timeout: float | None = None, on_progress: ProgressHandler | None = None) -> dict[str, Any]:
        """``tools/call``; returns the ``CallToolResult`` mapping (docs/REFERENCE.md §2.5).

        Args:
            check: raise :class:`ToolFailed` (code from ``structuredContent.error.code``) when the
                result has ``isError: true``; with ``False`` the error result is returned as is.
            timeout: seconds to wait for the answer (default: the client's).
            on_progress: called as ``(progress, total | None, message | None)`` for each
                ``notifications/progress`` of this call (a ``_meta.progressToken`` is sent).
        """
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        token = None
        if on_progress is not None:
            token = f"progress-{next(self._ids)}"
            self._progress[token] = on_progress
            params["_meta"] = {"progressToken": token}
        try:
            result = await self.request("tools/call", params, timeout)
        finally:
            if token is not None:
                self._progress.pop(token, None)
        if not isinstance(result, dict):
            raise ProtocolError("tools/call returned no result object")
        if check and result.get("isError"):
            raise tool_failure(result)
        return result

    async def read_resource(
        self, uri: str, encoding: str | None = None, include_metadata: bool = False,
        line_range: tuple[int | None, int | None] | None = None, privileged: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """``resources/read`` of a ``file:`` URI; safe to run many at once
        (``asyncio.gather``) on one client: answers are matched by id.

        Args:
            uri: ``file:///abs/path`` (or ``file:relative/path`` inside the workspace); a query
                such as ``?start_line=5&end_line=9&encoding=latin-1`` also works.
            encoding: ``utf-8``, ``ascii``, ``latin-1``, ``cp1252``, ``utf-16``, ``auto`` or
                ``base64`` (the file's bytes as a ``blob``).
            include_metadata: ask for ``_meta`` (size, lines, encoding, language, sha256 ...).
            line_range: ``(start, end)`` lines, 1-based and inclusive; ``None`` for an open end.
            privileged: read through an mcp-sudo.yaml grant (docs/REFERENCE.md §4).

        Returns: the first ``contents`` item: ``{"uri", "mimeType", "text", "_meta"?}``, or with
            ``"blob"`` (base64) in place of ``"text"`` for a file that is not text.
        Raises: :class:`ResourceFailed` (``.code`` is the tool error code, docs/REFERENCE.md §2.5),
            :class:`RPCError`, and the transport errors.
        """
        params: dict[str, Any] = {"uri": uri, "includeMetadata": include_metadata}
        if encoding is not None:
            params["encoding"] = encoding
        if line_range is not None:
            start, end = line_range
            params["lineRange"] = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
        if privileged:
            params["privileged"] = True
        try:
            result = await self.request("resources/read", params, timeout)
        except RPCError as exc:
            data = exc.data if isinstance(exc.data, dict) else {}
            code, details = data.get("code"), data.get("details")
            if not isinstance(code, str):
                raise
            message = data.get("message")
            raise ResourceFailed(exc.rpc_code, code, message if isinstance(message, str) else exc.message,
                                 details if isinstance(details, dict) else {}) from None
        contents = result.get("contents") if isinstance(result, dict) else None
        if not isinstance(contents, list) or not contents or not isinstance(contents[0], dict):
            raise ProtocolError("resources/read returned no contents")
        item: dict[str, Any] = contents[0]
        return item

    async def list_resource_templates(self) -> list[dict[str, Any]]:
        """``resources/templates/list``: the ``resourceTemplates`` list."""
        result = await self.request("resources/templates/list", {})
        return list(result.get("resourceTemplates", [])) if isinstance(result, dict) else []


def tool_failure(result: dict[str, Any]) -> ToolFailed:
    """Build :class:`ToolFailed` from an ``isError`` result (code from ``structuredContent``)."""
    structured = result.get("structuredContent")
    err = structured.get("error") if isinstance(structured, dict) else None
    err = err if isinstance(err, dict) else {}
    message = err.get("message")
    if not isinstance(message, str):
        message = text_of(result) or "tool failed"
    raw_details = err.get("details")
    details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
    return ToolFailed(str(err.get("code") or "TOOL_ERROR"), message, details, result)


def text_of(result: dict[str, Any]) -> str:
    """The concatenated ``text`` of a result's text content items."""
    content = result.get("content")
    if not isinstance(content, list):
        return ""
    return "".join(c["text"] for c in content if isinstance(c, dict) and isinstance(c.get("text"), str))


def run_sync(url: str, token: str, cafile: str | None, fn: Callable[[Client], Awaitable[T]],
             timeout: float = 30.0) -> T:
    """Open a :class:`Client`, run ``await fn(client)``, close, and return its value (for scripts)."""

    async def go() -> T:
        async with Client(url, token, cafile, timeout) as c:
            return await fn(c)

    return asyncio.run(go())


def read_resource_sync(url: str, token: str, cafile: str | None, uri: str, timeout: float = 30.0,
                       **options: Any) -> dict[str, Any]:
    """Blocking :meth:`Client.read_resource` (``options``: its keyword arguments) for scripts."""
    return run_sync(url, token, cafile, lambda c: c.read_resource(uri, **options), timeout)


def call_tool_sync(url: str, token: str, cafile: str | None, name: str, arguments: dict[str, Any],
                   timeout: float = 30.0) -> dict[str, Any]:
    """Blocking :meth:`Client.call_tool` (raises :class:`ToolFailed` on a tool error)."""
    return run_sync(url, token, cafile, lambda c: c.call_tool(name, arguments), timeout)
