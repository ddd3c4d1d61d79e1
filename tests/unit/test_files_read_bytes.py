"""files/read's binary-safe and decompressed reads (docs/REFERENCE.md §3 ``encoding: base64``,
compressed files) through ``ops.run`` with the real opener, against real files."""

from __future__ import annotations

import base64
import bz2
import dataclasses
import gzip
import hashlib
import lzma
import os
from pathlib import Path
from typing import Any

import pytest
import zstandard

from mcpd.common.config import ReadLimits
from mcpd.core import grepread
from tests.support.textread import LIMITS, call, text

COMPRESSORS = {
    "gz": gzip.compress,
    "xz": lzma.compress,
    "bz2": bz2.compress,
    "zst": lambda data: zstandard.ZstdCompressor().compress(data),
}


def ok(path: Path, limits: ReadLimits = LIMITS, **args: Any) -> dict[str, Any]:
    reply = call(path, limits, **args)
    assert reply["ok"], reply
    return dict(reply["result"])


def fails(path: Path, code: str, limits: ReadLimits = LIMITS, **args: Any) -> dict[str, Any]:
    reply = call(path, limits, **args)
    assert not reply["ok"] and reply["error"]["code"] == code, reply
    return dict(reply["error"])


def binary(size: int) -> bytes:
    return bytes((i * 7 + i // 251) % 256 for i in range(size))


def read_all_base64(path: Path, limit: int | None, **args: Any) -> tuple[bytes, int]:
    """The file through consecutive base64 windows, following next_offset; and the number of calls."""
    out, offset, calls = b"", 0, 0
    while True:
        extra = {} if limit is None else {"limit": limit}
        result = ok(path, encoding="base64", offset=offset, **extra, **args)
        calls += 1
        meta = result["metadata"]
        chunk = base64.b64decode(result["text"], validate=True)
        assert meta["byteRange"] == {"start": offset, "end": offset + len(chunk)}
        out += chunk
        if meta["eof"]:
            assert meta["next_offset"] is None
            return out, calls
        assert meta["next_offset"] == offset + len(chunk)
        offset = meta["next_offset"]


@pytest.mark.parametrize("limit", [None, 1, 4096, 100_000])
def test_base64_pages_give_the_file_back(tmp_path: Path, limit: int | None) -> None:
    data = binary(30_001 if limit != 1 else 300)
    p = tmp_path / "blob.bin"
    p.write_bytes(data)
    got, calls = read_all_base64(p, limit)
    assert got == data
    step = limit or LIMITS.default_bytes
    assert calls == max(1, -(-len(data) // step))  # the page that ends the file says so: no empty last call


def test_base64_of_an_empty_file_and_past_the_end(tmp_path: Path) -> None:
    p = tmp_path / "empty"
    p.write_bytes(b"")
    result = ok(p, encoding="base64")
    assert result["text"] == "" and result["metadata"]["eof"] is True and result["metadata"]["size"] == 0
    q = tmp_path / "small"
    q.write_bytes(b"\0\1\2")
    result = ok(q, encoding="base64", offset=2**64)
    assert result["text"] == "" and result["metadata"]["eof"] is True


def test_text_request_of_a_binary_file_is_still_binary_file(tmp_path: Path) -> None:
    p = tmp_path / "blob.bin"
    p.write_bytes(binary(5000))
    assert fails(p, "BINARY_FILE")["message"] == "cannot read binary file"
    assert base64.b64decode(ok(p, encoding="base64")["text"]) == binary(5000)


def test_base64_window_is_bounded_by_the_response_cap(tmp_path: Path) -> None:
    limits = dataclasses.replace(LIMITS, response_cap=4000)
    p = tmp_path / "blob.bin"
    p.write_bytes(binary(10_000))
    error = fails(p, "FILE_TOO_LARGE", limits, encoding="base64", limit=5000)
    assert "limit <= 3000" in error["details"]["suggestion"]
    result = ok(p, limits, encoding="base64", limit=3000)
    assert len(result["text"]) <= 4000 and result["metadata"]["next_offset"] == 3000
    assert ok(p, limits, encoding="base64", offset=7500, limit=5000)["metadata"]["eof"] is True  # 2500 remain


def test_base64_with_metadata_hashes_the_file(tmp_path: Path) -> None:
    data = binary(2000)
    p = tmp_path / "blob.bin"
    p.write_bytes(data)
    meta = ok(p, encoding="base64", include_metadata=True)["metadata"]
    assert meta["sha256"] == hashlib.sha256(data).hexdigest() and meta["encoding"] == "base64"
    assert meta["size"] == 2000 and meta["eof"] is True


def log_text(lines: int) -> bytes:
    return "".join(f"{i:06d} request id={i * 31 % 1000} caf\u00e9\n" for i in range(1, lines + 1)).encode()


@pytest.mark.parametrize("kind", sorted(COMPRESSORS))
def test_compressed_files_read_as_their_text(tmp_path: Path, kind: str) -> None:
    data = log_text(50_000)
    p = tmp_path / f"app.log.1.{kind}"
    p.write_bytes(COMPRESSORS[kind](data))
    assert text(p, start_line=40_000, end_line=40_001) == "040000 request id=0 caf\u00e9\n040001 request id=31 caf\u00e9\n"
    assert text(p, offset=1_000_000, limit=100) == data[1_000_000:1_000_100].decode()
    assert text(p, offset=10, limit=50) == data[10:60].decode()  # further back: decompressed again from the start
    meta = ok(p, include_metadata=True, start_line=1, end_line=1)["metadata"]
    assert meta["compression"] == kind and meta["compressedSize"] == p.stat().st_size
    assert meta["size"] == len(data) and meta["sha256"] == hashlib.sha256(data).hexdigest()
    assert meta["totalLines"] == 50_000


def test_decompressed_default_read_warns_with_an_unknown_total(tmp_path: Path) -> None:
    p = tmp_path / "app.log.gz"
    p.write_bytes(gzip.compress(log_text(5000)))
    answer = text(p)
    assert answer.startswith("000001 ")
    assert "of an unknown total (the decompressed text's size is known only at its end)" in answer
    assert '{"path": "' + str(p) + '", "offset": 10240}' in answer


def test_decompress_false_gives_the_stored_bytes(tmp_path: Path) -> None:
    stored = gzip.compress(log_text(100))
    p = tmp_path / "app.log.gz"
    p.write_bytes(stored)
    assert fails(p, "BINARY_FILE", decompress=False)["message"] == "cannot read binary file"
    result = ok(p, encoding="base64", decompress=False, limit=len(stored))
    assert base64.b64decode(result["text"]) == stored and "compression" not in result["metadata"]
    decompressed = ok(p, encoding="base64", limit=100_000)
    assert base64.b64decode(decompressed["text"]) == log_text(100)
    assert decompressed["metadata"]["compression"] == "gz" and decompressed["metadata"]["size"] == len(log_text(100))


def test_a_name_that_is_only_the_suffix_is_a_plain_file(tmp_path: Path) -> None:
    p = tmp_path / ".gz"
    p.write_bytes(b"plain text\n")
    assert text(p) == "plain text\n"


def test_decompression_bomb_is_refused_with_the_reason(tmp_path: Path) -> None:
    p = tmp_path / "zeros.gz"
    with gzip.open(p, "wb", compresslevel=1) as f:
        block = b"a" * (1024 * 1024)
        for _ in range(64):
            f.write(block)
    error = fails(p, "FILE_TOO_LARGE", offset=50 * 1024 * 1024, limit=10)
    assert error["details"]["reason"] == "compression_ratio" and error["details"]["compression"] == "gz"
    assert "decompression bomb" in error["message"] and "decompress: false" in error["details"]["suggestion"]
    assert fails(p, "FILE_TOO_LARGE", include_metadata=True)["details"]["reason"] == "compression_ratio"
    assert text(p, limit=5) == "aaaaa"  # the first window needs no more than its own megabyte


def test_decompressed_text_over_the_per_file_limit_is_refused(tmp_path: Path) -> None:
    limits = dataclasses.replace(LIMITS, grep_file_bytes=100_000, grep_max_ratio=10**6)
    p = tmp_path / "app.log.xz"
    p.write_bytes(lzma.compress(log_text(20_000)))
    error = fails(p, "FILE_TOO_LARGE", limits, start_line=19_000)
    assert error["details"]["reason"] == "too_large" and error["details"]["limit"] == 100_000


@pytest.mark.parametrize("kind", sorted(COMPRESSORS))
def test_truncated_or_corrupt_data_is_a_clear_error(tmp_path: Path, kind: str) -> None:
    whole = COMPRESSORS[kind](log_text(20_000))
    for name, data in (("truncated", whole[: len(whole) // 2]), ("corrupt", whole[:20] + b"\xff" * 200 + whole[220:])):
        p = tmp_path / f"{name}.log.{kind}"
        p.write_bytes(data)
        error = fails(p, "ENCODING_ERROR", include_metadata=True)
        assert error["details"]["reason"] == "corrupt" and error["details"]["compression"] == kind, error
        assert "damaged or truncated" in error["message"]


@pytest.mark.parametrize("kind", ["gz", "zst", "bz2", "xz"])
def test_several_members_or_frames_are_one_text(tmp_path: Path, kind: str) -> None:
    parts = [log_text(3000), b"", log_text(10)]
    p = tmp_path / f"joined.log.{kind}"
    p.write_bytes(b"".join(COMPRESSORS[kind](part) for part in parts))
    whole = b"".join(parts)
    meta = ok(p, include_metadata=True, limit=10)["metadata"]
    assert meta["size"] == len(whole) and meta["sha256"] == hashlib.sha256(whole).hexdigest()
    assert text(p, offset=len(whole) - 33) == whole[-33:].decode()  # (30 from the end is inside an é)


def test_an_empty_compressed_file_reads_as_empty(tmp_path: Path) -> None:
    for kind in sorted(COMPRESSORS):
        p = tmp_path / f"empty.{kind}"
        p.write_bytes(COMPRESSORS[kind](b""))
        assert text(p) == ""
        assert ok(p, encoding="base64")["metadata"] == {
            "byteRange": {"start": 0, "end": 0}, "next_offset": None, "eof": True, "size": 0,
            "encoding": "base64", "compression": kind, "compressedSize": p.stat().st_size}


def test_grep_reader_says_corrupt_at_a_cut_zstd_frame(tmp_path: Path) -> None:
    """files/grep reads through the same decompressor: a .zst cut short is ``corrupt``, not a quiet end."""
    whole = COMPRESSORS["zst"](log_text(20_000))
    p = tmp_path / "cut.log.zst"
    p.write_bytes(whole[: len(whole) // 2])
    fd = os.open(p, os.O_RDONLY)
    try:
        with pytest.raises(grepread.Skipped) as info:
            for _ in grepread.chunks(fd, "zst", 0, 0, 1 << 30, 200):
                pass
        assert info.value.reason == "corrupt"
    finally:
        os.close(fd)
