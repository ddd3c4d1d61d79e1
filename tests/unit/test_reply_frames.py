"""Worker reply frames (issue 11): a result's text travels as a second frame of raw UTF-8; the
front takes it back exactly, and refuses a reply whose text frame is missing, too large or not
UTF-8. The worker's own sender (``send_reply``) writes the frames; the pool's reader reads them."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from mcpd.front.workers.channel import WorkerChannel, read_reply_frame
from mcpd.helper.wire import frames
from mcpd.worker.main import send_reply


def read_back(data: bytes, cap: int = 1 << 20) -> dict | None:
    async def go() -> dict | None:
        channel = WorkerChannel()  # fed as the event loop would feed it, without a socket
        channel.data_received(data)
        channel.eof_received()
        return await read_reply_frame(channel, cap)

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


async def _channel_over_socketpair() -> tuple[WorkerChannel, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.setblocking(False)
    _, channel = await asyncio.get_running_loop().create_unix_connection(WorkerChannel, sock=ours)
    return channel, theirs


def _flood(sock: socket.socket, limit: int) -> int:
    """Write to ``sock`` until its buffers are full or ``limit`` bytes went; return how many went."""
    sent, chunk = 0, b"\x00" * 65536
    while sent < limit:
        try:
            sent += sock.send(chunk)
        except BlockingIOError:
            break
    return sent


def test_a_worker_sending_what_nobody_asked_for_fills_no_memory() -> None:
    """A worker (running as the caller's account, so possibly in the caller's hands) that writes
    and writes while no call waits on it: the front stops reading once it holds about
    ``STREAM_LIMIT`` bytes; the rest stays in the worker's socket, whose send then blocks."""
    from mcpd.front.workers.channel import STREAM_LIMIT

    async def go() -> tuple[int, int]:
        channel, theirs = await _channel_over_socketpair()
        sent = 0
        for _ in range(200):  # bounded: at most 200 rounds of filling the socket
            sent += _flood(theirs, 64 * STREAM_LIMIT - sent)
            await asyncio.sleep(0.005)
            if sent >= 64 * STREAM_LIMIT:
                break
        held = len(channel._buf)
        theirs.close()
        channel.close()
        await channel.closed
        return sent, held

    sent, held = asyncio.run(go())
    assert held <= STREAM_LIMIT + 1024 * 1024  # the limit and one read at most
    assert sent < 16 * STREAM_LIMIT  # the writer was stopped: nothing read it all


def test_a_held_channel_reads_nothing_until_let_go_then_the_frame_is_there() -> None:
    """While a granted call waits for the root helper, the worker's reply wakes nobody: the channel
    reads nothing; once let go, the reply is read whole."""
    reply = {"id": 3, "ok": True, "result": {"text": "granted\n"}}

    async def go() -> tuple[int, dict | None]:
        channel, theirs = await _channel_over_socketpair()
        channel.hold(True)
        theirs.setblocking(True)
        send_reply(theirs, reply)
        await asyncio.sleep(0.05)
        before = len(channel._buf)
        channel.hold(False)
        got = await asyncio.wait_for(read_reply_frame(channel, 1 << 20), 10)
        theirs.close()
        channel.close()
        return before, got

    before, got = asyncio.run(go())
    assert before == 0
    assert got == reply


def test_a_worker_that_ends_inside_a_frame_is_a_frame_error_and_between_frames_none() -> None:
    whole = sent({"id": 1, "ok": True, "result": {"text": "abc"}})
    with pytest.raises(frames.FrameError):
        read_back(whole[:-1])
    with pytest.raises(frames.FrameError):
        read_back(whole[:2])
    assert read_back(b"") is None
