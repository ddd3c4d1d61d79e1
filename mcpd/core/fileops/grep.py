"""``files/grep``: search file contents for a pattern, in one file or a tree (docs/REFERENCE.md §3 ``files/grep``).

The walk is :func:`mcpd.core.grepwalk.walk_files`, the reading :mod:`mcpd.core.grepread` (plain or
decompressed, with its limits), the matching :mod:`mcpd.core.grepscan` (RE2). This module runs
them for one call, on either route: :func:`op_grep` on the unprivileged route opens every file
itself, with the worker's account's rights; :func:`grep_granted` searches files root opened for a
privileged call, batch by batch in the walk's order (:mod:`mcpd.policy.grepcall`).

Each file of a tree is opened as ``O_PATH`` first, relative to its folder, and judged on that
descriptor: only a regular file is then opened for reading (through ``/proc/self/fd/N``, where
the kernel checks the account's rights), so a FIFO or a device met in a tree is never opened. A
file whose head holds a NUL byte is binary and skipped. A file named alone that cannot be searched
is an error (``BINARY_FILE``, ``FILE_TOO_LARGE``, ...), in a tree it is counted in
``files_skipped`` by reason and the first :data:`SKIPS_SHOWN` are named in ``skipped``.
"""

from __future__ import annotations

import os
import posixpath
import stat
import time
from collections.abc import Callable, Iterable
from typing import Any

from mcpd.common.config import ReadLimits
from mcpd.common.readerrors import reader_error
from mcpd.core import grepread, grepscan, redact
from mcpd.core.fileops import Context, progress_of
from mcpd.core.grepargs import cursor_of, encode_cursor, parse_grep_args
from mcpd.core.grepwalk import resume_at, skip_reason, walk_files
from mcpd.core.walk import clean
from mcpd.helper.wire.errors import (
    BINARY_FILE,
    FILE_TOO_LARGE,
    INTERNAL_ERROR,
    INVALID_ARGUMENT,
    NOT_A_REGULAR_FILE,
    ToolError,
)

__all__ = ["Search", "grep_granted", "op_grep"]

