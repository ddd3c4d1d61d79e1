"""The reading core: pure functions from an open descriptor to docs/REFERENCE.md §3's answer.

One core serves both routes in the account's own worker (a file it opened itself, or the
descriptor root opened for a granted privileged read), so the two routes cannot drift apart. It
reads only with ``os.pread`` on the descriptor it is given (directly, or through the bounded
decompressor of :mod:`mcpd.core.rawread` for a compressed file), streams in 1 MiB chunks, counts
lines with ``bytes.count`` and never trusts the file size: memory is proportional to the answer
(at most the response cap), never to the file. ``encoding: base64`` windows are
:mod:`mcpd.core.rawread`'s.

Lines end at ``\\n`` only. For UTF-8, ASCII, Latin-1, CP1252 and other ASCII-compatible
encodings, lines are found in the bytes (0x0A is only ever ``\\n`` there) and the selection is
returned byte-exact. For UTF-16/32 (where 0x0A may be half of another character) the file is
decoded incrementally from its start up to the end of the selection and lines are found in the
decoded text; bytes before the selection are decoded (an invalid byte there is an
``ENCODING_ERROR``) but never held.
"""

from __future__ import annotations

import array
import bisect
import codecs
import collections
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from mcpd.common.config import ReadLimits
from mcpd.common.redaction import REDACTED_BYTES
from mcpd.core import grepread, rawread, redactread, textdecode, textmeta
from mcpd.core.rawread import Pread, pread_full, too_large
from mcpd.core.tools._schemas import ENCODINGS
from mcpd.helper.wire.errors import BINARY_FILE, LINE_TOO_LONG, PERMISSION_DENIED, RANGE_OUT_OF_BOUNDS, ToolError

CHUNK = 1024 * 1024  # bytes per pread
BINARY_PROBE = 8192  # bytes of the file's head searched for a NUL byte
INDEX_FILES = 32  # files with a line index per process (the least recently used is dropped first)
INDEX_POINTS = 4096  # checkpoints per file (16 bytes each); past that, every other one is dropped
INDEX_STEP = 16 * 1024  # bytes between checkpoints (a deep read counts about this far by itself)


class _Points:
    """One file's checkpoints as two parallel arrays of 64-bit integers (16 bytes a checkpoint)."""

    __slots__ = ("pos", "line")

    def __init__(self) -> None:
        self.pos = array.array("q")
        self.line = array.array("q")

    def __len__(self) -> int:
        return len(self.pos)


class LineIndex:
    """Sparse line offsets of recently read files, so a deep line read need not count every line
    before it again (e.g. lines 300000-300100 of a 50 MiB log).

    A checkpoint ``(pos, line)`` says that byte ``pos`` of the file lies in line ``line``
    (1-based). Checkpoints are recorded every :data:`INDEX_STEP` bytes while a line-mode read
    counts its way to its first line, and hold only numbers, never content. An index is keyed by the
    file's identity and version as ``fstat`` reports it: ``(st_dev, st_ino, st_size,
    st_mtime_ns, st_ctime_ns)``; a file that is appended to, truncated, rewritten or replaced gets a
    new key, so a stale index is never consulted (a growing log is scanned afresh, and indexed again). Memory
    is bounded: :data:`INDEX_FILES` files, least recently used dropped first, and
    :data:`INDEX_POINTS` checkpoints of 16 bytes per file (64 KiB). Not thread-safe: one per
    worker process.
    """

    def __init__(self, files: int = INDEX_FILES, points: int = INDEX_POINTS) -> None:
        self._files: collections.OrderedDict[tuple[int, ...], _Points] = collections.OrderedDict()
        self._max_files, self._max_points = files, points

    @staticmethod
    def key(st: os.stat_result) -> tuple[int, ...]:
        """The index key of an open file: device, inode, size (bytes), mtime and ctime (ns). The
        ctime changes with every write and every ``utime``, so a rewrite that keeps the size and
        puts the old mtime back still gets a new key."""
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def before(self, key: tuple[int, ...], line: int) -> tuple[int, int, int] | None:
        """The last checkpoint ``(pos, line_at_pos)`` with ``line_at_pos < line``, and the offset
        of the checkpoint after it (-1 when it is the last), or ``None``."""
        points = self._files.get(key)
        if not points:
            return None
        self._files.move_to_end(key)
        i = bisect.bisect_left(points.line, line) - 1
        if i < 0:
            return None
        nxt = points.pos[i + 1] if i + 1 < len(points) else -1
        return points.pos[i], points.line[i], nxt

    def frontier(self, key: tuple[int, ...]) -> int:
        """The offset of the last checkpoint of ``key`` (-1 when it has none)."""
        points = self._files.get(key)
        return points.pos[-1] if points else -1

    def add(self, key: tuple[int, ...], pos: int, line: int) -> None:
        """Record that byte ``pos`` lies in line ``line`` (ignored unless past the last checkpoint)."""
        points = self._files.get(key)
        if points is None:
            points = self._files[key] = _Points()
            while len(self._files) > self._max_files:
                self._files.popitem(last=False)
        if points and pos <= points.pos[-1]:
            return
        points.pos.append(pos)
        points.line.append(line)
        if len(points) > self._max_points:
            del points.pos[1::2]
            del points.line[1::2]

    def points(self, key: tuple[int, ...]) -> list[tuple[int, int]]:
        """The checkpoints of ``key`` as ``(pos, line)`` pairs (introspection for tests)."""
        points = self._files.get(key)
        return [] if points is None else list(zip(points.pos, points.line))

    def __len__(self) -> int:
        return len(self._files)


