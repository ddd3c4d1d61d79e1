"""Worker reply frames (issue 11): a result's text travels as a second frame of raw UTF-8; the
front takes it back exactly, and refuses a reply whose text frame is missing, too large or not
UTF-8. The worker's own sender (``send_reply``) writes the frames; the pool's reader reads them."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from mcpd.common import frames
from mcpd.front.pool import read_reply_frame
from mcpd.worker.main import send_reply


def read_back(data: bytes, cap: int = 1 << 20) -> dict | None:
    async def go() -> dict | None:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await read_reply_frame(reader, cap)

    return asyncio.run(go())


def sent(reply: dict) -> bytes:
    """What ``send_reply`` writes, read on the other end by a thread (a large text exceeds the
    socket buffer)."""
    a, b = socket.socketpair()
    out = bytearray()

    def drain() -> None:
        while chunk := b.recv(1 << 16):
            out.extend(chunk)

    with a, b:
        reader = threading.Thread(target=drain)
        reader.start()
        send_reply(a, reply)
        a.shutdown(socket.SHUT_WR)
        reader.join(timeout=10)
    return bytes(out)


@pytest.mark.parametrize("text", ["", "plain\n", "caf\u00e9 \u2028 \U0001f600\r\n\x00", "lone \udc80 surrogate", "x" * 300_000])
def test_text_comes_back_exactly(text: str) -> None:
    reply = {"id": 7, "ok": True, "result": {"text": text, "metadata": {"lines": 1}}}
    data = sent(reply)
    assert frames.HEADER.unpack(data[:4])[0] < 200  # the text is not in the JSON frame
    assert read_back(data) == reply


def test_replies_without_text_are_one_frame() -> None:
    for reply in ({"id": 1, "ok": False, "error": {"code": "FILE_NOT_FOUND", "message": "no"}},
                  {"id": 2, "ok": True, "result": {"entries": [{"name": "a"}]}}):
        data = sent(reply)
        assert frames.HEADER.unpack(data[:4])[0] == len(data) - 4
        assert read_back(data) == reply


def frame(body: bytes) -> bytes:
    return frames.HEADER.pack(len(body)) + body


@pytest.mark.parametrize("data", [
    frame(b'{"id":1,"ok":true,"result":{},"text_frame":true}'),  # the text frame never comes
    frame(b'{"id":1,"ok":true,"result":{},"text_frame":true}') + frames.HEADER.pack(10) + b"abc",  # cut short
    frame(b'{"id":1,"ok":true,"result":{},"text_frame":true}') + frame(b"\xff\xfe not utf-8"),
    frame(b'{"id":1,"ok":false,"text_frame":true}') + frame(b"text"),  # no result to belong to
    frame(b'{"id":1,"ok":true,"result":{},"text_frame":true}') + frames.HEADER.pack(1 << 30),  # over the cap
    frame(b"[1, 2]"),
])
def test_a_broken_reply_is_a_frame_error(data: bytes) -> None:
    with pytest.raises(frames.FrameError):
        read_back(data)
