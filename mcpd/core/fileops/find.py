"""``files/find``: walk a tree from a directory descriptor (issue 4).

The walk is depth-first over directory descriptors: the root comes from ``ctx.open_dir``, each
subdirectory is opened relative to its parent with ``O_NOFOLLOW`` (or, when the caller asked for
``follow_symlinks`` on the unprivileged route, following a link and checking the result is a
directory). At most one descriptor per level is open. Every opened directory's
``(st_dev, st_ino)`` is remembered, so a symlink loop or a bind-mount cycle is reported once and
never walked again. A directory that cannot be opened or read is reported in ``errors`` and
skipped. The walk stops at ``max_results`` matches or when ``time_budget`` seconds have passed,
and says which.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Any

from mcpd.common.errors import INVALID_ARGUMENT, ToolError, from_oserror
from mcpd.core.fileops import Context, allowed, clean, close_quietly, join, progress_of, type_name
from mcpd.core.tools import files_find

PROGRESS_EVERY = 5000  # entries between two progress callbacks
MAX_ERRORS = 100  # errors kept in the answer (the count goes on)
DEPTH_CAP = 256  # hard limit on open directory descriptors per walk
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


@dataclass
class FindQuery:
    """What to look for (issue 4). ``max_depth``: levels below root (1 = root's entries)."""

    name: str | None = None
    type: str | None = None
    max_depth: int | None = None
    max_results: int = 1000
    time_budget: float = 10.0
    follow_symlinks: bool = False


@dataclass
class _Walk:
    """Mutable state of one walk."""

    query: FindQuery
    ctx: Context
    deadline: float
    matches: list[dict[str, str]] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    error_count: int = 0
    scanned: int = 0
    visited: set[tuple[int, int]] = field(default_factory=set)
    stopped: str | None = None

    def error(self, path: str, reason: str) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append({"path": path, "reason": reason})


def _reason(err: OSError) -> str:
    if err.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if err.errno == errno.ELOOP:
        return "symlink not followed"
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        return "vanished during the walk"
    return errno.errorcode.get(err.errno or 0, "EIO")


def find(root: str, ctx: Context, query: FindQuery) -> dict[str, Any]:
    """Find entries below ``root`` matching ``query``.

    Args:
        root: absolute path of the directory to search (opened with ``ctx.open_dir``).
        ctx: the op context; ``ctx.allow`` (privileged route) filters every entry shown and
            every directory entered; ``progress`` (optional) is called every
            :data:`PROGRESS_EVERY` entries with ``(entries_seen, None, message)``.
        query: name glob (per name, ``fnmatch.fnmatchcase``), type, depth, caps.

    Returns:
        ``{"root", "matches": [{"path", "type"}], "truncated": bool, "stopped": None |
        "max_results" | "time_budget", "scanned": int, "errors": [{"path", "reason"}],
        "error_count": int}``; matches are sorted by path, component by component.

    Raises:
        ToolError: the root cannot be opened (the opener's error), or ``follow_symlinks`` was
            asked on the privileged route (``INVALID_ARGUMENT``; SPEC §4.4 follows no symlink).
    """
    root = clean(root)
    if query.follow_symlinks and ctx.allow is not None:
        raise ToolError(INVALID_ARGUMENT, "follow_symlinks is not available on the privileged route")
    walk = _Walk(query, ctx, time.monotonic() + query.time_budget)
    rfd = ctx.open_dir(root)
    try:
        st = os.fstat(rfd)
    except OSError as err:
        os.close(rfd)
        raise from_oserror(err, root) from None
    walk.visited.add((st.st_dev, st.st_ino))
    stack: list[tuple[int, str, int, list[str]]] = []
    subdirs = _scan(walk, rfd, root, 1)
    stack.append((rfd, root, 1, subdirs))
    try:
        while stack and walk.stopped is None:
            fd, path, depth, pending = stack[-1]
            if time.monotonic() > walk.deadline:
                walk.stopped = "time_budget"
                break
            if not pending:
                os.close(fd)
                stack.pop()
                continue
            name = pending.pop()
            child = _open_child(walk, fd, join(path, name), name)
            if child is not None:
                stack.append((child, join(path, name), depth + 1, _scan(walk, child, join(path, name), depth + 1)))
    finally:
        for fd, *_ in stack:
            close_quietly(fd)
    walk.matches.sort(key=lambda m: m["path"].split("/"))
    return {
        "root": root,
        "matches": walk.matches,
        "truncated": walk.stopped is not None,
        "stopped": walk.stopped,
        "scanned": walk.scanned,
        "errors": walk.errors,
        "error_count": walk.error_count,
    }


def _entry_type(walk: _Walk, entry: os.DirEntry[str]) -> str:
    """The entry's type; with ``follow_symlinks`` a link reports its target's type."""
    try:
        if entry.is_symlink():
            if walk.query.follow_symlinks:
                try:
                    return type_name(entry.stat(follow_symlinks=True).st_mode)
                except OSError:
                    return "symlink"  # dangling
            return "symlink"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        if entry.is_file(follow_symlinks=False):
            return "file"
        return type_name(entry.stat(follow_symlinks=False).st_mode)
    except OSError:
        return "unknown"


def _scan(walk: _Walk, fd: int, path: str, depth: int) -> list[str]:
    """Record matches among ``fd``'s entries; return the names of subdirectories to enter."""
    q = walk.query
    descend = q.max_depth is None or depth < q.max_depth
    subdirs: list[str] = []
    progress = progress_of(walk.ctx)
    try:
        with os.scandir(fd) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as err:
        walk.error(path, _reason(err))
        return subdirs
    for entry in entries:
        walk.scanned += 1
        if walk.scanned % 256 == 0 and time.monotonic() > walk.deadline:
            walk.stopped = "time_budget"
            return []
        if progress is not None and walk.scanned % PROGRESS_EVERY == 0:
            progress(walk.scanned, None, f"{walk.scanned} entries scanned, {len(walk.matches)} matches")
        full = join(path, entry.name)
        if not allowed(walk.ctx, full):
            continue
        kind = _entry_type(walk, entry)
        if (q.name is None or fnmatch.fnmatchcase(entry.name, q.name)) and (q.type is None or q.type == kind):
            walk.matches.append({"path": full, "type": kind})
            if len(walk.matches) >= q.max_results:
                walk.stopped = "max_results"
                return []
        if descend and kind == "dir":
            subdirs.append(entry.name)
    subdirs.reverse()  # popped from the end: visit in name order
    if descend and depth >= DEPTH_CAP and subdirs:
        walk.error(path, f"deeper than {DEPTH_CAP} levels, not entered")
        return []
    return subdirs


def _open_child(walk: _Walk, parent_fd: int, path: str, name: str) -> int | None:
    """Open subdirectory ``name`` of ``parent_fd``; None (and an error entry) when it cannot be walked."""
    flags = _DIR_FLAGS if walk.query.follow_symlinks else _DIR_FLAGS | os.O_NOFOLLOW
    try:
        fd = os.open(name, flags, dir_fd=parent_fd)
    except OSError as err:
        walk.error(path, _reason(err))
        return None
    try:
        st = os.fstat(fd)
    except OSError as err:
        os.close(fd)
        walk.error(path, _reason(err))
        return None
    key = (st.st_dev, st.st_ino)
    if not stat.S_ISDIR(st.st_mode) or key in walk.visited:
        os.close(fd)
        if key in walk.visited:
            walk.error(path, "directory already visited (symlink loop or second link to it), not entered again")
        return None
    walk.visited.add(key)
    return fd


def op_find(args: Any, ctx: Context) -> dict[str, Any]:
    """The ``files/find`` op handler: validates ``args`` again (the op trusts no caller).

    Raises:
        ToolError: ``INVALID_ARGUMENT`` from ``files_find.parse_args``, or :func:`find`'s.
    """
    a = files_find.parse_args(args)
    query = FindQuery(
        name=a["name"],
        type=a["type"],
        max_depth=a["max_depth"],
        max_results=a["max_results"],
        time_budget=a["time_budget_seconds"],
        follow_symlinks=a["follow_symlinks"],
    )
    return find(a["root"], ctx, query)