LINE_INDEX = LineIndex()  # this process's index (each worker has its own)


def _nth(buf: Any, nl: Any, n: int, start: int = 0) -> int:
    """Index of the ``n``-th (1-based) ``nl`` in ``buf`` at or after ``start`` (caller checked it exists)."""
    p = start - 1
    for _ in range(n):
        p = buf.find(nl, p + 1)
    return int(p)


SCAN_FINDS = 512  # up to this many line ends are looked for one by one; more are counted first


def _scan(buf: Any, nl: Any, n: int) -> tuple[int, int]:
    """Where the ``n``-th (``n`` >= 1) ``nl`` of ``buf`` is: ``(its index, n)``, or ``(-1, how
    many there are)`` when there are fewer. A few are found one by one, stopping there (a deep
    read from a checkpoint needs only the next few hundred lines of its chunk); many are counted
    over the whole buffer first, which is faster per byte."""
    if n > SCAN_FINDS:
        c = buf.count(nl)
        return (_nth(buf, nl, n), n) if c >= n else (-1, c)
    p = -1
    for k in range(n):
        p = buf.find(nl, p + 1)
        if p < 0:
            return -1, k
    return int(p), n


class _Selector:
    """Line-mode state machine fed with consecutive chunks (bytes, or str for UTF-16/32)."""

    def __init__(self, start: int, end: int | None, limits: ReadLimits, nl: Any, nbytes: Callable[[Any], int]):
        self.start, self.end, self.limits, self.nl, self.nbytes = start, end, limits, nl, nbytes
        self.line = 1  # number of the line at the current position
        self.selecting = start == 1
        self.done = False
        self.col = 0  # length of the current selected line so far (bytes, or characters × unit)
        self.line_off = 0  # byte offset of the current selected line
        self.first_off = 0  # byte offset of the selection's first line (0: the file's start)
        self.parts: list[Any] = []
        self.size = 0  # bytes selected
        self.seen = 0  # bytes scanned
        self.last_nl = False

    def feed(self, chunk: Any, byte_of: Callable[[int], int], scale: int) -> None:
        """Consume one chunk; ``byte_of(i)`` is the file offset of ``chunk[i]``; ``scale`` bytes per unit."""
        if not chunk:
            return
        self.last_nl = chunk[-1:] == self.nl
        i = 0
        if not self.selecting:
            p, c = _scan(chunk, self.nl, self.start - self.line)  # at least 1: line < start here
            if p < 0:
                self.line += c
                return
            i = p + 1
            self.line, self.selecting, self.col, self.line_off = self.start, True, 0, byte_of(i)
            self.first_off = self.line_off
        seg = chunk[i:]
        if self.end is not None:
            p, _ = _scan(seg, self.nl, self.end - self.line + 1)  # at least 1: line <= end here
            if p >= 0:
                seg, self.done = seg[: p + 1], True
        self._check_long(seg, lambda k: byte_of(i + k), scale)
        self.line += seg.count(self.nl)
        self.parts.append(seg)
        self.size += self.nbytes(seg)
        if self.size > self.limits.response_cap:
            raise too_large(self.size, self.limits, "select fewer lines with start_line and end_line")

    def _long(self, line: int, offset: int) -> ToolError:
        return ToolError(
            LINE_TOO_LONG,
            f"line {line} is longer than {self.limits.max_line_bytes} bytes",
            line=line,
            offset=offset,
        )

    def _check_long(self, seg: Any, byte_of: Callable[[int], int], scale: int) -> None:
        """docs/REFERENCE.md §3 "long line": no selected line over ``max_line_bytes``; jumps window by window."""
        mx = self.limits.max_line_bytes // scale
        first = seg.find(self.nl)
        if first == -1:
            self.col += len(seg)
            if self.col > mx:
                raise self._long(self.line, self.line_off)
            return
        if self.col + first > mx:
            raise self._long(self.line, self.line_off)
        last = seg.rfind(self.nl)
        pos = first
        while pos < last:
            r = seg.rfind(self.nl, pos + 1, min(pos + mx + 2, last + 1))
            if r == -1:
                raise self._long(self.line + seg.count(self.nl, 0, pos + 1), byte_of(pos + 1))
            pos = r
        self.col = len(seg) - last - 1
        self.line_off = byte_of(last + 1)
        if self.col > mx:
            raise self._long(self.line + seg.count(self.nl), self.line_off)

    def total_lines(self) -> int:
        """Lines in the file once it was scanned to the end: ``\\n`` count + 1 for an unterminated last line."""
        return self.line - 1 + (1 if self.seen and not self.last_nl else 0)


