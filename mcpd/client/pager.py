"""Whole files, byte-exact, through ``files/read`` pages: the engine of ``linuxctl get files``.

A single ``files/read`` answer is at most the server's response cap (10 MiB by default), and a call
without a range shows only the first 10 KiB, so a whole file is read as consecutive byte ranges
(``offset``/``limit`` pages of 1 MiB, which never carry a truncation warning):

* The first page asks for ``include_metadata``: it gives the file's size as the server saw it
  (``fstat`` at open), whether a byte-order mark was stripped, the codec used and the exact
  ``byteRange`` the text covers. A file over the response cap cannot have metadata (the server
  hashes it whole); its ``FILE_TOO_LARGE`` answer still names the size, and the BOM is then learnt
  from the first bytes' range in the truncation notice of one small call.
* Each page's text is encoded back with the codec the server decoded it with, which gives the
  file's own bytes (a decoder that accepted them round-trips exactly); the next page starts where
  those bytes end, so a character cut at a page edge is read whole by the next page.
* A file that is not text in the encoding asked for (``BINARY_FILE``, or ``ENCODING_ERROR`` on
  any page) is read on from where the text ended as bytes: ``encoding: base64`` pages, whose
  structured content gives the file's size, the next offset and the end of the file. Every
  page asks for ``decompress: false``: a ``.gz`` file is copied as its own bytes.
* Reading stops at the size seen first, so a file that grows while it is read still ends (a
  character that size cut in two is read whole); a file that reports no size (``/proc``) is read
  until an empty page. A file that shrank below the first size is an error, never a silent short
  copy.
* A file replaced or rewritten while read is ``FILE_CHANGED``, never a silent splice of two files:
  the first page's ``fileId`` (device and inode) and ``version`` (those, size and mtime) are
  compared with every base64 page's and, after the last text page, with one small base64 call's.
  Another ``fileId`` (a file renamed over the path) is an error; another ``version`` is one
  unless the file grew (an appended log). A rewrite in place that also grew it, or one that puts
  the size and mtime back, is not seen.
* A redacted answer (docs/REFERENCE.md §3 "Redaction", ``structuredContent.redacted``) is not the
  file's bytes: it is printed as the server gave it, and the next page starts where its truncation
  warning says the shown lines end (a line the page cut is then read by the next page), else after
  the whole window.

Errors are the client's exception family (:mod:`mcpd.client.errors`).
"""

from __future__ import annotations

import base64
import binascii
import codecs
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from mcpd.client.api import Client, text_of
from mcpd.client.errors import MCPClientError, ToolFailed

PAGE_BYTES = 1024 * 1024  # file bytes asked for per page: well under the 10 MiB default cap
MIN_PAGE_BYTES = 64 * 1024
UNPACKED_PAGE_BYTES = 6 * 1024 * 1024  # a decompressed text's pages: base64 of 6 MiB fits the 10 MiB cap
PROGRESS_BYTES = 8 * 1024 * 1024  # a copy this large shows progress on a terminal
DEFAULT_MAX_BYTES = 100 * 1024 * 1024

#: codec the server reports → the ``encoding`` argument that asks for it again on later pages
_REQUESTABLE = {"utf-8": "utf-8", "ascii": "ascii", "latin-1": "latin-1", "iso8859-1": "latin-1",
                "cp1252": "cp1252", "utf-16-le": "utf-16"}
_BOM_OF = {"utf-8": codecs.BOM_UTF8, "utf-16-le": codecs.BOM_UTF16_LE, "utf-16-be": codecs.BOM_UTF16_BE,
           "utf-32-le": codecs.BOM_UTF32_LE, "utf-32-be": codecs.BOM_UTF32_BE}
NOT_TEXT = frozenset({"BINARY_FILE", "ENCODING_ERROR"})  # answers after which the file is read as bytes
NOTICE = re.compile(r"\n?\[WARNING: File truncated: showed bytes (\d+)-(\d+) of [^\n]*\]\Z")

Progress = Callable[[int, int], None]


class FileTooBig(MCPClientError):
    """The file is larger than the caller's ``max_bytes`` (exit 1); ``size`` in bytes."""

    default_code = "FILE_TOO_BIG"

    def __init__(self, size: int, max_bytes: int) -> None:
        super().__init__(f"the file has {size} bytes, over --max-bytes {max_bytes}: raise --max-bytes, or read "
                         "a part with --offset/--limit or --start-line/--end-line")
        self.size = size


