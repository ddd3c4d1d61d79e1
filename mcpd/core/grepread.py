"""The bytes ``files/grep`` searches in one open file: plain, or decompressed (docs/REFERENCE.md §3 ``files/grep``).

A file whose name ends in ``.gz``, ``.xz``, ``.bz2`` or ``.zst`` is searched as the text it
decompresses to (zlib for gzip (:mod:`mcpd.core.gunzip`), the standard library's lzma and bz2; ``zstandard`` for ``.zst`` when it
is installed, else such a file is skipped, reason ``unsupported_compression``). Every file is
read with ``os.pread`` on the descriptor it is given, a plain file at most :data:`READ` bytes at
a time, a compressed one's text in pieces of at most :data:`CHUNK` bytes, so memory never follows
the file.

Limits, each a :class:`Skipped` with its reason when passed:

* ``too_large``: a plain file over the per-file limit is not searched at all (its ``fstat`` size
  says so); a compressed one is searched until its decompressed text passes the limit.
* ``compression_ratio``: a compressed file whose decompressed bytes pass both
  :data:`RATIO_SLACK` and ``max_ratio`` times the compressed bytes read so far (a bomb).
* ``corrupt``: compressed data that does not decompress.
* ``window_too_large``: a valid zstd frame whose window is larger than the decoder allows
  (``zstandard``'s default, 128 MiB: a frame made with ``--long=31`` needs 2 GiB).

A plain file is read up to the size ``fstat`` gave when it was opened (bytes appended later are
not searched; a file truncated meanwhile ends where its reads end); a file that reports size 0
(``/proc``) is read until a read comes back empty, within the per-file limit.
"""

from __future__ import annotations

import bz2
import lzma
import os
import zlib
from collections.abc import Callable, Iterator
from typing import Any, cast

from mcpd.core.gunzip import GzipStream

CHUNK = 1024 * 1024  # bytes per read of a compressed file's text
READ = 128 * 1024  # bytes per read of a plain file: held in the processor's cache from the read to the search
#                     and the line count (1 MiB reads searched at half the speed)
BINARY_PROBE = 8192  # bytes of a file's head (decompressed) searched for a NUL byte
RATIO_SLACK = 1024 * 1024  # decompressed bytes any compressed file may reach before its ratio is judged
SUFFIXES = (".gz", ".xz", ".bz2", ".zst")


class Skipped(Exception):
    """A file not searched (or not to its end): ``reason`` is a ``files_skipped`` key, ``message`` a sentence."""

    def __init__(self, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.reason, self.message, self.details = reason, message, details


def compression(name: str) -> str | None:
    """The compressed format of a file by its name's suffix (``gz``, ``xz``, ``bz2``, ``zst``), or None."""
    if not name.endswith(SUFFIXES):
        return None
    for suffix in SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return suffix[1:]
    return None


class _Raw:
    """A read-only file object over a descriptor, by ``pread`` from its start; counts what was read."""

    def __init__(self, fd: int) -> None:
        self.fd, self.pos = fd, 0

    def read(self, n: int = -1) -> bytes:
        data = os.pread(self.fd, CHUNK if n is None or n < 0 else min(n, CHUNK), self.pos)
        self.pos += len(data)
        return data

    def readinto(self, buf: Any) -> int:
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def flush(self) -> None:
        pass


class _Zstd:
    """A ``.zst`` stream of any number of frames, read like the standard library's decompressors.

    ``zstandard``'s own stream reader ends quietly where a frame was cut short; this one raises
    ``EOFError`` there (``corrupt``). Input is fed :data:`FEED` bytes at a time, since one
    ``decompress`` call has no output bound: a zstd block turns a few bytes into 128 KiB, so a
    feed makes at most about 4 MiB however the data was made.
    """

    FEED = 128  # compressed bytes per decompress call

    def __init__(self, raw: _Raw, zstandard: Any) -> None:
        self._raw, self._new = raw, zstandard.ZstdDecompressor().decompressobj
        self._error = zstandard.ZstdError
        self._frame: Any = None  # the frame being decompressed (None between frames)
        self._in, self._at = b"", 0
        self._out = bytearray()

    def _feed(self) -> bool:
        """Decompress one feed; False at the end of the input."""
        if self._at >= len(self._in):
            self._in, self._at = self._raw.read(64 * 1024), 0
            if not self._in:
                if self._frame is not None:
                    raise EOFError("a zstd frame is cut short")
                return False
        data = self._in[self._at:self._at + self.FEED]
        self._at += len(data)
        while data:
            if self._frame is None:
                self._frame = self._new()
            try:
                self._out += self._frame.decompress(data)
            except self._error as exc:
                if "too much memory" in str(exc):  # a valid frame whose window passes the decoder's bound
                    raise Skipped("window_too_large", "the zstd frame needs a window larger than the decoder's "
                                  "limit of 128 MiB (made with --long?): not decompressed") from None
                raise ValueError(str(exc)) from None
            if not self._frame.eof:
                break
            data, self._frame = self._frame.unused_data, None
        return True

    def read(self, n: int = -1) -> bytes:
        n = CHUNK if n is None or n < 0 else n
        while len(self._out) < n and self._feed():
            pass
        out = bytes(self._out[:n])
        del self._out[:n]
        return out

    def close(self) -> None:
        self._frame, self._out = None, bytearray()


def _zstd(raw: _Raw) -> Any:
    try:
        import zstandard
    except ImportError:
        raise Skipped("unsupported_compression", "zstandard is not installed: .zst files are not searched") from None
    return _Zstd(raw, zstandard)


_OPENERS: dict[str, Callable[[_Raw], Any]] = {
    "gz": GzipStream,  # headers parsed in C: a huge FCOMMENT costs no Python loop
    "xz": lambda raw: lzma.LZMAFile(cast(Any, raw)),
    "bz2": lambda raw: bz2.BZ2File(cast(Any, raw)),
    "zst": _zstd,
}
_BAD_DATA: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError)


