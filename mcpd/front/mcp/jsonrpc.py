"""The JSON-RPC 2.0 envelope (docs/REFERENCE.md §2.3): error codes, error replies, which ids are
valid and how a body's numbers are parsed so that a reply carries its request's id exactly.

Holds no session state and knows no MCP method: :mod:`mcpd.front.mcp.session` applies these
rules to each message of a body.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from mcpd.common.wirejson import Embedded

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL = -32603
SERVER_BUSY = -32000  # implementation-defined server error: a per-session bound was reached

Message = dict[str, Any]
Send = Callable[[Any], None]


class RpcError(Exception):
    """A JSON-RPC error answer: ``code`` (-32xxx), ``message``, optional ``data``."""

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


def valid_id(value: Any) -> bool:
    """A JSON-RPC id: a string that is valid Unicode, an integer (any size), or a finite number
    that its reply can carry exactly; otherwise the request is answered ``-32600`` with
    ``id: null``. ``1e400`` parses as infinity, which no reply could carry as JSON; a number
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
    if type(value) is Embedded:  # (encoded once already: exactly its bytes)
        return len(value)
    return 8


def id_key(value: Any) -> tuple[str, Any]:
    """The key of a valid id in a table of requests in flight: the string ``"1"`` and the number
    ``1`` are different ids."""
    return ("s", value) if isinstance(value, str) else ("n", value)


def params_of(msg: Message) -> dict[str, Any]:
    """A request's ``params``: ``{}`` when absent.

    Raises:
        RpcError: ``-32602`` when present and not an object (``null`` included: JSON-RPC 2.0
            wants a structured value, and every method served takes named parameters).
    """
    params = msg.get("params", {})
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "params must be an object")
    return params


def answered(msg: Any) -> bool:
    """Whether handling ``msg`` (one message of a body) sends a reply: anything but a well-formed
    notification or a client's response."""
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        return True
    if "method" not in msg:
        return not ("id" in msg and ("result" in msg or "error" in msg))
    return not isinstance(msg["method"], str) or "id" in msg
