"""The stateless era's checks (protocol version 2026-07-28) of a ``POST /mcp``: the headers
that mirror the body (``MCP-Protocol-Version``, ``Mcp-Method``, ``Mcp-Name``) held against it
before the request runs, and the one-value rule of every ``/mcp`` header. Each refusal is
:class:`HeaderRefused`, answered by ``streamable.py`` as a JSON-RPC error.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from mcpd.front.mcp.jsonrpc import INVALID_PARAMS, Message
from mcpd.front.mcp.versions import (
    HEADER_MISMATCH,
    META_CLIENT_CAPABILITIES,
    META_VERSION,
    MODERN_VERSIONS,
    SUPPORTED_VERSIONS,
    UNSUPPORTED_VERSION,
)

VERSION_HEADER = "MCP-Protocol-Version"
METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"
# Methods whose Mcp-Name header mirrors a body field (2026-07-28 Streamable HTTP, "Request Metadata").
NAME_FIELDS = {"tools/call": "name", "resources/read": "uri", "prompts/get": "name",
               # (the tasks extension: routed by the task's id)
               "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}
_B64_PREFIX, _B64_SUFFIX = "=?base64?", "?="


class HeaderRefused(Exception):
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
        HeaderRefused: ``400``/``code`` when the header is sent more than once (a proxy reading another
            copy than this server would see another session, version, method or name).
    """
    values = headers.getlist(name)
    if len(values) > 1:
        raise HeaderRefused(400, code, f"{name} header given more than once")
    return values[0] if values else None


def _header_value(raw: str, name: str) -> str:
    """A mirrored header's value: visible ASCII, space and tab only; ``=?base64?…?=`` decoded
    (UTF-8) for ``Mcp-Name``. Raises :class:`HeaderRefused` (``-32020``) when malformed."""
    if any(not (0x20 <= ord(c) <= 0x7E or c == "\t") for c in raw):
        raise HeaderRefused(400, HEADER_MISMATCH, f"{name} header holds invalid characters")
    if name == NAME_HEADER and raw.startswith(_B64_PREFIX) and raw.endswith(_B64_SUFFIX) \
            and len(raw) >= len(_B64_PREFIX) + len(_B64_SUFFIX):
        try:
            return base64.b64decode(raw[len(_B64_PREFIX):-len(_B64_SUFFIX)], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise HeaderRefused(400, HEADER_MISMATCH, f"{name} header: bad base64 value") from None
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
        HeaderRefused: ``400``/``-32602`` for missing ``_meta`` fields; ``400``/``-32020`` for a
            missing, repeated, malformed or mismatched ``MCP-Protocol-Version``, ``Mcp-Method``
            or ``Mcp-Name``; ``400``/``-32022`` for a version not served (``data`` lists them).
    """
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get(META_VERSION), str) \
            or not isinstance(meta.get(META_CLIENT_CAPABILITIES), dict):
        raise HeaderRefused(400, INVALID_PARAMS, f"_meta must carry {META_VERSION} and {META_CLIENT_CAPABILITIES}")
    version = meta[META_VERSION]
    header_version = one_header(headers, VERSION_HEADER, HEADER_MISMATCH)
    if header_version is None:
        raise HeaderRefused(400, HEADER_MISMATCH, f"{VERSION_HEADER} header required")
    if header_version != version:
        raise HeaderRefused(400, HEADER_MISMATCH, f"{VERSION_HEADER} header does not match _meta")
    if version not in MODERN_VERSIONS:
        supported = [*reversed(MODERN_VERSIONS), *reversed(SUPPORTED_VERSIONS)]
        raise HeaderRefused(400, UNSUPPORTED_VERSION, "Unsupported protocol version",
                      {"supported": supported, "requested": version})
    method = one_header(headers, METHOD_HEADER, HEADER_MISMATCH)
    if method is None:
        raise HeaderRefused(400, HEADER_MISMATCH, f"{METHOD_HEADER} header required")
    if _header_value(method, METHOD_HEADER) != msg.get("method"):
        raise HeaderRefused(400, HEADER_MISMATCH, f"{METHOD_HEADER} header does not match the method")
    field = NAME_FIELDS.get(str(msg.get("method")))
    if field is not None:
        name = one_header(headers, NAME_HEADER, HEADER_MISMATCH)
        if name is None:
            raise HeaderRefused(400, HEADER_MISMATCH, f"{NAME_HEADER} header required")
        if _header_value(name, NAME_HEADER) != (params.get(field) if isinstance(params, dict) else None):
            raise HeaderRefused(400, HEADER_MISMATCH, f"{NAME_HEADER} header does not match params.{field}")