class Shrank(MCPClientError):
    """The file ended before the size first seen, or was replaced or rewritten while read (exit 1)."""

    default_code = "FILE_CHANGED"


Ident = tuple[str, Any, int]  # a page's (fileId, version, size): which file, as it was


def _ident(meta: dict[str, Any]) -> Ident | None:
    """The identity an answer's structured content gives (None from a server older than it)."""
    fid, size = meta.get("fileId"), meta.get("size")
    return (fid, meta.get("version"), size if isinstance(size, int) else 0) if isinstance(fid, str) else None


def _same_file(first: Ident | None, now: Ident | None) -> None:
    """Raise :class:`Shrank` when ``now`` is another file than ``first``, or the same one rewritten."""
    if first is None or now is None:
        return
    if now[0] != first[0]:
        raise Shrank("the file was replaced (another file renamed over its path) while it was read: the copy "
                     "mixes two files")
    if now[1] != first[1] and now[2] <= first[2]:
        raise Shrank("the file was rewritten while it was read: the copy mixes two versions of it")


async def _probe(client: Client, base: dict[str, Any]) -> Ident | None:
    """The file's identity now, from one 1-byte base64 call (None when the server cannot say)."""
    try:
        result = await client.call_tool("files/read", {**base, "encoding": "base64", "offset": 0, "limit": 1})
    except ToolFailed as exc:
        if exc.code == "FILE_NOT_FOUND":
            raise Shrank("the file was removed or renamed while it was read") from None
        return None
    return _ident(result.get("structuredContent") or {})


@dataclass
class Plan:
    """What the first page taught: ``size`` (bytes, 0 = unknown), ``codec``, ``bom`` bytes to
    print first, the ``encoding`` to request on later pages (None: cannot page), ``page`` bytes."""

    size: int
    codec: str
    bom: bytes
    encoding: str | None
    page: int
    ident: Ident | None = None


def _codec_name(codec: str) -> str:
    try:
        return codecs.lookup(codec).name
    except LookupError:
        return codec


def _is_too_large(exc: ToolFailed) -> bool:
    return exc.code == "FILE_TOO_LARGE"


def _unknown(exc: ToolFailed, argument: str) -> bool:
    """``exc`` is a server's refusal of ``argument`` itself (one older than it)."""
    return exc.code == "INVALID_ARGUMENT" and exc.details.get("argument") == argument


