"""mcpd.core.gunzip: gzip text read member by member by zlib, headers of any length in linear time."""

from __future__ import annotations

import gzip
import io
import struct
import time
import zlib

import pytest

from mcpd.core.gunzip import GzipStream


def _read(data: bytes, n: int = 1 << 20) -> bytes:
    stream, out = GzipStream(io.BytesIO(data)), []
    while chunk := stream.read(n):
        out.append(chunk)
    return b"".join(out)


def test_members_padding_and_an_empty_file_read_as_gzip_reads_them() -> None:
    text = bytes(range(256)) * 5000
    assert _read(gzip.compress(text), 4096) == text
    both = gzip.compress(b"one\n") + b"\0" * 7 + gzip.compress(b"two\n") + b"\0\0"
    assert _read(both) == gzip.decompress(both) == b"one\ntwo\n"
    assert _read(b"") == b""


@pytest.mark.parametrize(("data", "error"), [
    (gzip.compress(b"x" * 100000)[:-6], EOFError),  # cut short
    (gzip.compress(b"x") + b"junk", zlib.error),  # trailing bytes that are no member
    (gzip.compress(b"x")[:-8] + b"\0\0\0\0" + gzip.compress(b"x")[-4:], zlib.error),  # bad CRC
    (b"not gzip at all", zlib.error),
], ids=["cut short", "trailing junk", "bad CRC", "not gzip"])  # (gzip's header holds the time: no ids from data)
def test_damaged_data_raises(data: bytes, error: type[BaseException]) -> None:
    with pytest.raises(error):
        _read(data)


def test_a_huge_header_comment_costs_milliseconds() -> None:
    body = zlib.compressobj(6, zlib.DEFLATED, -15)
    raw = body.compress(b"hello\n") + body.flush()
    data = (b"\x1f\x8b\x08\x18\0\0\0\0\0\x03" + b"n" * (8 << 20) + b"\0" + b"c" * (8 << 20) + b"\0" + raw
            + struct.pack("<II", zlib.crc32(b"hello\n"), 6))
    started = time.monotonic()
    assert _read(data) == b"hello\n"
    assert time.monotonic() - started < 1.5  # gzip.GzipFile's byte-at-a-time header loop takes seconds
