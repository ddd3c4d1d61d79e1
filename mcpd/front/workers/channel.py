"""The front's end of one worker's socket and the frames on it (docs/PRIVSEP.md, workers).

A worker is a long-lived process that runs ops (``mcpd.core.ops.run``) for one OS account, one
request at a time, over its end of a ``socketpair`` with length-prefixed frames
(``mcpd.helper.wire.frames``). It holds nothing of the front's: no TLS key, no tokens. Here: the
socket's protocol (:class:`WorkerChannel`), the request frame (:func:`encode_args`,
:func:`request_frame`), and the reply, its progress frames and its checks (:func:`read_reply`).

Which worker serves which call, and when one is started or ended, is the pool's
(:mod:`mcpd.front.workers.pool`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from mcpd.common import frames, wirejson
from mcpd.helper.wire.errors import invalid_argument

log = logging.getLogger(__name__)

REQUEST_CAP = frames.HELPER_REQUEST_CAP  # bytes: a request frame to a worker is at most 64 KiB
STREAM_LIMIT = 1024 * 1024  # bytes a worker connection buffers unasked before its reading pauses

#: ``on_progress(done, total | None, message)``, awaited per interim frame of a call.
ProgressCallback = Callable[[int, "int | None", str], Awaitable[None]]


class Crashed(Exception):
    """The worker closed its socket or broke the frame protocol."""


class WorkerChannel(asyncio.Protocol):
    """The front's end of one worker's socket: frames taken from what arrives, as it arrives (one
    buffer, no stream reader and no coroutine per read: a call's reply is usually in the buffer
    whole, both its frames, by the time it is asked for).

    Reading pauses while more than :data:`STREAM_LIMIT` bytes wait and nobody asks for a frame (a
    worker sending what was not asked for fills no memory), and while :meth:`hold` is on.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self.hung_up = False  # the worker closed its end (it exited, or was killed): set by eof_received only
        self._held = False
        self._paused = False
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # done once the socket is

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._waiter is not None:
            self._wake()
        elif len(self._buf) > STREAM_LIMIT:
            self._steer()

    def eof_received(self) -> bool:
        self._eof = self.hung_up = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._wake()
        if not self.closed.done():
            self.closed.set_result(None)

    # the pool's side

    @property
    def ended(self) -> bool:
        """The worker's end is closed (or ours is closing): no reply can come."""
        return self._eof or self.transport is None or self.transport.is_closing()

    def write(self, data: bytes) -> None:
        """Send ``data`` (a request frame, at most 64 KiB: one call at a time, so the transport's
        buffer never holds more than one)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def hold(self, on: bool) -> None:
        """Stop (``True``) or go on (``False``) reading: what arrives meanwhile wakes nobody."""
        self._held = on
        self._steer()

    async def body(self, cap: int) -> bytes | None:
        """The next frame's body (its announced length checked against ``cap`` bytes as soon as
        its header is in); ``None`` at a clean end of stream between frames.

        Raises:
            mcpd.helper.wire.frames.FrameError: a frame over ``cap``, or the stream ended inside one.
        """
        while (found := frames.take_frame(self._buf, cap)) is None:
            if self._eof:
                if self._buf:
                    raise frames.FrameError("connection closed inside a frame")
                return None
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            self._steer()
            try:
                await waiter
            finally:
                self._waiter = None
        if self._paused:
            self._steer()
        return found

    def close(self) -> None:
        """Close our end (idempotent); :attr:`closed` is done once the socket is."""
        if self.transport is not None:
            self.transport.close()
        elif not self.closed.done():
            self.closed.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _steer(self) -> None:
        """Pause or resume reading as :meth:`hold` and the buffer's size say."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        pause = self._held or (self._waiter is None and len(self._buf) > STREAM_LIMIT)
        if pause != self._paused:
            self._paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()