async def _first_page(client: Client, base: dict[str, Any], offset: int, page: int,
                      requested: str) -> tuple[Plan, bytes, int]:
    """The first page with metadata: ``(plan, bytes, end offset)``; falls back for files over the cap."""
    while True:
        try:
            result = await client.call_tool("files/read", {**base, "offset": offset, "limit": page,
                                                           "include_metadata": True})
            break
        except ToolFailed as exc:
            if not _is_too_large(exc):
                raise
            limit = exc.details.get("limit")
            if "include_metadata" in str(exc.details.get("suggestion", "")) or not isinstance(limit, int):
                return await _first_page_large(client, base, offset, page, requested, exc)
            if page <= MIN_PAGE_BYTES:
                raise
            page = max(MIN_PAGE_BYTES, min(page // 2, limit // 4))
    meta = result.get("structuredContent") or {}
    rng = meta.get("byteRange") or {}
    codec = _codec_name(str(meta.get("encoding") or "utf-8"))
    bom = _BOM_OF.get(codec, b"") if meta.get("bom") and offset == 0 else b""
    text = text_of(result)
    if "redacted" in meta:  # a redacted page (docs/REFERENCE.md §3 "Redaction"): its warning is no content
        text = NOTICE.sub("", text)
    data = bom + text.encode(codec)
    end = int(rng.get("end", offset + len(data)))
    encoding = requested if requested != "auto" else _REQUESTABLE.get(codec)
    if meta.get("bom"):
        encoding = requested if requested != "auto" else "utf-8"  # a BOM selects the codec again
    plan = Plan(int(meta.get("size") or 0), codec, bom, encoding, page, _ident(meta))
    return plan, data, end


async def _first_page_large(client: Client, base: dict[str, Any], offset: int, page: int, requested: str,
                            refused: ToolFailed) -> tuple[Plan, bytes, int]:
    """A file over the response cap: size from the refusal; BOM from the truncation notice of a
    small call at offset 0 (``showed bytes B-...`` where B is the BOM's length)."""
    size = refused.details.get("size")
    size = size if isinstance(size, int) and size > 0 else 0
    if requested == "auto":
        raise MCPClientError("--encoding auto needs the file's metadata, which a file over the server's "
                             "response cap has not: give the encoding (utf-8, latin-1, ...)", "USAGE_ERROR")
    codec = {"utf-16": "utf-16-le"}.get(requested, requested)
    bom = b""
    if offset == 0:
        head = text_of(await client.call_tool("files/read", {**base, "offset": 0}))
        m = NOTICE.search(head)
        skipped = int(m.group(1)) if m else 0
        if skipped == 3:
            codec, bom = "utf-8", codecs.BOM_UTF8
        elif skipped in (2, 4):
            raise MCPClientError("the file starts with a UTF-16/32 byte-order mark and is over the server's "
                                 "response cap: read it with --offset/--limit", "UNSUPPORTED")
        offset = skipped
    return Plan(size, _codec_name(codec), bom, requested, page), bom, offset


async def read_pages(client: Client, path: str, *, offset: int = 0, limit: int | None = None,
                     encoding: str = "utf-8", privileged: bool = False, max_bytes: int = DEFAULT_MAX_BYTES,
                     page_bytes: int = PAGE_BYTES, on_progress: Progress | None = None,
                     decompress: bool = False) -> AsyncIterator[bytes]:
    """Yield the bytes of ``path`` from ``offset`` (to the end, or ``limit`` bytes), page by page.

    Args:
        client: an initialised :class:`Client`.
        path: absolute path on the server. offset, limit: the byte range (``limit`` None = to the end).
        encoding: the ``encoding`` argument (``utf-8`` default; ``auto`` lets the server guess once).
        privileged: read through a grant (every page is a privileged call).
        max_bytes: refuse (:class:`FileTooBig`) a range larger than this many bytes.
        page_bytes: file bytes per call (halved when the server's cap is smaller).
        on_progress: called as ``(bytes done, total bytes or 0)`` after each page.
        decompress: a ``.gz``/``.xz``/``.bz2``/``.zst`` file's decompressed text instead of its
            bytes, read as base64 pages of :data:`UNPACKED_PAGE_BYTES` (each page decompresses
            again from the start: few large pages), to its end.

    Raises:
        FileTooBig, Shrank, ToolFailed (the server's codes), and the transport errors.
    """
    base: dict[str, Any] = {"path": path, "encoding": encoding, "decompress": decompress}
    if privileged:
        base["privileged"] = True
    if decompress:
        end = None if limit is None else offset + limit
        async for chunk in _byte_pages(client, base, offset, end, None, 0, max_bytes,
                                       max(page_bytes, UNPACKED_PAGE_BYTES), on_progress):
            yield chunk
        return
    first = min(page_bytes, limit) if limit is not None else page_bytes
    try:
        try:
            plan, data, pos = await _first_page(client, base, offset, first, encoding)
        except ToolFailed as exc:
            if not _unknown(exc, "decompress"):
                raise
            del base["decompress"]  # a server older than the argument decompresses nothing: the same bytes
            plan, data, pos = await _first_page(client, base, offset, first, encoding)
    except ToolFailed as exc:
        if exc.code not in NOT_TEXT:
            raise
        end = None if limit is None else offset + limit
        async for chunk in _byte_pages(client, base, offset, end, None, 0, max_bytes, page_bytes, on_progress):
            yield chunk
        return
    stop = plan.size if plan.size else None
    if limit is not None:
        stop = offset + limit if stop is None else min(stop, offset + limit)
    want = (stop - offset) if stop is not None else 0
    if want > max_bytes:
        raise FileTooBig(want, max_bytes)
    if plan.encoding is None and (stop is None or pos < stop):
        raise MCPClientError(f"the server guessed {plan.codec}, which cannot be asked for again page by "
                             "page: give --encoding", "UNSUPPORTED")
    first_id = plan.ident if plan.ident is not None else await _probe(client, base)
    done = len(data)
    if data:
        yield data
    base["encoding"] = plan.encoding or encoding
    page = plan.page
    first_size = plan.size if plan.size and stop == plan.size else None  # the end is the size first seen
    stretched = 0  # bytes read past the first size to finish a character it cut in two (at most 3)
    while stop is None or pos < stop:
        if on_progress is not None:
            on_progress(done, want)
        n = page if stop is None else min(page, stop - pos)
        try:
            result = await client.call_tool("files/read", {**base, "offset": pos, "limit": n})
        except ToolFailed as exc:
            if exc.code in NOT_TEXT:  # not text from here on: the rest as bytes
                async for chunk in _byte_pages(client, base, pos, stop, want, done, max_bytes, page, on_progress,
                                               first_id):
                    yield chunk
                return
            if not _is_too_large(exc) or page <= MIN_PAGE_BYTES:
                raise
            page = max(MIN_PAGE_BYTES, page // 2)
            continue
        text = text_of(result)
        if "redacted" in (result.get("structuredContent") or {}):
            # a redacted page: its text is not the file's bytes, and whole lines only; it covers the
            # bytes its warning names (a line it cut is withheld), else the whole window
            cut = NOTICE.search(text)
            if not cut and not text:
                break  # the end of the file
            text, nxt = (NOTICE.sub("", text), int(cut.group(2)) + 1) if cut else (text, pos + n)
            if nxt <= pos:  # no progress (cannot happen with a whole-line answer): stop rather than loop
                raise MCPClientError(f"a redacted page at byte {pos} made no progress: read the file by lines",
                                     "UNSUPPORTED")
            done += nxt - pos
            pos = nxt
            if text:
                yield text.encode(plan.codec)
            continue
        chunk = text.encode(plan.codec)
        if not chunk:
            if stop is None or (first_size is None and stop - pos < 4):
                break  # end of a file without a size, or --limit ends inside a character (left out)
            if first_size is not None and stop - pos + 1 <= 4 and stretched < 3:
                stretched, stop = stretched + 1, stop + 1  # one byte more, until the character is whole
                continue
            raise Shrank(f"the file ended at byte {pos}, before the {first_size or stop} bytes it had when "
                         "reading began: it was truncated or replaced while read")
        pos += len(chunk)
        done += len(chunk)
        if stop is None and done > max_bytes:
            raise FileTooBig(done, max_bytes)
        yield chunk
    _same_file(first_id, await _probe(client, base))
    if on_progress is not None:
        on_progress(done, want)



async def _byte_pages(client: Client, base: dict[str, Any], pos: int, stop: int | None, want: int | None,
                      done: int, max_bytes: int, page: int, on_progress: Progress | None,
                      first_id: Ident | None = None) -> AsyncIterator[bytes]:
    """The file's bytes from ``pos`` to ``stop`` (None: to its end) through ``encoding: base64``
    pages. ``want``: the bytes of the whole copy when known (None: learnt here from the first
    page's ``size``, the copy's ``stop`` too, and checked against ``max_bytes``); ``done``: bytes
    already yielded; ``first_id``: the identity of the copy's first page (None: this one's).

    Raises:
        FileTooBig, Shrank, ToolFailed, MCPClientError (an answer that is not base64).
    """
    args = {**base, "encoding": "base64"}
    start = pos
    while stop is None or pos < stop:
        if on_progress is not None and want is not None:
            on_progress(done, want)
        n = page if stop is None else min(page, stop - pos)
        try:
            result = await client.call_tool("files/read", {**args, "offset": pos, "limit": n})
        except ToolFailed as exc:
            if _unknown(exc, "encoding") or _unknown(exc, "decompress"):
                raise MCPClientError("the server cannot send a file's bytes (files/read encoding base64): it is "
                                     "older than this linuxctl; for a text file, give its --encoding",
                                     "UNSUPPORTED") from None
            if not _is_too_large(exc) or page <= MIN_PAGE_BYTES:
                raise
            page = max(MIN_PAGE_BYTES, page // 2)
            continue
        meta = result.get("structuredContent") or {}
        now = _ident(meta)
        first_id = now if first_id is None else first_id
        _same_file(first_id, now)
        if want is None:
            size = meta.get("size")
            if isinstance(size, int) and size > 0:
                stop = size if stop is None else min(stop, size)
            want = stop - start if stop is not None else 0
            if want > max_bytes:
                raise FileTooBig(want, max_bytes)
        try:
            chunk = base64.b64decode(text_of(result), validate=True)
        except (binascii.Error, ValueError):
            raise MCPClientError("the server's base64 answer does not decode", "PROTOCOL_ERROR") from None
        pos += len(chunk)
        done += len(chunk)
        if stop is None and done > max_bytes:
            raise FileTooBig(done, max_bytes)
        if chunk:
            yield chunk
        if meta.get("eof") is True or not chunk:
            if stop is not None and pos < stop:
                raise Shrank(f"the file ended at byte {pos}, before the {stop} bytes it had when reading "
                             "began: it was truncated or replaced while read")
            break
    if on_progress is not None and want is not None:
        on_progress(done, want)