def _offsets(base: int) -> Callable[[int], int]:
    return lambda k: base + k


def _text_offsets(base: int, t: str, codec: str) -> Callable[[int], int]:
    return lambda k: base + len(t[:k].encode(codec))


def _byte_chunks(rd: Pread, pos: int, first: int = CHUNK) -> Iterator[tuple[bytes, Callable[[int], int]]]:
    """Consecutive chunks from byte ``pos``: ``first`` bytes, then :data:`CHUNK` bytes at a time."""
    size = first
    while True:
        b = rd(size, pos)
        if not b:
            return
        yield b, _offsets(pos)
        pos += len(b)
        size = CHUNK


def _text_chunks(rd: Pread, pos: int, codec: str, requested: str) -> Iterator[tuple[str, Callable[[int], int]]]:
    dec = codecs.getincrementaldecoder(codec)()
    start = pos
    while True:
        b = rd(CHUNK, pos)
        try:
            t = dec.decode(b, final=not b)
        except UnicodeDecodeError as exc:
            raise textdecode.encoding_error(b, requested, exc.start) from None
        yield t, _text_offsets(start, t, codec)
        if not b:
            return
        pos += len(b)
        start = pos - len(dec.getstate()[0])


def _lines(rd: Pread, st: os.stat_result | None, args: dict[str, Any], limits: ReadLimits, codec: str,
           bom: int, detectors: tuple[str, ...] = ()) -> tuple[str, str, dict[str, Any]]:
    """Line mode; ``st``: the file's ``fstat`` for the line index (``None``: a decompressed text, not indexed)."""
    start = args.get("start_line") or 1
    end = args.get("end_line")
    if end is not None and end < start:
        end = None  # docs/REFERENCE.md §3: end_line < start_line is ignored
    wide = textdecode.is_wide(codec)
    scale = textdecode.unit(codec) if wide else 1
    nl: Any = "\n" if wide else b"\n"
    nbytes: Callable[[Any], int] = (lambda s: len(s.encode(codec))) if wide else len
    sel = _Selector(start, end, limits, nl, nbytes)
    pos, key, size, known = bom, None, CHUNK, -1
    if not wide and st is not None:  # bytes: a checkpoint is a place to start counting (UTF-16/32 decode from the start)
        key = LineIndex.key(st)
        known = LINE_INDEX.frontier(key)
        hit = LINE_INDEX.before(key, start)
        if hit is not None:  # near the first line already: a small first read, the selection is often short
            pos, sel.line, nxt = hit
            size = (nxt - pos if nxt > pos else INDEX_STEP) + INDEX_STEP
    chunks = _text_chunks(rd, bom, codec, args["encoding"]) if wide else _byte_chunks(rd, pos, size)
    for chunk, byte_of in chunks:
        if st is not None and key is not None and not sel.selecting and pos + len(chunk) > known + INDEX_STEP:
            line, prev = sel.line, 0  # checkpoints every INDEX_STEP bytes of new ground
            for sub in range(0, min(len(chunk), st.st_size - pos), INDEX_STEP):
                line += chunk.count(nl, prev, sub)
                LINE_INDEX.add(key, pos + sub, line)
                prev = sub
        pos += len(chunk)
        sel.seen += len(chunk)
        sel.feed(chunk, byte_of, scale)
        if sel.done:
            break
    if not sel.done:
        total = sel.total_lines()
        if start > total and not (total == 0 and start == 1):
            raise ToolError(
                RANGE_OUT_OF_BOUNDS,
                f"start_line {start} is past the end of the file ({total} lines)",
                start_line=start,
                totalLines=total,
            )
    if wide:
        text, used = "".join(sel.parts), codec
    else:
        win = textdecode.decode_window(b"".join(sel.parts), codec, args["encoding"], final=True)
        text, used = win.text, win.codec
    returned = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    info: dict[str, Any] = {"linesReturned": returned, "lineRange": {"start": start, "end": start + returned - 1}}
    if detectors:
        text, info["redacted"] = redactread.redact_page(rd, text, max(sel.first_off, bom), used, bom, detectors)
    return text, used, info