SKIPS_SHOWN = 100  # skipped files named in the answer (files_skipped counts them all)
PROGRESS_FILES, PROGRESS_BYTES = 1000, 64 * 1024 * 1024  # a progress call after this many files or bytes
SMALL_FILE = 4096  # bytes: a file up to this size is searched for a literal pattern with ``in``, not RE2
_CLOSE = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Search:
    """One call's state: the pattern, the budget, what was searched and skipped, and the answer."""

    def __init__(self, args: dict[str, Any], limits: ReadLimits, progress: Callable[[int, int | None, str], None]
                 | None = None, clock: Callable[[], float] = time.monotonic, redact: tuple[str, ...] = ()) -> None:
        self.args, self.clock, self.progress, self.redact = args, clock, progress, redact
        self.regex = grepscan.compile_pattern(args)
        self.literal = grepscan.literal(args)
        self.file_limit = min(args["max_file_bytes"] or limits.grep_file_bytes, limits.grep_file_bytes)
        total = min(args["max_total_bytes"] or limits.grep_total_bytes, limits.grep_total_bytes)
        self.max_ratio = limits.grep_max_ratio
        self.budget = grepscan.Budget(args["max_matches"], max(limits.response_cap // 4, 1), total,
                                      clock() + args["time_budget_seconds"])
        self.searched = self.matched = 0
        self.skipped: dict[str, int] = {}
        self.named: list[dict[str, str]] = []
        self.stop: grepscan.Stop | None = None
        self.stop_path = ""
        self._ticks, self._told_files, self._told_bytes = 0, 0, 0

    def skip(self, path: str, reason: str) -> None:
        """Count ``path`` as skipped for ``reason``."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if len(self.named) < SKIPS_SHOWN:
            self.named.append({"path": path, "reason": reason})

    def tick(self, path: str) -> bool:
        """Before each walk entry: True when the time is up (the walk then stops before ``path``)."""
        self._ticks += 1
        if self._ticks % 64 == 0 and self.clock() > self.budget.deadline:
            self.stop, self.stop_path = grepscan.Stop("time_budget", 0, 1), path
            return True
        return False

    def search(self, fd: int, path: str, name: str, offset: int = 0, line: int = 1, alone: bool = False,
               size: int | None = None) -> bool:
        """Search the open regular file ``fd`` from ``offset``/``line``; True when the call must stop.

        ``alone``: the file was named by ``path`` (its refusals are errors, see the module docstring);
        ``size``: its ``fstat`` size in bytes when the caller has it (else ``fd`` is asked).
        """
        kind = grepread.compression(name)
        late = "byte_limit" if self.budget.searched >= self.budget.total_bytes else \
            "time_budget" if self.clock() > self.budget.deadline else None
        if late is not None:
            self.stop, self.stop_path = grepscan.Stop(late, offset, line), path
            return True
        try:
            if size is None:
                size = os.fstat(fd).st_size
            if kind is None and size > self.file_limit:
                raise grepread.Skipped("too_large", f"the file has {size} bytes, over the per-file limit of "
                                       f"{self.file_limit}", size=size, limit=self.file_limit)
            first = b""  # a plain file searched from its start: its first piece, read once for the probe too
            if kind is None and offset == 0 and size > 0:
                first = os.pread(fd, min(grepread.READ, size), 0)
                binary = first.find(b"\0", 0, grepread.BINARY_PROBE) >= 0
            else:
                binary = b"\0" in grepread.head(fd, kind)
            if binary:
                raise grepread.Skipped("binary", "cannot read binary file")
            before = len(self.budget.matches)
            if self._passes(first, size):
                self.budget.searched += size
                stop = None
            else:
                secrets, skipped = self._redaction(fd, kind, offset)
                recount = None if kind is not None else lambda a, b: grepread.newlines(fd, a, b)
                stop = grepscan.scan(grepread.chunks(fd, kind, size, offset, self.file_limit, self.max_ratio,
                                                     skipped, first),
                                     self.regex, path, self.args, self.budget, offset, line, self.clock, secrets,
                                     recount)
        except grepread.Skipped as why:
            if alone:
                if why.reason == "binary":
                    raise ToolError(BINARY_FILE, why.message) from None
                if why.reason in ("too_large", "compression_ratio", "window_too_large"):
                    raise ToolError(FILE_TOO_LARGE, f"{path}: {why.message}", path=path, reason=why.reason,
                                    **why.details) from None
                if why.reason == "unsupported_compression":
                    raise ToolError(INVALID_ARGUMENT, f"{path}: {why.message}", path=path, reason=why.reason) from None
            self.skip(path, why.reason)
            return False
        except OSError as err:
            if alone:
                raise reader_error(err, path) from None
            self.skip(path, skip_reason(err))
            return False
        self.searched += 1
        self.matched += len(self.budget.matches) > before
        self._told()
        if stop is not None:
            self.stop, self.stop_path = stop, path
            return True
        return False

    def _passes(self, first: bytes, size: int) -> bool:
        """Whether the whole of a plain file, ``first`` (read from its start, ``size`` bytes by its
        ``fstat``), selects no line and so need not be scanned: what :func:`grepscan.scan` would find
        (one block, as the text ends with a newline), told by one search, with no redaction, no
        ``invert``, and no byte or time limit reached at its end (the scan's stop is then left to it)."""
        b = self.budget
        if len(first) != size or not first.endswith(b"\n") or self.redact or self.args["invert"] or \
                b.searched + size >= b.total_bytes or self.clock() > b.deadline:
            return False
        if self.literal is not None and size <= SMALL_FILE:  # a call into RE2 costs more than a small file's find
            return self.literal not in first
        return self.regex.search(first) is None

    def _redaction(self, fd: int, kind: str | None, offset: int) -> tuple[grepscan.Redaction | None,
                                                                         Callable[[bytes], None] | None]:
        """The redaction state of a search from ``offset`` (docs/REFERENCE.md §3 "Redaction"): whether
        it starts inside a private key block or inside a line (a cursor may name any offset: that
        line's rest is withheld), judged on the bytes before it; for a compressed file, on the text
        :func:`mcpd.core.grepread.chunks` skips (the second item, its callback)."""
        if not self.redact:
            return None, None
        secrets = grepscan.Redaction(self.redact)
        if offset <= 0:
            return secrets, None
        if kind is None:
            secrets.inside = redact.inside_at(fd, offset)
            secrets.mid_line = os.pread(fd, 1, offset - 1) != b"\n"
            return secrets, None
        tail = [b""]

        def before(data: bytes) -> None:
            tail[0] = (tail[0] + data)[-redact.LOOKBACK:]
            secrets.inside = "private-key" in self.redact and redact.still_inside(secrets.inside, tail[0])
            secrets.mid_line = not tail[0].endswith(b"\n")

        return secrets, before

    def _told(self) -> None:
        if self.progress is None:
            return
        if self.searched - self._told_files >= PROGRESS_FILES or self.budget.searched - self._told_bytes >= \
                PROGRESS_BYTES:
            self._told_files, self._told_bytes = self.searched, self.budget.searched
            self.progress(self.searched, None, f"{self.searched} files searched, {len(self.budget.matches)} matches")

    def result(self, root: str) -> dict[str, Any]:
        """The op's result (docs/REFERENCE.md §3 ``files/grep``)."""
        stop, cursor = self.stop, None
        if stop is not None:
            offset = None if stop.offset < 0 else stop.offset
            cursor = encode_cursor(self.args, self.stop_path, offset, stop.line)
        out = {"path": root, "matches": self.budget.matches, "files_searched": self.searched,
               "files_matched": self.matched, "bytes_searched": self.budget.searched,
               "files_skipped": dict(sorted(self.skipped.items())), "skipped": self.named,
               "truncated": stop is not None, "stopped": None if stop is None else stop.reason,
               "next_cursor": cursor}
        if self.redact:
            out["redacted"] = grepscan.shown_marks(self.budget.matches, self.redact, self.budget.own_marks)
        return out


def open_entry(dfd: int, name: str, follow: bool) -> tuple[int, int]:
    """Open entry ``name`` of folder ``dfd`` for reading when it is a regular file (module docstring):
    the descriptor and the file's size (bytes, by the ``fstat`` that judged it: the same file).

    Raises:
        grepread.Skipped: ``not_regular`` or ``symlink`` (never opened for reading).
        OSError: the kernel's refusal (``EACCES``: the account may not read it).
    """
    pfd = os.open(name, os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW), dir_fd=dfd)
    try:
        st = os.fstat(pfd)
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            raise grepread.Skipped("symlink", "symlink not followed")
        if not stat.S_ISREG(mode):
            raise grepread.Skipped("not_regular", "not a regular file")
        return os.open(f"/proc/self/fd/{pfd}", _CLOSE), st.st_size
    finally:
        os.close(pfd)


def _bad_cursor() -> ToolError:
    return ToolError(INVALID_ARGUMENT, "cursor belongs to another search: pass next_cursor back unchanged",
                     argument="cursor")


def op_grep(args: Any, ctx: Context) -> dict[str, Any]:
    """The ``files/grep`` op of the unprivileged route: validates ``args`` again, then searches.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` (arguments, pattern, cursor); the opener's error for the
            path; for a file named alone, what keeps it from being searched.
    """
    a = parse_grep_args(args)
    root = clean(a["path"])
    cursor = cursor_of(a)
    at = resume_at(root, cursor)
    if at is None:
        raise _bad_cursor()
    s = Search(a, ctx.limits, progress_of(ctx), redact=getattr(ctx, "redact", ()))  # type: ignore[attr-defined]
    try:
        rfd = ctx.open_dir(root)
    except ToolError as exc:
        if exc.code not in (INVALID_ARGUMENT, NOT_A_REGULAR_FILE):  # not a directory: one file
            raise
        if cursor is not None and (at or cursor["o"] is None):
            return s.result(root)
        fd = ctx.open_file(root)
        try:
            offset, line = (cursor["o"], cursor["n"]) if cursor else (0, 1)
            s.search(fd, root, posixpath.basename(root), offset, line, alone=True)
        finally:
            os.close(fd)
        return s.result(root)
    try:
        for dfd, name, path, resumed in walk_files(rfd, root, a, s.skip, s.tick, resume=at):
            if resumed and cursor is not None and cursor["o"] is None:
                continue
            start = (cursor["o"], cursor["n"]) if resumed and cursor is not None else (0, 1)
            try:
                fd, size = open_entry(dfd, name, a["follow_symlinks"])
            except grepread.Skipped as why:
                s.skip(path, why.reason)
                continue
            except OSError as err:
                s.skip(path, skip_reason(err))
                continue
            try:
                if s.search(fd, path, name, start[0], start[1], size=size):
                    break
            finally:
                os.close(fd)
    finally:
        os.close(rfd)
    return s.result(root)


def grep_granted(args: Any, limits: ReadLimits, batches: Iterable[tuple[dict[str, Any], list[int]]],
                 redact: tuple[str, ...] = ()) -> dict[str, Any]:
    """The privileged route's search, in the worker (docs/REFERENCE.md §4.1): validates ``args``
    again, then searches the files root opened, batch by batch, in the walk's order.

    ``batches``: ``(frame, fds)`` of :mod:`mcpd.policy.grepcall`'s worker frames (``files``: one
    path per descriptor; ``skips``: ``[path, reason]`` of files passed over; ``not_granted``: how
    many files the grant refused, counted, never named; the last one's ``walk``: the walker's
    result); it is left unfinished once the search stopped. A file that is the ``path`` itself is
    searched alone (its refusals are errors, as on the ordinary route). ``redact``: the call's
    detectors (docs/REFERENCE.md §3 "Redaction"), as :func:`op_grep`'s context carries them.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` (arguments); ``INTERNAL_ERROR`` for a malformed frame;
            for a file named alone, what keeps it from being searched.
    """
    a = parse_grep_args(args)
    root, cursor = clean(a["path"]), cursor_of(a)
    s = Search(a, limits, redact=redact)
    walked: Any = None
    for frame, fds in batches:
        files, skips, refused = frame.get("files"), frame.get("skips"), frame.get("not_granted")
        if not isinstance(files, list) or len(files) != len(fds) or not all(isinstance(p, str) for p in files) or \
                not isinstance(skips, list) or not isinstance(refused, int):
            raise ToolError(INTERNAL_ERROR, "malformed batch of granted files")
        for path, reason in skips:
            s.skip(str(path), str(reason))
        if refused:
            s.skipped["not_granted"] = s.skipped.get("not_granted", 0) + refused
        for path, fd in zip(files, fds, strict=True):
            offset, line = (cursor["o"], cursor["n"]) if cursor is not None and cursor["p"] == path and \
                cursor["o"] is not None else (0, 1)
            if s.search(fd, path, posixpath.basename(path), offset, line, alone=path == root):
                return s.result(root)
        walked = frame.get("walk")
    if isinstance(walked, dict) and walked.get("stopped") == "time_budget" and isinstance(walked.get("stop_path"), str):
        s.stop, s.stop_path = grepscan.Stop("time_budget", 0, 1), walked["stop_path"]
    return s.result(root)
