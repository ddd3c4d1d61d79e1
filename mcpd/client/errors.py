"""The MCP client's errors: one family whose ``exit_code`` is ``linuxctl``'s exit status.

:class:`ToolFailed` 1, :class:`RPCError` 1, :class:`ProtocolError` 1 (a refusal by HTTP status is its
subclass :class:`mcpd.client.refusal.HTTPRefused`), :class:`UsageError` 2,
:class:`AuthError` 3, :class:`ConnectError` 4 (refused, DNS, TLS verification, lost stream, no
answer in time), as docs/REFERENCE.md §6 lists them. Building one from a tool result is
:func:`mcpd.client.api.tool_failure`; from an httpx failure, :func:`mcpd.client.endpoints.transport_error`.
"""

from __future__ import annotations

from typing import Any


class MCPClientError(Exception):
    """Base of the client's errors; ``code`` is a short stable word, ``exit_code`` the ``linuxctl``
    exit status (docs/REFERENCE.md §6)."""

    exit_code = 1
    default_code = "CLIENT_ERROR"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code


class ToolFailed(MCPClientError):
    """A tool result with ``isError: true`` (docs/REFERENCE.md §2.5); ``code`` is its error code, exit 1.

    Attributes:
        details: the ``structuredContent.error.details`` mapping (empty if absent).
        result: the whole ``CallToolResult``.
    """

    exit_code = 1
    default_code = "TOOL_ERROR"

    def __init__(self, code: str, message: str, details: dict[str, Any], result: dict[str, Any]) -> None:
        super().__init__(message, code)
        self.details = details
        self.result = result


class RPCError(MCPClientError):
    """A JSON-RPC error response (docs/REFERENCE.md §2.3), exit 1; ``rpc_code`` is the integer
    code, ``data`` its data."""

    exit_code = 1
    default_code = "RPC_ERROR"

    def __init__(self, rpc_code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} ({rpc_code})")
        self.rpc_code = rpc_code
        self.data = data


class ResourceFailed(ToolFailed):
    """A ``resources/read`` JSON-RPC error carrying a tool error code (docs/REFERENCE.md §2.5) in
    ``data.code`` (exit 1); ``rpc_code`` is the JSON-RPC code (``-32002`` for ``FILE_NOT_FOUND``)."""

    def __init__(self, rpc_code: int, code: str, message: str, details: dict[str, Any]) -> None:
        super().__init__(code, message, details, {})
        self.rpc_code = rpc_code


class ProtocolError(MCPClientError):
    """The server answered something this client cannot use (unexpected status or message), exit 1."""

    default_code = "PROTOCOL_ERROR"


class UsageError(MCPClientError):
    """The caller's input is unusable (missing URL or token, malformed argument), exit 2."""

    exit_code = 2
    default_code = "USAGE_ERROR"


class AuthError(MCPClientError):
    """The server answered ``401``: no, wrong or expired token (docs/REFERENCE.md §1.3), exit 3."""

    exit_code = 3
    default_code = "AUTH_FAILED"


class ConnectError(MCPClientError):
    """The server cannot be reached, its certificate is not trusted, or it stopped answering, exit 4."""

    exit_code = 4
    default_code = "CONNECT_FAILED"