def _warning(args: dict[str, Any], first: int, end: int, total: int | None, unpacked: bool = False) -> str:
    nxt: dict[str, Any] = {"path": args["path"], "offset": end}
    if args.get("encoding", "utf-8") != "utf-8":
        nxt["encoding"] = args["encoding"]
    if args.get("decompress") is False:
        nxt["decompress"] = False
    if args.get("privileged"):
        nxt["privileged"] = True
    unknown = "the decompressed text's size is known only at its end" if unpacked else "the file reports no size"
    of = f"{total} bytes total" if total is not None else f"an unknown total ({unknown})"
    call = json.dumps(nxt, ensure_ascii=False)
    return f"[WARNING: File truncated: showed bytes {first}-{end - 1} of {of}. To read more, call files/read with {call}]"


def _window(rd: Pread, size: int, args: dict[str, Any], limits: ReadLimits, codec: str, bom: int,
            head: bytes | None = None, unpacked: bool = False,
            detectors: tuple[str, ...] = ()) -> tuple[str, str, dict[str, Any]]:
    """The byte window ``offset``/``limit`` of the file, decoded. ``size``: the file's size as
    known (0: unknown). ``head``: the file's first bytes as :func:`read_fd` read them (at most
    :data:`BINARY_PROBE`; fewer: the whole file), used instead of a second read when they hold
    the window. ``unpacked``: the bytes are a decompressed text (for the warning's words).
    ``detectors``: the window is cut to whole lines and redacted (:mod:`mcpd.core.redactread`)."""
    offset = args.get("offset") or 0
    limit = args.get("limit")
    n = limit if limit is not None else limits.default_bytes
    cap = limits.response_cap
    start = max(offset, bom)
    n = max(0, n - (start - offset))  # the window counts file bytes, a stripped BOM included
    suggestion = f"read a smaller range: offset/limit with limit <= {cap}, or start_line/end_line"
    if n > cap and size - start > cap:
        raise too_large(size, limits, suggestion)  # known too large: refuse without reading
    want = min(n, cap + 1)
    if head is not None and (start + want + 1 <= len(head) or len(head) < BINARY_PROBE):
        got = head[start:start + want + 1]  # the head holds it (or all the file there was): no second read
    else:
        got = pread_full(rd, want + 1, start)
    if len(got) > cap and n > cap:
        raise too_large(max(size, start + len(got)), limits, suggestion)
    more = len(got) > want
    data = got[:want]
    win = textdecode.decode_window(
        data, codec, args["encoding"], final=not more, cut_start=start > bom, rel=start - bom
    )
    first, end = start + win.skip, start + win.skip + win.used
    text = win.text
    info: dict[str, Any] = {}
    cut = False
    if detectors:
        whole = not more and end >= start + len(data)
        text, first, cut_end = redactread.whole_lines(rd, text, first, end, win.codec, bom, whole)
        cut, end = cut_end < end, cut_end
        text, info["redacted"] = redactread.redact_page(rd, text, first, win.codec, bom, detectors)
    if (limit is None or cut) and (more or end < start + len(data)):
        seen = start + len(got)
        total = size if size >= seen else None
        sep = "\n" if text else ""  # always one added line break: the agent strips exactly it
        text = text + sep + _warning(args, first, end, total, unpacked)
    return text, win.codec, {"byteRange": {"start": first, "end": end}, **info}


