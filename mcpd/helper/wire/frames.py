"""Length-prefixed JSON frames between the front, the workers and the root helper (DESIGN.md).

A frame is a 4-byte big-endian unsigned length followed by that many bytes of UTF-8 JSON (one
object). The receiver checks the announced length against its cap *before* reading or allocating
the body, so a peer announcing 1 GB costs nothing (the connection is simply refused).

Caps: the root helper accepts request frames up to :data:`HELPER_REQUEST_CAP` (64 KiB). Replies
carrying file text are bounded by the response cap (SPEC §3, default 10 MiB); JSON escaping can
grow text up to 6x, so :func:`reply_cap` gives the cap for a reply frame.
"""

from __future__ import annotations

import functools
import json
import os
import select
import socket
import struct
from typing import Any

HEADER = struct.Struct("!I")
HELPER_REQUEST_CAP = 64 * 1024
#: bytes asked of the kernel at once by a reader that buffers frames (take_frame): one read takes
#: a whole request or report as a rule; a buffer this size is allocated per read
READ_CHUNK = 65536
#: seconds one send of the root side or the policy process may wait for its peer to read
#: (limit_sends); the peers read at once, so only one that stopped reading meets it
SEND_SECONDS = 10.0


class FrameError(Exception):
    """A malformed frame: over the cap, truncated, not JSON, or not a JSON object."""


def reply_cap(response_cap: int) -> int:
    """The largest reply frame (bytes) that may carry an answer of ``response_cap`` bytes of text."""
    return 6 * response_cap + 1024 * 1024


_codec: dict[str, Any] = {}  # "dumps"/"loads" a process installed with use_codec


def use_codec(dumps: Any, loads: Any) -> None:
    """Encode (``dumps(obj) -> bytes``) and parse (``loads(bytes) -> value``, raising
    :class:`FrameError` like :func:`loads`) this process's frames with a faster JSON codec: the
    front, the policy process and the workers install :mod:`mcpd.common.wirejson`'s (orjson).
    Root never calls it and keeps the standard library's."""
    _codec.update(dumps=dumps, loads=loads)


def encode(obj: dict[str, Any]) -> bytes:
    """Encode one object as a frame (header + compact UTF-8 JSON)."""
    if "dumps" in _codec:
        body = _codec["dumps"](obj)
    else:
        body = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    return HEADER.pack(len(body)) + body


MAX_DEPTH = 64  # JSON nested deeper than this is refused like unparsable JSON (SPEC §2.3)


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


@functools.lru_cache(maxsize=8)
def _decoder(parse_constant: Any, parse_float: Any) -> json.JSONDecoder:
    """One decoder per pair of hooks (``json.loads`` with an argument builds one per call)."""
    return json.JSONDecoder(parse_constant=parse_constant, parse_float=parse_float)


def loads(data: bytes | str, parse_constant: Any = None, parse_float: Any = None) -> Any:
    """Parse JSON as every mcpd process does: :class:`FrameError` for anything unparsable, nested
    deeper than :data:`MAX_DEPTH` levels, or so deep the parser itself gives up.
    ``parse_constant``, ``parse_float``: as for :func:`json.loads` (called for ``NaN``,
    ``Infinity``; for the text of each number with a fraction or an exponent). Bytes are decoded
    as :func:`json.loads` decodes them (UTF-8, -16 or -32, found from the first bytes)."""
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


def decode_body(body: bytes) -> dict[str, Any]:
    """Parse a frame body with :func:`loads`; raise :class:`FrameError` unless it is one JSON object."""
    obj = _codec["loads"](body) if "loads" in _codec else loads(body)
    if not isinstance(obj, dict):
        raise FrameError("frame is not a JSON object")
    return obj


def check_length(length: int, cap: int) -> None:
    """Raise :class:`FrameError` when an announced ``length`` (bytes) exceeds ``cap`` (bytes)."""
    if length > cap:
        raise FrameError(f"frame of {length} bytes exceeds the cap of {cap} bytes")


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(min(n - len(chunks), 1024 * 1024))
        if not chunk:
            if not chunks:
                return None
            raise FrameError("connection closed inside a frame")
        chunks += chunk
    return bytes(chunks)


def limit_sends(sock: socket.socket, seconds: float) -> None:
    """Make every send on the blocking socket ``sock`` wait at most ``seconds`` (``SO_SNDTIMEO``;
    receives are not limited): a send that cannot finish then raises ``OSError`` (``EAGAIN``), part
    of a frame perhaps sent, so the caller ends the connection."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(seconds), int(seconds % 1 * 1e6)))


def ready(fds: list[int], seconds: float) -> set[int]:
    """Those of ``fds`` (open descriptors) that are readable, at their end or in error within
    ``seconds`` (0: now). ``poll``, so any descriptor number works (``select`` stops at 1023)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, events in poller.poll(max(seconds, 0.0) * 1000) if not events & select.POLLNVAL}


def send_frame(sock: socket.socket, obj: dict[str, Any], fds: list[int] | None = None) -> None:
    """Send one frame on a blocking socket; ``fds`` travel with its first byte (SCM_RIGHTS)."""
    data = encode(obj)
    sent = socket.send_fds(sock, [data], fds) if fds else 0
    if sent < len(data):
        sock.sendall(data[sent:])


def recv_frame_fds(sock: socket.socket, cap: int, max_fds: int) -> tuple[dict[str, Any] | None, list[int]]:
    """Receive one frame and the descriptors sent with it (at most ``max_fds``; the caller closes
    them). Returns ``(None, [])`` on a clean end of stream. Raises :class:`FrameError` like
    :func:`recv_frame` (descriptors received before the error are closed)."""
    data, fds, _, _ = socket.recv_fds(sock, HEADER.size, max_fds)
    try:
        if not data:
            return None, fds
        rest = _recv_exactly(sock, HEADER.size - len(data)) if len(data) < HEADER.size else b""
        (length,) = HEADER.unpack(data + (rest or b""))
        check_length(length, cap)
        body = _recv_exactly(sock, length) if length else b""
        if body is None:
            raise FrameError("connection closed inside a frame")
        return decode_body(body), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def recv_frame(sock: socket.socket, cap: int) -> dict[str, Any] | None:
    """Receive one frame from a blocking socket (descriptors sent with it are discarded).

    Returns:
        the object, or ``None`` on a clean end of stream before a header.
    Raises:
        FrameError: over ``cap`` bytes (checked before reading the body), truncated, or not a
            JSON object.
    """
    return recv_frame_fds(sock, cap, 0)[0]
