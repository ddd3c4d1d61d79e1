"""The frames root reads (:mod:`mcpd.helper.wire.frames`): a peer that ends inside a frame, in its
header or its body, is a :class:`FrameError` (never another exception, which would end a root
thread without its channel being shut); an end between frames is ``None``. Root parses with the
standard library alone (its codec): anything but one JSON object is a ``FrameError``,
however deep."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from mcpd.helper.monitor import TABLE
from mcpd.helper.wire import frames
from mcpd.helper.wire.requests import SchemaError, check


def received(data: bytes) -> tuple[dict | None, list[int]]:
    """What root's receive makes of ``data`` sent whole, then the end of the stream."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(data)
        theirs.shutdown(socket.SHUT_WR)
        return frames.recv_frame_fds(ours, frames.HELPER_REQUEST_CAP, 4)


@pytest.fixture
def as_root() -> Iterator[None]:
    """Root's codec, the standard library's (the test process has mcpd.common.frames' parser)."""
    saved = dict(frames.codec)
    frames.codec.update(dumps=frames._dumps, loads=frames._loads)
    try:
        yield
    finally:
        frames.codec.update(saved)


def test_an_end_between_frames_is_none_and_a_whole_frame_is_read() -> None:
    assert received(b"") == (None, [])
    assert received(frames.encode({"id": 1})) == ({"id": 1}, [])


@pytest.mark.parametrize("cut", [1, 2, 3, 4, 5, 9])
def test_an_end_inside_a_frame_is_a_frame_error(cut: int) -> None:
    with pytest.raises(frames.FrameError, match="inside a frame"):
        received(frames.encode({"type": "open", "id": 1})[:cut])


@pytest.mark.parametrize("body", [b"[1]", b"1", b"not json", b"\xff", b"", b"[" * 5000 + b"]" * 5000,
                                  b'{"path": ' + b"[" * 30000 + b"]" * 30000 + b"}"])
def test_root_refuses_what_is_not_one_json_object_as_a_frame_error(as_root: None, body: bytes) -> None:
    with pytest.raises(frames.FrameError):
        received(frames.HEADER.pack(len(body)) + body)


def test_root_parses_a_nested_value_its_schema_then_refuses(as_root: None) -> None:
    """Shallow enough for the parser: parsed, and root's schema check refuses it (no key of its
    table holds anything but a string, an integer or a boolean), which ends the channel."""
    body = b'{"type": "open", "id": 1, "follow": false, "want": "file", "path": ' + b"[" * 100 + b"]" * 100 + b"}"
    req = received(frames.HEADER.pack(len(body)) + body)[0]
    assert req is not None and isinstance(req["path"], list)
    with pytest.raises(SchemaError, match="open: malformed key 'path'"):
        check(TABLE, req)