def read_fd(fd: int, args: dict[str, Any], limits: ReadLimits, detectors: tuple[str, ...] = ()) -> dict[str, Any]:
    """Answer a ``files/read`` call from an open regular file (docs/REFERENCE.md §3).

    Args:
        fd: a descriptor open for reading (position is not used; only ``pread``).
        args: the normalised arguments of :func:`mcpd.core.tools.files_read.parse_args`: ``path``,
            ``start_line``/``end_line``/``offset``/``limit`` (int or None), ``encoding``
            (``utf-8``, ``ascii``, ``latin-1``, ``cp1252``, ``utf-16``, ``auto``, ``base64``),
            ``decompress`` (bool: a ``.gz``/``.xz``/``.bz2``/``.zst`` file is read as its text),
            ``include_metadata`` (bool).
        limits: ``default_bytes``, ``response_cap``, ``max_line_bytes`` (bytes), and the
            decompression bounds ``grep_file_bytes``, ``grep_max_ratio``.
        detectors: the secret detectors the answer goes through (docs/REFERENCE.md §3 "Redaction");
            with any, a base64 read is refused (bytes cannot be redacted), and so is a
            ``utf-16`` read of a file without a UTF-16 BOM (``PERMISSION_DENIED``).

    Returns:
        ``{"text": str}``, plus ``"metadata"`` (see :func:`mcpd.core.textmeta.describe`) when
        ``include_metadata``; for a line selection it adds ``linesReturned``, ``totalLines`` and
        ``lineRange``. A base64 read always has ``"metadata"`` (:func:`mcpd.core.rawread.base64_window`);
        a decompressed one's says ``compression`` and ``compressedSize``. With ``detectors``,
        ``"redacted"``: how many secrets of each kind were replaced.

    Raises:
        ToolError: ``BINARY_FILE``, ``ENCODING_ERROR``, ``FILE_TOO_LARGE``, ``LINE_TOO_LONG``,
            ``RANGE_OUT_OF_BOUNDS``, ``PERMISSION_DENIED`` (redaction, above), and
            :func:`mcpd.core.rawread.unpack_error`'s. ``OSError`` from
            reading propagates (the caller maps it).
    """
    st = os.fstat(fd)
    src = rawread.source(fd, st, args, limits)
    requested = args.get("encoding") or "utf-8"
    if requested == "base64" and detectors:
        raise ToolError(PERMISSION_DENIED, REDACTED_BYTES, path=args["path"], reason=REDACTED_BYTES)
    try:
        return _read(src, st, {**args, "encoding": requested}, limits, detectors)
    except grepread.Skipped as why:
        raise rawread.unpack_error(why, args["path"], src.kind, requested) from None


def _read(src: rawread.Source, st: os.stat_result, args: dict[str, Any], limits: ReadLimits,
          detectors: tuple[str, ...]) -> dict[str, Any]:
    requested = args["encoding"]
    head = b"" if requested == "base64" and not args.get("include_metadata") else \
        pread_full(src.rd, BINARY_PROBE, 0, src.size)  # (a base64 window needs no probe)
    if requested == "base64":
        text, info = rawread.base64_window(src, args, limits)
        used, bom = "base64", 0
    else:
        bom_codec, bom = textdecode.sniff_bom(head)
        if detectors and requested == "utf-16" and bom_codec is None:
            # any bytes without NULs (ASCII, UTF-8) read as UTF-16 are text no detector reads, and
            # encoded back give the bytes: a redacted caller reads UTF-16 by its BOM only
            raise ToolError(PERMISSION_DENIED, REDACTED_BYTES, path=args["path"], reason=REDACTED_BYTES)
        codec = bom_codec or ENCODINGS[requested]
        exempt = (bom_codec is not None and textdecode.is_wide(bom_codec)) or requested == "utf-16"
        if b"\0" in head and not exempt:
            raise ToolError(BINARY_FILE, "cannot read binary file")
        if args.get("start_line") is not None or args.get("end_line") is not None:
            text, used, info = _lines(src.rd, st if src.kind is None else None, args, limits, codec, bom, detectors)
        else:
            text, used, info = _window(src.rd, src.size, args, limits, codec, bom, head, src.kind is not None,
                                       detectors)
        if len(text) > limits.response_cap // 4 and len(text.encode("utf-8")) > limits.response_cap:
            raise too_large(src.size, limits, "read a smaller range")
    result: dict[str, Any] = {"text": text}
    redacted = info.pop("redacted", None)
    if detectors:
        result["redacted"] = redacted or {}
    if args.get("include_metadata") or requested == "base64":
        meta: dict[str, Any] = {}
        if args.get("include_metadata"):
            meta = textmeta.describe(src.rd, st, args["path"], head, used, bom, limits, counted=src.kind is not None)
            if "lineRange" in info:
                info["totalLines"] = meta["lines"]
            if detectors:  # a digest of the whole file would let a short secret be guessed offline
                meta["sha256"] = None
        if src.kind is not None:
            meta.update(compression=src.kind, compressedSize=st.st_size)
        result["metadata"] = {**meta, **info, **({"encoding": "base64"} if requested == "base64" else {}),
                              **rawread.identity(st)}
    return result