def head(fd: int, kind: str | None) -> bytes:
    """The first :data:`BINARY_PROBE` bytes of the file's text (decompressed when ``kind``)."""
    if kind is None:
        return os.pread(fd, BINARY_PROBE, 0)
    stream = _OPENERS[kind](_Raw(fd))
    try:
        return stream.read(BINARY_PROBE)
    except _BAD_DATA:
        raise Skipped("corrupt", "the compressed data is damaged") from None
    finally:
        stream.close()


def newlines(fd: int, start: int, end: int) -> int:
    """The number of ``\\n`` in bytes ``start`` to ``end`` of the plain file ``fd``, read again by
    ``pread`` (:data:`READ` bytes at a time; a file cut short meanwhile counts to where it ends).

    Raises:
        OSError: a read failed.
    """
    count, pos = 0, start
    while pos < end:
        data = os.pread(fd, min(READ, end - pos), pos)
        if not data:
            break
        count += data.count(b"\n")
        pos += len(data)
    return count


def chunks(fd: int, kind: str | None, size: int, start: int, file_limit: int, max_ratio: int,
           skipped: Callable[[bytes], None] | None = None, first: bytes = b"") -> Iterator[bytes]:
    """The file's text from byte ``start`` on, in pieces of at most :data:`READ` bytes (plain) or
    :data:`CHUNK` bytes (decompressed).

    ``kind``: :func:`compression`'s answer; ``size``: the ``fstat`` size at open (bytes);
    ``file_limit``: the per-file limit (bytes of text); ``max_ratio``: the bomb bound;
    ``skipped``: given the decompressed text before ``start`` of a compressed file, in order, before
    the first piece is yielded (a plain file's is read with ``pread`` by whoever needs it);
    ``first``: a plain file's first piece, already read at ``start`` (it is not read again).

    Raises:
        Skipped: ``too_large``, ``compression_ratio``, ``corrupt``, ``unsupported_compression``
            (module docstring), before the first piece or between two.
        OSError: a read failed.
    """
    if kind is None:
        if size > file_limit:
            raise Skipped("too_large", f"the file has {size} bytes, over the per-file limit of {file_limit}",
                          size=size, limit=file_limit)
        end = size if size > 0 else file_limit
        pos = start
        if first:
            pos += len(first)
            yield first
        while pos < end:
            data = os.pread(fd, min(READ, end - pos), pos)
            if not data:
                return
            pos += len(data)
            yield data
        return
    raw = _Raw(fd)
    stream = _OPENERS[kind](raw)
    made = 0
    try:
        while True:
            try:
                data = stream.read(CHUNK)
            except _BAD_DATA:
                raise Skipped("corrupt", "the compressed data is damaged") from None
            if not data:
                return
            made += len(data)
            if made > file_limit:
                raise Skipped("too_large", f"the decompressed text passes the per-file limit of {file_limit} bytes",
                              limit=file_limit)
            if made > RATIO_SLACK and made > max_ratio * max(raw.pos, 1):
                raise Skipped("compression_ratio", f"decompresses more than {max_ratio} times its size "
                              "(a decompression bomb?): not decompressed further", limit=max_ratio)
            if made <= start:
                if skipped is not None:
                    skipped(data)
                continue
            if made - len(data) < start and skipped is not None:
                skipped(data[:start - (made - len(data))])
            yield data if made - len(data) >= start else data[start - (made - len(data)):]
    finally:
        stream.close()


class Unpacked:
    """Random access, by ``pread(n, pos)``, to the decompressed text of an open compressed file
    (``files/read``'s reading of ``.gz``, ``.xz``, ``.bz2``, ``.zst``), under :func:`chunks`'s limits.

    The stream is decompressed forward from the start: a read at or after the current position
    goes on from there; a read before it decompresses again from the start (bounded by the same
    limits). Memory is one piece (at most :data:`CHUNK` bytes) plus what a read returns.
    ``made`` counts the most decompressed bytes produced; ``ended`` is True once the stream's
    end was reached (``made`` is then the text's size).

    Raises (from ``pread``): :class:`Skipped` ``too_large``, ``compression_ratio``, ``corrupt``,
    ``unsupported_compression``; ``OSError`` from reading.
    """

    def __init__(self, fd: int, kind: str, file_limit: int, max_ratio: int) -> None:
        self.fd, self.kind, self.file_limit, self.max_ratio = fd, kind, file_limit, max_ratio
        self.made, self.ended = 0, False
        self._restart()

    def _restart(self) -> None:
        self._pieces = chunks(self.fd, self.kind, 0, 0, self.file_limit, self.max_ratio)
        self._buf, self._base, self._pos, self._done = b"", 0, 0, False  # piece, its text offset, past it

    def pread(self, n: int, pos: int) -> bytes:
        """Up to ``n`` bytes of the text at offset ``pos`` (fewer only at its end)."""
        if pos < self._base:
            self._restart()
        parts: list[bytes] = []
        while n > 0:
            if pos >= self._pos:
                piece = None if self._done else next(self._pieces, None)
                if piece is None:
                    self._done = self.ended = True
                    break
                self._buf, self._base = piece, self._pos
                self._pos += len(piece)
                self.made = max(self.made, self._pos)
                continue
            part = self._buf[pos - self._base:pos - self._base + n]
            parts.append(part)
            pos, n = pos + len(part), n - len(part)
        return b"".join(parts)
