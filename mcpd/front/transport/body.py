"""Reading a JSON-RPC request body without ever buffering past a cap (docs/REFERENCE.md §1.3: 413, never
buffered), shared by ``POST /message`` and ``POST /mcp``, and the one rendering of a refusal whose
body is a JSON-RPC error (:func:`rpc_refusal`)."""

from __future__ import annotations

import functools
import json
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from mcpd.common import frames, printable, wirejson
from mcpd.common.validate import digits
from mcpd.front import metrics
from mcpd.front.mcp.jsonrpc import INVALID_REQUEST, PARSE_ERROR, error_reply, json_float


class _WireJsonResponse(JSONResponse):
    """A JSON-RPC message as ``application/json``, encoded once with
    :func:`mcpd.common.wirejson.dumps` (a 1 MiB text is not escaped by the standard library's
    encoder)."""

    def render(self, content: Any) -> bytes:
        """The body: compact UTF-8 JSON of ``content``."""
        return wirejson.dumps(content)


def rpc_refusal(status: int, code: int, message: str, rid: Any = None, data: Any = None,
                headers: dict[str, str] | None = None) -> Response:
    """An HTTP refusal (``status``, 400 or more) whose body is the JSON-RPC error ``code`` with
    ``message`` (and ``data`` when not ``None``) for request id ``rid``: ``None`` (``id: null``)
    when no request id could be read (a body never read, a batch, a notification, an invalid id,
    a client response). ``headers``: extra response headers. Every JSON-RPC refusal of the
    transports is rendered here."""
    return _WireJsonResponse(error_reply(rid, code, message, data), status_code=status, headers=headers)


class BodyRefused(Exception):
    """The body was not read, or is no JSON-RPC body: ``status`` is 415 (not JSON), 413 (over the
    cap) or 400 (bad ``Content-Length``, the client went away, unparsable); ``reason`` is a short
    text for the response; ``rpc_code`` the JSON-RPC code of a body that was read but is not
    JSON-RPC (``-32700``, ``-32600``), else ``None``."""

    def __init__(self, status: int, reason: str, rpc_code: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.rpc_code = rpc_code

    def response(self, always_rpc: bool = False) -> Response:
        """The HTTP answer: a JSON-RPC error body with ``id: null`` (:func:`rpc_refusal`; code
        ``rpc_code``, else ``-32600``) when ``rpc_code`` is set or ``always_rpc`` (``/mcp``, where
        every refusal is a JSON-RPC error), else the reason as text (``/message``)."""
        if self.rpc_code is not None or always_rpc:
            return rpc_refusal(self.status, INVALID_REQUEST if self.rpc_code is None else self.rpc_code, self.reason)
        return PlainTextResponse(self.reason, status_code=self.status)


async def read_capped(request: Request, cap: int) -> bytes:
    """The request body, at most ``cap`` bytes.

    A declared ``Content-Length`` over ``cap`` is refused before reading anything; otherwise the
    stream is read chunk by chunk and abandoned as soon as it passes ``cap``.

    Raises:
        BodyRefused: 413 over the cap; 400 for a malformed ``Content-Length`` or a disconnect.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        length = digits(declared)
        if length is None:
            raise BodyRefused(400, "bad content-length")
        if length > cap:
            metrics.limit_hit("body_bytes")
            raise BodyRefused(413, "body too large")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                metrics.limit_hit("body_bytes")
                raise BodyRefused(413, "body too large")
            chunks.append(chunk)
    except ClientDisconnect:
        raise BodyRefused(400, "client disconnected") from None
    return b"".join(chunks)


def media_type(value: str | None) -> str:
    """The bare, lower-case media type of a ``Content-Type`` value (parameters dropped)."""
    return (value or "").split(";", 1)[0].strip().lower()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _DuplicateKey(ValueError):
    """An object of the body names one key twice (raised by :func:`_unique_members`)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The ``object_pairs_hook`` of the slow parse: the object, or :class:`_DuplicateKey`."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def _members(value: Any) -> int:
    """How many members the objects of parsed JSON ``value`` hold, all depths together (level by
    level, as :func:`mcpd.common.frames.too_deep` walks)."""
    count = 0
    level = [value] if type(value) is dict or type(value) is list else []
    while level:
        count += sum(len(item) for item in level if type(item) is dict)
        level = [child for item in level for child in (item.values() if type(item) is dict else item)
                 if type(child) is dict or type(child) is list]
    return count


def duplicate_key(body: bytes, value: Any) -> str | None:
    """A key that some object of JSON text ``body`` (parsed as ``value``) names twice, else ``None``.

    Every member of an object in the text has one ``:`` outside strings, so when the parsed objects
    hold as many members as the text has colons no member was lost to a later one of the same
    name: the usual body is answered with one count in C and a walk of its few objects. Only a
    body whose strings hold colons too (a ``file://`` URI) or that has a duplicate is parsed again,
    keeping every member, to find out."""
    if _members(value) == body.count(b":"):
        return None
    try:
        _decoder_pairs().decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except _DuplicateKey as dup:
        return dup.key
    return None


@functools.lru_cache(maxsize=1)
def _decoder_pairs() -> json.JSONDecoder:
    return json.JSONDecoder(parse_constant=_reject_constant, parse_float=json_float,
                            object_pairs_hook=_unique_members)


def parse_json(body: bytes) -> Any:
    """Parse a JSON-RPC body: an object or an array (docs/REFERENCE.md §1.3, §2.3). A number with a fraction
    or an exponent whose float is not exactly that number is an
    :class:`~mcpd.front.mcp.jsonrpc.InexactNumber` (:func:`~mcpd.front.mcp.jsonrpc.json_float`), which
    is no valid id.

    Raises:
        BodyRefused: 400 with ``-32700`` for bytes that are not JSON (``NaN``/``Infinity`` included)
            or JSON nested deeper than 64 levels, 400 with ``-32600`` for JSON that is neither an
            object nor an array, or where an object names a key twice, at any depth
            (:func:`duplicate_key`; the later one would otherwise win).
    """
    try:
        payload = frames.loads(body, parse_constant=_reject_constant, parse_float=json_float)
    except (ValueError, frames.FrameError):
        raise BodyRefused(400, "parse error", PARSE_ERROR) from None
    if not isinstance(payload, (dict, list)):
        raise BodyRefused(400, "invalid request", INVALID_REQUEST)
    key = duplicate_key(body, payload)
    if key is not None:
        raise BodyRefused(400, f"invalid request: an object has the key {printable.field(key, 64)} twice",
                          INVALID_REQUEST)
    return payload


async def read_json(request: Request, cap: int) -> Any:
    """Check the content type, read at most ``cap`` bytes and parse them (:func:`parse_json`).

    Raises:
        BodyRefused: 415 unless ``Content-Type`` is ``application/json``; then as
            :func:`read_capped` and :func:`parse_json`.
    """
    if media_type(request.headers.get("content-type")) != "application/json":
        raise BodyRefused(415, "content type must be application/json")
    return parse_json(await read_capped(request, cap))
