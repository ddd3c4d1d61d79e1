"""Fast JSON for the large messages of the read path: worker replies and the replies the front
streams to clients (issue 11: a 1 MiB answer spent most of its time in the standard library's
encoder). Both functions use orjson and fall back to :mod:`json` for what orjson refuses, so
every value the standard library handled is still handled; :func:`loads` also falls back for text
whose integers orjson could turn into floats, so an integer is an integer on every process,
whatever its size.

The output is compact UTF-8 JSON, with the same meaning as ``json.dumps(..., separators=(",",
":"))``; it is not byte-for-byte the same (orjson writes non-ASCII characters raw, ``NaN`` and
infinities as ``null``).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import orjson

from mcpd.common.frames import MAX_DEPTH, FrameError, too_deep
from mcpd.common.frames import loads as std_loads

# JSON leaves these raw, but line readers built on str.splitlines (httpx's among them) break lines
# at them. In valid UTF-8 these byte sequences are always exactly these characters.
_LINE_BREAKERS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))


def dumps(obj: Any) -> bytes:
    """``obj`` as compact UTF-8 JSON bytes.

    Args:
        obj: JSON-serialisable data: dicts with string keys, lists, strings, numbers, booleans,
            ``None``.
    Returns:
        valid UTF-8 always: a string holding a lone surrogate (which UTF-8 cannot carry) and an
        integer beyond 64 bits go through :func:`json.dumps` with ``ensure_ascii``, which writes
        them as escapes and plain digits.
    Raises:
        TypeError, ValueError: ``obj`` holds something JSON cannot represent (as :func:`json.dumps`).

    An :class:`Embedded` value is written as the JSON text it holds, as it is.
    """
    try:
        return orjson.dumps(obj, default=_fragment)
    except TypeError:  # orjson.JSONEncodeError: lone surrogate, integer over 64 bits, unknown type
        return _std_dumps(obj)


class Embedded:
    """A value encoded once (:func:`embedded`): :func:`dumps` writes its JSON text ``data`` as it
    is wherever the value sits in a message, so a large result held for many readers is encoded
    once and each reader's message only copies its bytes. ``len()``: the bytes of that text."""

    __slots__ = ("data", "_fragment")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._fragment = orjson.Fragment(data)

    def __len__(self) -> int:
        return len(self.data)


def embedded(value: Any) -> Embedded:
    """``value`` encoded once, as :func:`dumps_line` writes it (so a message around it stays on
    one line). Raises as :func:`dumps`."""
    return Embedded(dumps_line(value))


def _fragment(value: Any) -> Any:
    """orjson's ``default``: an :class:`Embedded` value's text; anything else is refused."""
    if type(value) is Embedded:
        return value._fragment
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


#: what stands for an :class:`Embedded` value in :func:`_std_dumps`'s text before its own text
#: replaces it (random: no string a client sends can be it)
_MARK = "mcpd-embedded-" + secrets.token_hex(16)
_MARK_JSON = b'"' + _MARK.encode("ascii") + b'"'


def _std_dumps(obj: Any) -> bytes:
    """:func:`json.dumps` (``ensure_ascii``) of what orjson refused; each :class:`Embedded` value
    goes in as its text, spliced in place of a mark (never parsed again)."""
    texts: list[bytes] = []

    def mark(value: Any) -> Any:
        if type(value) is Embedded:
            texts.append(value.data)
            return _MARK
        raise TypeError(f"{type(value).__name__} is not JSON serializable")

    out = json.dumps(obj, separators=(",", ":"), default=mark).encode("ascii")
    if not texts:
        return out
    parts = out.split(_MARK_JSON)
    if len(parts) != len(texts) + 1:
        raise ValueError("an embedded value's mark appears in the message")
    spliced = [parts[0]]
    for text, part in zip(texts, parts[1:], strict=True):
        spliced += (text, part)
    return b"".join(spliced)


def embed(data: bytes) -> Any:
    """JSON text ``data`` (from :func:`dumps`) as a value that a later :func:`dumps` writes as it
    is, without parsing or encoding it again (an ``orjson.Fragment``; the caller vouches that it is
    valid JSON)."""
    return orjson.Fragment(data)


def dumps_line(obj: Any) -> bytes:
    """:func:`dumps`, with U+0085, U+2028 and U+2029 escaped, so the message stays on one line
    for every line reader (an SSE ``data:`` line). Raises as :func:`dumps`."""
    data = dumps(obj)
    if data.isascii() or (data.find(b"\xc2") < 0 and data.find(b"\xe2") < 0):  # fast scans: the usual case
        return data
    for raw, escaped in _LINE_BREAKERS:
        data = data.replace(raw, escaped)
    return data


#: every ASCII digit as ``0``, every other byte as a space: digit runs found with one ``find``
_DIGITS = bytes(0x30 if 0x30 <= c <= 0x39 else 0x20 for c in range(256))
#: orjson parses an integer outside ``[-2**63, 2**64)`` as a float (``2**64`` -> ``1.8446744073709552e+19``),
#: and every such integer is written with at least 19 digits
_LONG_DIGITS = b"0" * 19


def maybe_lossy(data: bytes) -> bool:
    """Whether orjson's parse of JSON text ``data`` may hold a float where ``data`` has an integer
    (an integer beyond 64 bits): ``data`` has a run of 19 or more ASCII digits somewhere. False
    positives (a long number in a string, a float with many digits) only cost the slower parser."""
    return len(data) >= len(_LONG_DIGITS) and data.translate(_DIGITS).find(_LONG_DIGITS) >= 0


def loads(data: bytes) -> Any:
    """Parse JSON received from another mcpd process (a request or reply frame), with the one
    number rule of every mcpd process: an integer is an ``int`` of any size, as
    :func:`json.loads` has it (2**64 and 10**400 included), a number with a fraction or an
    exponent a ``float``. orjson parses the usual text; text it could turn an integer into a float
    for (:func:`maybe_lossy`) and text it refuses go to :func:`mcpd.common.frames.loads`.

    Raises:
        FrameError: not JSON, or nested deeper than :data:`mcpd.common.frames.MAX_DEPTH` levels,
            as :func:`mcpd.common.frames.loads`, which also parses what orjson refuses (``1e400``,
            ``NaN``, text that is not valid UTF-8 such as a lone surrogate).
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return std_loads(data)
    if maybe_lossy(data):
        return std_loads(data)
    if too_deep(value, text=data):
        raise FrameError(f"JSON nested deeper than {MAX_DEPTH} levels")
    return value
