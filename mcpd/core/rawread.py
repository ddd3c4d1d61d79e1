"""Byte access for ``files/read``: a file's own bytes or the text a compressed file holds, and
the binary-safe ``encoding: base64`` window (docs/REFERENCE.md §3).

Every read goes through a :data:`Pread` ``(n, pos) -> bytes``: ``os.pread`` on the descriptor for
a plain file, :class:`mcpd.core.grepread.Unpacked` for a ``.gz``, ``.xz``, ``.bz2`` or ``.zst``
file read with ``decompress`` (the default): offsets are then offsets in the decompressed text,
and ``files/grep``'s bounds apply (``read.grep_file_bytes`` of text, ``read.grep_max_ratio``).

A base64 window is ``offset``/``limit`` bytes (``read.default_bytes`` without a limit) encoded
as base64, at most three quarters of the response cap per call (the encoding's 4/3 then fits
the cap); its structured content says where it starts and ends, the next offset and whether
the end of the file was reached, since no warning can be appended to base64 text.
"""

from __future__ import annotations

import base64
import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mcpd.common.config import ReadLimits
from mcpd.core import grepread
from mcpd.helper.wire.errors import ENCODING_ERROR, FILE_TOO_LARGE, ToolError, invalid_argument

CHUNK = 1024 * 1024  # bytes per pread
OFF_T_END = 1 << 63  # bytes: no file offset reaches this (off_t is signed 64-bit); reads there are empty

Pread = Callable[[int, int], bytes]  # ``(n, pos)`` → up to ``n`` bytes at ``pos``: a file's bytes or its decompressed text


def too_large(size: int, limits: ReadLimits, suggestion: str) -> ToolError:
    """A ``FILE_TOO_LARGE`` error (docs/REFERENCE.md §3 "response cap"): ``size`` in bytes as far as known."""
    return ToolError(
        FILE_TOO_LARGE,
        f"the answer would exceed the response cap of {limits.response_cap} bytes",
        size=size,
        limit=limits.response_cap,
        suggestion=suggestion,
    )


def plain(fd: int) -> Pread:
    """The :data:`Pread` of an open file's own bytes (``os.pread`` on ``fd``)."""
    return lambda n, pos: os.pread(fd, n, pos)


def pread_full(rd: Pread, n: int, pos: int, size: int = 0) -> bytes:
    """Up to ``n`` bytes at byte ``pos`` (fewer only at end of file). ``size``: the file's size
    from ``fstat``, when known: a read that comes back short at or past it is taken as the end of
    the file without one more read to see it (``0``, as a ``/proc`` file reports: always read on
    until a read returns nothing)."""
    parts: list[bytes] = []
    got = 0
    while got < n:
        room = OFF_T_END - 1 - (pos + got)  # offset + count may not pass the largest off_t: nothing is there
        if room <= 0:
            break
        ask = min(n - got, CHUNK, room)
        b = rd(ask, pos + got)
        if not b:
            break
        parts.append(b)
        got += len(b)
        if len(b) < ask and 0 < size <= pos + got:
            break
    return b"".join(parts)


@dataclass(frozen=True)
class Source:
    """What a read reads: ``rd``; ``size`` in bytes (the ``fstat`` size; 0 when unknown, as for a
    decompressed text); ``kind`` the compression decompressed (``gz``, ``xz``, ``bz2``, ``zst``) or
    None; ``unpacked`` its stream."""

    rd: Pread
    size: int
    kind: str | None = None
    unpacked: grepread.Unpacked | None = None

    def text_size(self) -> int | None:
        """The size of what is read, when known: the ``fstat`` size, or a decompressed text's once
        its end was reached (else None)."""
        if self.unpacked is None:
            return self.size
        return self.unpacked.made if self.unpacked.ended else None


def source(fd: int, st: os.stat_result, args: dict[str, Any], limits: ReadLimits) -> Source:
    """The :class:`Source` of a ``files/read`` call on the open file ``fd``: decompressed when its
    name ends in a compression suffix and ``args["decompress"]`` is not False."""
    kind = grepread.compression(posixpath.basename(args["path"])) if args.get("decompress", True) else None
    if kind is None:
        return Source(plain(fd), st.st_size)
    unpacked = grepread.Unpacked(fd, kind, limits.grep_file_bytes, limits.grep_max_ratio)
    return Source(unpacked.pread, 0, kind, unpacked)


def unpack_error(why: grepread.Skipped, path: str, kind: str | None, requested: str) -> ToolError:
    """The ``files/read`` error for a compressed file that cannot be read as its text:
    ``FILE_TOO_LARGE`` (reason ``too_large`` or ``compression_ratio``), ``ENCODING_ERROR`` (reason
    ``corrupt``: damaged or truncated data), ``INVALID_ARGUMENT`` (``unsupported_compression``);
    details ``path``, ``compression``, ``reason`` and a ``suggestion``."""
    raw = "decompress: false reads the file's own bytes (with encoding: base64)"
    if why.reason in ("too_large", "compression_ratio"):
        return ToolError(FILE_TOO_LARGE, f"{path}: {why.message}", path=path, compression=kind, reason=why.reason,
                         suggestion=raw, **why.details)
    if why.reason == "corrupt":
        return ToolError(ENCODING_ERROR, f"{path}: the {kind} data is damaged or truncated: it does not decompress",
                         path=path, compression=kind, reason="corrupt", requestedEncoding=requested,
                         detectedEncoding="unknown", suggestion=raw)
    return invalid_argument(f"{path}: {why.message}", path=path, compression=kind, reason=why.reason)


def base64_window(src: Source, args: dict[str, Any], limits: ReadLimits) -> tuple[str, dict[str, Any]]:
    """The ``offset``/``limit`` window of ``src`` as base64 text, and its structured facts:
    ``byteRange: {start, end}`` (bytes of the file, or of the decompressed text), ``next_offset``
    (the next call's ``offset``, None at the end), ``eof``, ``size`` (None when not known).

    Raises:
        ToolError: ``FILE_TOO_LARGE`` when ``limit`` asks for more than three quarters of the
            response cap and more than that remains.
    """
    offset = args.get("offset") or 0
    limit = args.get("limit")
    n = limit if limit is not None else limits.default_bytes
    most = 3 * (limits.response_cap // 4)  # bytes whose base64 fits the response cap
    suggestion = f"read a smaller range: limit <= {most} (base64 text is 4/3 of the bytes)"
    if n > most and src.size - offset > most:
        raise too_large(src.size, limits, suggestion)  # known too large: refuse without reading
    want = min(n, most)
    got = pread_full(src.rd, want + 1, offset, src.size)
    if len(got) > want and n > most:
        raise too_large(max(src.size, offset + len(got)), limits, suggestion)
    more = len(got) > want
    data = got[:want]
    end = offset + len(data)
    info = {"byteRange": {"start": offset, "end": end}, "next_offset": end if more else None, "eof": not more,
            "size": src.text_size()}
    return base64.b64encode(data).decode("ascii"), info
