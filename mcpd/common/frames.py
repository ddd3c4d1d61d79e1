"""Frames as the unprivileged processes use them: the wire format, and what root never needs.

Everything of :mod:`mcpd.helper.wire.frames` (the format, blocking sends and receives) is
re-exported here, so a front, policy or worker module imports one ``frames``. Added: reading
frames through a buffer (:func:`take_frame`, :data:`READ_CHUNK`), the cap of a reply that carries
file text (:func:`reply_cap`), a blocking receive that drops descriptors (:func:`recv_frame`),
what a peer has not read yet (:func:`queued_bytes`),
the error a refusal carries (:func:`reply_error`) and :func:`loads`, the one JSON rule (at most
:data:`MAX_DEPTH` levels; number hooks for the front's parsing of a client's JSON), which
importing this module makes the parser of this process's frames.
"""

from __future__ import annotations

import fcntl
import functools
import json
import socket
import struct
import termios
from typing import Any

from mcpd.helper.wire.errors import CODES, INTERNAL_ERROR, ToolError
from mcpd.helper.wire.frames import (  # noqa: F401 - the one wire format, re-exported
    HEADER,
    HELPER_REQUEST_CAP,
    SEND_SECONDS,
    FrameError,
    check_length,
    decode_body,
    encode,
    limit_sends,
    ready,
    recv_frame_fds,
    send_frame,
)
from mcpd.helper.wire.frames import codec as _codec

MAX_DEPTH = 64  # JSON nested deeper than this is refused like unparsable JSON (docs/REFERENCE.md §2.3)


def use_codec(dumps: Any, loads: Any) -> None:
    """Encode (``dumps(obj) -> bytes``) and parse (``loads(bytes) -> value``, raising
    :class:`FrameError` like :func:`loads`) this process's frames with a faster JSON codec: the
    front, the policy process and the workers install :mod:`mcpd.common.wirejson`'s (orjson).
    Root never calls it and keeps the standard library's."""
    _codec.update(dumps=dumps, loads=loads)


def queued_bytes(fd: int) -> int:
    """Bytes written on the socket ``fd`` that its peer has not taken yet: unsent, or (TCP)
    unacknowledged (``SIOCOUTQ``, one system call). Raises ``OSError`` (a closed descriptor)."""
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0" * 4))[0])


def reply_error(data: Any) -> ToolError:
    """The :class:`~mcpd.helper.wire.errors.ToolError` a refusal's ``error`` carries (the shape of
    ``ToolError.to_dict``); anything malformed becomes ``INTERNAL_ERROR``."""
    if not isinstance(data, dict):
        return ToolError(INTERNAL_ERROR, "internal error")
    code, message, details = data.get("code"), data.get("message"), data.get("details")
    if code not in CODES or not isinstance(message, str) or not isinstance(details, dict):
        return ToolError(INTERNAL_ERROR, "internal error")
    return ToolError(str(code), message, **details)


#: bytes asked of the kernel at once by a reader that buffers frames (take_frame): one read takes
#: a whole request or report as a rule; a buffer this size is allocated per read
READ_CHUNK = 65536


def reply_cap(response_cap: int) -> int:
    """The largest reply frame (bytes) that may carry an answer of ``response_cap`` bytes of text:
    JSON escaping can grow text up to 6 times, plus 1 MiB for the rest of the reply."""
    return 6 * response_cap + 1024 * 1024


@functools.lru_cache(maxsize=8)
def _decoder(parse_constant: Any, parse_float: Any) -> json.JSONDecoder:
    """One decoder per pair of hooks (``json.loads`` with an argument builds one per call)."""
    return json.JSONDecoder(parse_constant=parse_constant, parse_float=parse_float)


def too_deep(value: Any, limit: int = MAX_DEPTH, text: bytes | str | None = None) -> bool:
    """Whether ``value`` (parsed JSON: the plain ``dict`` and ``list`` the parsers build) nests
    arrays and objects more than ``limit`` levels deep (a bare object or array is one level).
    Iterative, so any depth is safe to check. ``text``: the JSON ``value`` was parsed from, when at
    hand: text with at most ``limit`` opening brackets cannot nest deeper, and is answered without
    the walk (the usual case, counted in C)."""
    if text is not None:
        opening = (b"[", b"{") if isinstance(text, bytes) else ("[", "{")
        if text.count(opening[0]) + text.count(opening[1]) <= limit:  # type: ignore[arg-type]
            return False
    # level by level, each in one comprehension (a 4 MiB batch of 466,000 members is walked in a
    # fraction of a second, where a stack of (item, depth) pairs took 1.2 s of the event loop):
    # after ``limit`` steps, ``level`` holds the containers nested ``limit + 1`` deep
    level = [value] if type(value) is dict or type(value) is list else []
    for _ in range(limit):
        level = [child for item in level for child in (item.values() if type(item) is dict else item)
                 if type(child) is dict or type(child) is list]
    return bool(level)


def loads(data: bytes | str, parse_constant: Any = None, parse_float: Any = None) -> Any:
    """Parse JSON as every mcpd process but root does (the one JSON rule): :class:`FrameError`
    for anything unparsable, nested deeper than :data:`MAX_DEPTH` levels, or so deep the parser
    itself gives up. Bytes are decoded as :func:`json.loads` decodes them (UTF-8, -16 or -32,
    found from the first bytes). ``parse_constant`` and ``parse_float`` as for :func:`json.loads`
    (called for ``NaN``, ``Infinity``; for the text of each number with a fraction or an
    exponent)."""
    try:
        if parse_constant is None and parse_float is None:
            value = json.loads(data)
        else:
            text = data.decode(json.detect_encoding(data), "surrogatepass") if isinstance(data, bytes) else data
            value = _decoder(parse_constant, parse_float).decode(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise FrameError("not JSON" if not isinstance(exc, RecursionError) else "JSON nested too deeply") from None
    if too_deep(value, text=data):
        raise FrameError(f"JSON nested deeper than {MAX_DEPTH} levels")
    return value


#: the parser of this process's frames (root's has no depth rule) until :func:`use_codec` installs a faster one
_codec["loads"] = loads


def take_frame(buf: bytearray, cap: int) -> bytes | None:
    """Remove the first complete frame from ``buf`` (bytes received so far) and return its body;
    None while it is incomplete. Raises :class:`FrameError` as soon as the announced length
    exceeds ``cap`` (bytes), before the body is waited for."""
    if len(buf) < HEADER.size:
        return None
    (length,) = HEADER.unpack_from(buf)
    check_length(length, cap)
    end = HEADER.size + length
    if len(buf) < end:
        return None
    body = bytes(buf[HEADER.size:end])
    del buf[:end]
    return body


def recv_frame(sock: socket.socket, cap: int) -> dict[str, Any] | None:
    """Receive one frame from a blocking socket (descriptors sent with it are discarded).

    Returns:
        the object, or ``None`` on a clean end of stream before a header.
    Raises:
        FrameError: over ``cap`` bytes (checked before reading the body), truncated, or not a
            JSON object.
    """
    return recv_frame_fds(sock, cap, 0)[0]
