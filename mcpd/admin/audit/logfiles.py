"""Reading a log and its rotated files, as every ``mcpd audit`` command does.

A log is its live file and the files logrotate renamed (``FILE.1``, ``FILE.2.gz`` ...), read
oldest first (:func:`rotated_set`), ``.gz`` ones decompressed; :func:`backwards` reads from the
end, so a tail of a few records reads little even across a year of files. This module parses
lines; it judges nothing (the chain: :mod:`mcpd.admin.audit.verify`; filters:
:mod:`mcpd.admin.audit.filters`).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from mcpd.common.audit.chain import record_hash, record_seq

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_ROTATED = re.compile(r"^\.(\d+)(\.gz)?$")
MAX_LINE = 1 << 20  # bytes of one line of a log, newline included: a longer one is no record


class LogFileError(OSError):
    """A log file that cannot be read as one: not a regular file, or a line over
    :data:`MAX_LINE` bytes (the message names the file, and the line). An :class:`OSError`, so
    every command that reports an unreadable file reports this one alike: ``filename`` is the
    file, ``strerror`` the reason (with the line's number), ``line`` that number (0: the file as a
    whole), and ``str()`` all of it, ``FILE[:LINE]: reason``."""

    def __init__(self, path: str, reason: str, line: int = 0) -> None:
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")
        self.filename, self.strerror, self.line = path, f"line {line}: {reason}" if line else reason, line

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Line:
    """One raw line of a log: ``where`` is ``FILE:LINE`` (1-based), ``raw`` its bytes (newline kept)."""

    where: str
    raw: bytes

    @property
    def digest(self) -> str:
        """The line's :func:`~mcpd.common.audit.chain.record_hash`: the ``prev`` of the record after it."""
        return record_hash(self.raw)

    def record(self) -> dict[str, Any] | None:
        """The JSON object of this line, or ``None`` when it is not one."""
        try:
            obj = json.loads(self.raw)
        except (ValueError, RecursionError):  # (nested too deeply: no record either)
            return None
        return obj if isinstance(obj, dict) else None

    def chained(self) -> dict[str, Any] | None:
        """The record when it carries a valid ``seq`` (int >= 1) and ``prev`` (64 hex), else ``None``."""
        rec = self.record()
        if rec is None:
            return None
        seq, prev = record_seq(rec), rec.get("prev")
        ok = seq is not None and seq >= 1
        return rec if ok and isinstance(prev, str) and _HEX64.match(prev) else None


