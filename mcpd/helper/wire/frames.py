"""Length-prefixed JSON frames between the front, the policy process, the workers and root.

A frame is a 4-byte big-endian unsigned length followed by that many bytes of UTF-8 JSON (one
object). The receiver checks the announced length against its cap *before* reading or allocating
the body, so a peer announcing 1 GB costs nothing (the connection is simply refused). Root
accepts request frames up to :data:`HELPER_REQUEST_CAP` (64 KiB).

This module holds what root uses: the format, blocking sends and receives with descriptors. What
only the other processes use (buffered reading, reply caps, the JSON depth rule and number hooks,
a faster JSON codec) is in :mod:`mcpd.common.frames`, which re-exports all of this.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
from typing import Any

HEADER = struct.Struct("!I")
HELPER_REQUEST_CAP = 64 * 1024
#: seconds one send of the root side or the policy process may wait for its peer to read
#: (limit_sends); the peers read at once, so only one that stopped reading meets it
SEND_SECONDS = 10.0


class FrameError(Exception):
    """A malformed frame: over the cap, truncated, not JSON, or not a JSON object."""


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")


def _loads(body: bytes) -> Any:
    """:func:`json.loads` alone, as root parses: its requests hold no nested value (its schema
    check refuses any), so the depth rule of the other processes (:func:`mcpd.common.frames.loads`)
    is not needed there. :class:`FrameError` for what is not JSON, or nested too deeply for the
    parser."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise FrameError("not JSON") from None


#: this process's JSON codec for frames, ``"dumps"`` (an object to compact UTF-8 bytes) and
#: ``"loads"`` (bytes to a value, or :class:`FrameError`): root's is the standard library's;
#: importing :mod:`mcpd.common.frames` (every other process) makes its ``loads``, with the depth
#: rule, the parser, and the front, the policy process and the workers install orjson's
#: (:func:`mcpd.common.frames.use_codec`)
codec: dict[str, Any] = {"dumps": _dumps, "loads": _loads}


def encode(obj: dict[str, Any]) -> bytes:
    """Encode one object as a frame (header + compact UTF-8 JSON, with :data:`codec`)."""
    body = codec["dumps"](obj)
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    """Parse a frame body with :data:`codec`; raise :class:`FrameError` unless it is one JSON object."""
    obj = codec["loads"](body)
    if not isinstance(obj, dict):
        raise FrameError("frame is not a JSON object")
    return obj


def check_length(length: int, cap: int) -> None:
    """Raise :class:`FrameError` when an announced ``length`` (bytes) exceeds ``cap`` (bytes)."""
    if length > cap:
        raise FrameError(f"frame of {length} bytes exceeds the cap of {cap} bytes")


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    """The rest of a frame begun: ``n`` bytes; :class:`FrameError` when the stream ends first."""
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(min(n - len(chunks), 1024 * 1024))
        if not chunk:
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
    them). Returns ``(None, [])`` on a clean end of stream. Raises :class:`FrameError`
    (descriptors received before the error are closed): over ``cap`` bytes (checked before the
    body is read), truncated, or not a JSON object."""
    data, fds, _, _ = socket.recv_fds(sock, HEADER.size, max_fds)
    try:
        if not data:
            return None, fds
        (length,) = HEADER.unpack(data + _recv_exactly(sock, HEADER.size - len(data)))
        check_length(length, cap)
        return decode_body(_recv_exactly(sock, length)), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