async def read_reply_frame(channel: WorkerChannel, cap: int) -> dict[str, Any] | None:
    """One reply (or progress) frame from a worker: :func:`mcpd.common.frames.recv_frame`'s format,
    parsed with :func:`mcpd.common.wirejson.loads`. A reply marked ``"text_frame": true`` (see
    ``mcpd.worker.main.send_reply``) is followed by a frame of raw UTF-8 that becomes its
    ``result["text"]``.

    Returns ``None`` on a clean end of stream. Raises :class:`mcpd.helper.wire.frames.FrameError` for a
    frame over ``cap`` bytes, one cut short, a body that is not one JSON object, or a text frame
    that is missing, not UTF-8, or follows a reply without a result object.
    """
    body = await channel.body(cap)
    if body is None:
        return None
    obj = wirejson.loads(body)
    if not isinstance(obj, dict):
        raise frames.FrameError("frame is not a JSON object")
    if obj.pop("text_frame", None) is True:
        result = obj.get("result")
        raw = await channel.body(cap)
        if raw is None or not isinstance(result, dict):
            raise frames.FrameError("a text frame is missing or has no result to belong to")
        try:
            result["text"] = raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise frames.FrameError("a text frame is not UTF-8") from None
    return obj


def encode_args(op: str, args: dict[str, Any]) -> bytes:
    """``args`` as JSON, encoded once for every frame of the call.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` when they are not JSON-serialisable or the request frame
            would pass :data:`REQUEST_CAP`.
    """
    try:
        data = wirejson.dumps(args)
    except (TypeError, ValueError) as exc:
        raise invalid_argument("arguments are not JSON-serialisable") from exc
    # the frame adds {"id":N,"op":"...","args":...,"progress":true}: 64 bytes are room for it
    if len(data) + len(op.encode("utf-8", "surrogatepass")) + 64 > REQUEST_CAP:
        raise invalid_argument(f"request over {REQUEST_CAP} bytes", limit=REQUEST_CAP)
    return data


def request_frame(rid: int, op: str, args: bytes, progress: bool = False) -> bytes:
    """One request frame: ``{"id", "op", "args"[, "progress": true]}`` with ``args`` the JSON
    of :func:`encode_args`, embedded as it is."""
    request: dict[str, Any] = {"id": rid, "op": op, "args": wirejson.embed(args)}
    if progress:
        request["progress"] = True
    body = wirejson.dumps(request)
    return frames.HEADER.pack(len(body)) + body


async def read_reply(channel: WorkerChannel, rid: int, cap: int, on_progress: ProgressCallback | None) -> dict[str, Any]:
    """The reply to request ``rid``: its progress frames handed to ``on_progress`` on the way,
    then the reply checked (``id`` is ``rid``, ``ok`` a bool, a success's ``result`` an object).

    Raises:
        Crashed: the stream ended, a progress frame came unasked or malformed, or the reply is malformed.
        mcpd.helper.wire.frames.FrameError: a broken frame (:func:`read_reply_frame`).
    """
    while True:
        reply = await read_reply_frame(channel, cap)
        if reply is None or "progress" not in reply or "ok" in reply:
            break
        await _forward_progress(rid, reply, on_progress)
    if reply is None:
        raise Crashed("end of stream")
    ok = reply.get("ok")
    if reply.get("id") != rid or not isinstance(ok, bool):
        raise Crashed("malformed reply")
    if ok and not isinstance(reply.get("result"), dict):
        raise Crashed("malformed result")
    return reply


async def _forward_progress(rid: int, frame: dict[str, Any], on_progress: ProgressCallback | None) -> None:
    """Check one interim frame and hand it to ``on_progress``; a malformed one is a protocol break."""
    p = frame.get("progress")
    if on_progress is None or frame.get("id") != rid or not isinstance(p, dict):
        raise Crashed("unexpected progress frame")
    done, total, message = p.get("done"), p.get("total"), p.get("message")
    if not isinstance(done, int) or not (total is None or isinstance(total, int)) or not isinstance(message, str):
        raise Crashed("malformed progress frame")
    try:
        await on_progress(done, total, message)
    except Exception:
        log.exception("progress callback failed")


def reply_result(reply: dict[str, Any]) -> dict[str, Any]:
    """The result of a checked reply (:func:`read_reply`).

    Raises:
        ToolError: the worker's own error.
    """
    if reply["ok"] is True:
        result: dict[str, Any] = reply["result"]
        return result
    raise frames.reply_error(reply.get("error"))
