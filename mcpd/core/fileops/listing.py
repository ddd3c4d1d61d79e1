"""``files/list``: a directory's entries, or one non-directory entry (issue 4).

Entries come from the directory descriptor returned by ``ctx.open_dir`` (``os.listdir(fd)`` and
``os.stat(name, dir_fd=fd, follow_symlinks=False)``): hidden names included, sorted by name
(bytewise order of the UTF-8 names), symlinks shown as links with their target, never followed.
On the privileged route every entry is filtered by ``ctx.allow`` before anything about it is
shown (see :mod:`mcpd.core.fileops`).
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterator
from typing import Any

from mcpd.common.errors import FILE_NOT_FOUND, INVALID_ARGUMENT, NOT_A_REGULAR_FILE, ToolError, from_oserror
from mcpd.core.fileops import Context, allowed, clean, describe, join, lstat_path, no_grant, type_name
from mcpd.core.tools import files_list
from mcpd.core.tools.files_list import DEFAULT_LIMIT, MAX_LIMIT

# what the directory opener raises for an existing entry that is not a directory
_NOT_A_DIR = (FILE_NOT_FOUND, NOT_A_REGULAR_FILE, INVALID_ARGUMENT)


def list_path(path: str, ctx: Context, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """List ``path``: a directory's entries, or the one entry ``path`` names.

    Args:
        path: absolute path of a directory (listed) or of any other entry (described alone;
            a symlink is described as a link, not followed).
        ctx: the op context (openers, optional ``allow`` filter).
        limit: at most this many entries are returned (1..10000).

    Returns:
        ``{"path", "kind": "directory" | "entry", "entries": [describe(...)], "total": int,
        "truncated": bool, "note": str | None}``; ``total`` counts the visible entries.

    Raises:
        ToolError: ``FILE_NOT_FOUND``, ``PERMISSION_DENIED`` (kernel refusal, or on the
            privileged route an entry outside the grant), or the opener's own error.
    """
    path = clean(path)
    try:
        dfd = ctx.open_dir(path)
    except ToolError as exc:
        if exc.code not in _NOT_A_DIR:
            raise
        return _single(path, ctx, exc)
    try:
        return _directory(path, dfd, ctx, limit)
    finally:
        os.close(dfd)


def _single(path: str, ctx: Context, original: ToolError) -> dict[str, Any]:
    """Describe one non-directory entry; re-raise ``original`` if it turns out to be a directory."""
    if not allowed(ctx, path):
        raise no_grant(path)
    st, target = lstat_path(ctx, path)
    if type_name(st.st_mode) == "dir":
        raise original
    name = path.rsplit("/", 1)[-1]
    note = f"{path} is a symlink to {target}; list the target to see its entries" if target else None
    return {
        "path": path,
        "kind": "entry",
        "entries": [describe(name, st, target)],
        "total": 1,
        "truncated": False,
        "note": note,
    }


def _directory(path: str, dfd: int, ctx: Context, limit: int) -> dict[str, Any]:
    """List the open directory ``dfd`` (whose path is ``path``), at most ``limit`` entries.

    Memory is proportional to ``limit``, not to the directory: the names are streamed, counted
    and only the ``limit`` smallest are kept.
    """
    total = 0

    def visible(it: Iterator[os.DirEntry[str]]) -> Iterator[str]:
        nonlocal total
        for entry in it:
            if allowed(ctx, join(path, entry.name)):
                total += 1
                yield entry.name

    try:
        with os.scandir(dfd) as it:
            names = heapq.nsmallest(limit, visible(it), key=os.fsencode)
    except OSError as err:
        raise from_oserror(err, path) from None
    entries: list[dict[str, object]] = []
    for name in names:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            target = os.readlink(name, dir_fd=dfd) if type_name(st.st_mode) == "symlink" else None
        except FileNotFoundError:
            continue  # removed since it was listed
        except OSError as err:
            raise from_oserror(err, join(path, name)) from None
        entries.append(describe(name, st, target))
    truncated = total > limit
    note = None
    if truncated:
        note = (
            f"showing the first {limit} of {total} entries (sorted by name); "
            f"{total - limit} were left out: call again with a larger limit (max {MAX_LIMIT}) "
            "or use files/find with a name pattern"
        )
    return {
        "path": path,
        "kind": "directory",
        "entries": entries,
        "total": total,
        "truncated": truncated,
        "note": note,
    }


def op_list(args: Any, ctx: Context) -> dict[str, Any]:
    """The ``files/list`` op handler: validates ``args`` again (the op trusts no caller).

    Raises:
        ToolError: ``INVALID_ARGUMENT`` from ``files_list.parse_args``, or :func:`list_path`'s.
    """
    a = files_list.parse_args(args)
    return list_path(a["path"], ctx, a["limit"])