def open_regular(path: str) -> io.FileIO:
    """``path`` open for reading bytes, unbuffered, when it is a regular file: a FIFO, device or
    socket is refused rather than waited on (opened without blocking, then looked at).

    Raises:
        LogFileError: it is no regular file.
        OSError: it cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LogFileError(path, "not a regular file")
        os.set_blocking(fd, True)
        return io.FileIO(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def open_log(path: str) -> IO[bytes]:
    """``path`` (a regular file, :func:`open_regular`) open for reading bytes, decompressed when
    it ends in ``.gz``.

    Raises:
        OSError: it cannot be opened, or is no regular file (:class:`LogFileError`).
    """
    raw = open_regular(path)
    if not path.endswith(".gz"):
        return io.BufferedReader(raw)
    unzipped = gzip.GzipFile(fileobj=raw, mode="rb")
    unzipped.myfileobj = raw  # (closed with it)
    return unzipped  # type: ignore[return-value]


def bounded_lines(f: IO[bytes], path: str, limit: int = MAX_LINE) -> Iterator[tuple[int, bytes]]:
    """Each line of ``f`` (newline kept) with its number (1-based), none read past ``limit`` bytes.

    Raises:
        LogFileError: a line over ``limit`` bytes (naming ``path`` and the line).
    """
    number = 0
    while raw := f.readline(limit + 1):
        number += 1
        if len(raw) > limit:
            raise LogFileError(path, f"a line over {limit} bytes is no record", number)
        yield number, raw


def read_lines(paths: Iterable[str]) -> Iterator[Line]:
    """Every line of ``paths`` in order (``.gz`` files decompressed).

    Raises:
        OSError: a file cannot be opened or read, is no regular file, or holds a line over
            :data:`MAX_LINE` bytes (:class:`LogFileError`).
    """
    for path in paths:
        with open_log(path) as f:
            for number, raw in bounded_lines(f, path):
                yield Line(f"{path}:{number}", raw)


def rotated_set(path: str) -> list[str]:
    """``path``'s rotated files (``path.N``, ``path.N.gz``), oldest first, then ``path`` itself
    when it exists: the default file list of ``mcpd audit verify``."""
    folder, base = os.path.split(os.path.abspath(path))
    found = []
    for name in (os.listdir(folder) if os.path.isdir(folder) else []):
        m = _ROTATED.match(name[len(base):]) if name.startswith(base) else None
        if m:
            found.append((int(m.group(1)), os.path.join(folder, name)))
    files = [p for _, p in sorted(found, reverse=True)]
    return files + ([path] if os.path.exists(path) else [])


def first_record(path: str) -> dict[str, Any] | None:
    """The JSON record on the first line of ``path`` (``.gz`` decompressed), or None when it has
    none or cannot be read."""
    try:
        with open_log(path) as f:
            return Line(path, f.readline(1 << 20)).record()
    except (OSError, EOFError):
        return None


def records(lines: Iterable[Line]) -> Iterator[tuple[Line, dict[str, Any]]]:
    """Each line of ``lines`` that is a JSON record, with that record (others are skipped)."""
    for line in lines:
        rec = line.record()
        if rec is not None:
            yield line, rec


def backwards(path: str, end: int | None = None, block: int = 65536) -> Iterator[bytes]:
    """The non-empty lines of ``path`` (without newline), last first: a plain file read backwards
    in ``block``-byte steps (memory ~ one line and a block), a ``.gz`` one decompressed whole.
    ``end`` (bytes, plain files) stops at that offset instead of the current size, so a follower
    can go on from exactly there.

    Raises:
        OSError: cannot open or read the file, or it is no regular file (:class:`LogFileError`).
    """
    if path.endswith(".gz"):
        with open_log(path) as f:
            yield from (line for line in reversed(f.read().split(b"\n")) if line)
        return
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LogFileError(path, "not a regular file")
        size = st.st_size
        pos = size if end is None else min(end, size)
        rest = b""
        while pos > 0:
            step = min(block, pos)
            pos -= step
            pieces = (os.pread(fd, step, pos) + rest).split(b"\n")
            rest = pieces[0]
            yield from (line for line in reversed(pieces[1:]) if line)
        if rest:
            yield rest
    finally:
        os.close(fd)


def tail_lines(path: str, count: int, block: int = 65536, end: int | None = None) -> list[bytes]:
    """The last ``count`` non-empty lines of ``path`` (without newline), oldest first
    (:func:`backwards`; memory ~ answer).

    Raises:
        OSError: cannot open the file.
    """
    if count <= 0:
        return []
    out = []
    for line in backwards(path, end, block):
        out.append(line)
        if len(out) == count:
            break
    return out[::-1]


def follow_lines(path: str, start: int, interval: float = 0.5) -> Iterator[bytes]:
    """The non-empty lines appended to ``path`` after byte ``start`` (without newline), as they
    come, looking every ``interval`` seconds; reopens the path when rotated (its inode changes). Never
    ends.

    Raises:
        OSError: ``path`` cannot be opened, or is no regular file (:class:`LogFileError`).
    """
    handle = io.BufferedReader(open_regular(path))
    try:
        handle.seek(start)
        inode = os.fstat(handle.fileno()).st_ino
        pending = b""
        while True:
            chunk = handle.read(65536)
            if chunk:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                yield from (line for line in lines if line)
                continue
            time.sleep(interval)
            try:
                if os.stat(path).st_ino != inode:
                    handle.close()
                    handle = io.BufferedReader(open_regular(path))
                    inode = os.fstat(handle.fileno()).st_ino
                    pending = b""
            except FileNotFoundError:
                continue
    finally:
        handle.close()
