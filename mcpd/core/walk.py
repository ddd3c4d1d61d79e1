"""The one directory walker of ``files/list`` and ``files/find``, on both routes (docs/PRIVSEP.md).

The walker of privileged calls (:mod:`mcpd.walker`: not root, but CAP_DAC_READ_SEARCH) runs this
module, so it stays small, imports only the standard library and ``mcpd.common``, and is metadata only: names and ``lstat`` numbers, never a
byte of content, no user or group name lookups, no formatting (:mod:`mcpd.core.fileops` turns the
raw results into the tools' results, in the front or the worker). Results are JSON-serialisable.

Rules, the same on both routes:

* The named directory comes from the route's ``open_dir``; everything below it is reached
  relative to a descriptor (``os.scandir(fd)``, ``os.stat(name, dir_fd=fd,
  follow_symlinks=False)``, subdirectories ``os.open(name, O_NOFOLLOW, dir_fd=fd)``). A symlink
  is followed only by an unprivileged find asked for ``follow_symlinks``.
* ``allow`` (the grant filter, ``None`` on the unprivileged route) sees every entry before
  anything about it is kept: an entry it refuses is not shown, not even its name. Find enters a
  subdirectory only when ``allow`` covers it. The starting directory itself is not filtered (the
  policy process decided that the call may run); a single-entry list needs ``allow(path)``.
* ``screen`` (the privileged route's object rule, ``None`` on the unprivileged route) judges what
  was opened, not the path asked: given each directory's descriptor (the start, each one find
  enters, a single entry's parent), it returns which of its entries are never shown nor entered.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import heapq
import itertools
import os
import posixpath
import stat
import time
from collections.abc import Callable
from typing import Any

from mcpd.common.readerrors import reader_error
from mcpd.common.typenames import TYPE_NAMES, type_name  # the one file-type table
from mcpd.common.validate import check_bool, check_choice, check_int, check_number, check_object, check_path
from mcpd.helper.wire.errors import (
    FILE_NOT_FOUND,
    INVALID_ARGUMENT,
    NOT_A_REGULAR_FILE,
    PERMISSION_DENIED,
    ToolError,
    invalid_argument,
)

Opener = Callable[[str], int]  # absolute path -> descriptor of that directory, or raises ToolError
Allow = Callable[[str], bool] | None  # the grant filter: may this absolute path be shown (or entered)?
Screen = Callable[[int], Callable[[str], bool]] | None  # directory fd -> is this entry name hidden?

LIST_LIMIT, LIST_MAX = 1000, 10000  # files/list: default and largest ``limit`` (entries)
FIND_RESULTS, FIND_MAX, FIND_BUDGET, FIND_MAX_BUDGET, MAX_PATTERN = 1000, 10000, 10, 60, 1024  # files/find
# find: entries between progress calls, errors kept (error_count goes on), levels entered (one descriptor each)
PROGRESS_EVERY, MAX_ERRORS, DEPTH_CAP = 5000, 100, 256
_REASONS = {**errno.errorcode, errno.EACCES: "permission denied", errno.EPERM: "permission denied",  # find's errors
            errno.ENOENT: "vanished during the walk", errno.ENOTDIR: "vanished during the walk",
            errno.ELOOP: "symlink not followed"}


def clean(path: str) -> str:
    """``path`` without trailing slashes (``/var/log/`` -> ``/var/log``; ``/`` stays ``/``)."""
    return path.rstrip("/") or "/"


def no_grant(path: str) -> ToolError:
    """The docs/REFERENCE.md §4.1 refusal (``PERMISSION_DENIED``, reason ``no grant covers this path``)."""
    return ToolError(PERMISSION_DENIED, f"permission denied: {path}", path=path, reason="no grant covers this path")


def parse_list_args(args: Any) -> dict[str, Any]:
    """Validate ``files/list`` arguments (docs/REFERENCE.md §2.5; run by the front, the worker and the walker).

    Returns ``{"path": str, "limit": int, "privileged": bool}``.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` for a bad path, an unknown key, a limit outside 1..10000.
    """
    a = check_object(args, ("path", "limit", "privileged"))
    return {"path": check_path(a, "path"), "limit": check_int(a, "limit", LIST_LIMIT, 1, LIST_MAX),
            "privileged": check_bool(a, "privileged")}


def parse_find_args(args: Any) -> dict[str, Any]:
    """Validate ``files/find`` arguments (docs/REFERENCE.md §2.5; run by the front, the worker and the walker).

    Returns ``{"root": str, "name": str | None, "type": str | None, "max_depth": int | None,
    "max_results": int, "time_budget_seconds": float, "follow_symlinks": bool, "privileged": bool}``.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` for a bad root, glob, type or number, an unknown key, or
            ``follow_symlinks`` with ``privileged`` (docs/REFERENCE.md §4.4 follows no symlink).
    """
    a = check_object(args, ("root", "name", "type", "max_depth", "max_results", "time_budget_seconds",
                            "follow_symlinks", "privileged"))
    out = {"root": check_path(a, "root"), "name": a.get("name"),
           "type": check_choice(a, "type", TYPE_NAMES, None), "max_depth": check_int(a, "max_depth", None, 1, None),
           "max_results": check_int(a, "max_results", FIND_RESULTS, 1, FIND_MAX),
           "time_budget_seconds": check_number(a, "time_budget_seconds", FIND_BUDGET, 0, FIND_MAX_BUDGET),
           "follow_symlinks": check_bool(a, "follow_symlinks"), "privileged": check_bool(a, "privileged")}
    name = out["name"]
    if name is not None and (not isinstance(name, str) or not 0 < len(name) <= MAX_PATTERN or "\0" in name):
        raise invalid_argument(f"name must be a glob of 1 to {MAX_PATTERN} characters", argument="name")
    if out["follow_symlinks"] and out["privileged"]:
        raise invalid_argument("follow_symlinks is not available with privileged", argument="follow_symlinks")
    return out


def lstat_at(name: str, dfd: int | None) -> tuple[os.stat_result, str | None]:
    """``(lstat, symlink target or None)`` of ``name`` relative to ``dfd`` (None: ``name`` is a path
    the kernel resolves), never followed. Raises ``OSError``; a failing ``readlink`` only loses the target."""
    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    with contextlib.suppress(OSError):
        return st, (os.readlink(name, dir_fd=dfd) if stat.S_ISLNK(st.st_mode) else None)
    return st, None  # a link replaced since: shown without its target


def raw_entry(name: str, st: os.stat_result, target: str | None) -> dict[str, Any]:
    """``{"name", "type", "mode" (st_mode, type bits included), "size" (bytes), "uid", "gid",
    "nlink", "mtime_ns" (int)}`` plus ``"target"`` (text) for a symlink whose ``readlink`` worked."""
    entry = {"name": name, "type": type_name(st.st_mode), "mode": st.st_mode, "size": st.st_size, "uid": st.st_uid,
             "gid": st.st_gid, "nlink": st.st_nlink, "mtime_ns": st.st_mtime_ns}
    return entry if target is None else {**entry, "target": target}


def shown_all(name: str) -> bool:  # no screen: nothing hidden
    return False


def walk_list(args: dict[str, Any], open_dir: Opener, allow: Allow, screen: Screen = None) -> dict[str, Any]:
    """The ``files/list`` walk: a directory's entries, or the one entry ``args["path"]`` names.

    ``args``: parsed ``files/list`` arguments (``path`` absolute, ``limit`` entries); ``allow``,
    ``screen``: the privileged route's filters (module docstring).
    Returns ``{"path" (cleaned), "kind": "directory" | "entry", "entries": [raw_entry(...)],
    "total": int, "limit": int}``: the ``limit`` smallest names (bytewise), hidden ones included;
    ``total`` counts the entries ``allow`` lets through. Memory follows ``limit``, not the directory.

    Raises:
        ToolError: the opener's error, ``FILE_NOT_FOUND``, ``PERMISSION_DENIED`` (the kernel's, or
            a single entry outside the grant).
    """
    path, limit = clean(args["path"]), args["limit"]
    try:
        dfd = open_dir(path)
    except ToolError as exc:
        if exc.code not in (FILE_NOT_FOUND, NOT_A_REGULAR_FILE, INVALID_ARGUMENT):  # an opener's "not a directory"
            raise
        if allow is not None and not allow(path):
            raise no_grant(path) from None
        pfd = open_dir(posixpath.dirname(path)) if allow is not None else None  # else the kernel judges lstat(path)
        try:
            if pfd is not None and screen is not None and screen(pfd)(posixpath.basename(path)):
                raise no_grant(path)
            st, target = lstat_at(path if pfd is None else posixpath.basename(path), pfd)
        except OSError as err:
            raise reader_error(err, path) from None
        finally:
            if pfd is not None:
                os.close(pfd)
        if stat.S_ISDIR(st.st_mode):
            raise
        return {"path": path, "kind": "entry", "entries": [raw_entry(posixpath.basename(path), st, target)],
                "total": 1, "limit": limit}

    entries: list[dict[str, Any]] = []
    counter = itertools.count()
    try:
        hidden = shown_all if screen is None else screen(dfd)
        with os.scandir(dfd) as it:  # stream the names, keep the `limit` smallest; next(counter) counts those shown
            shown = (e.name for e in it if (allow is None or allow(posixpath.join(path, e.name))) and not hidden(e.name)
                     and next(counter) >= 0)
            for name in heapq.nsmallest(limit, shown, key=os.fsencode):
                with contextlib.suppress(FileNotFoundError):  # removed since it was listed
                    entries.append(raw_entry(name, *lstat_at(name, dfd)))
    except OSError as err:
        raise reader_error(err, path) from None
    finally:
        os.close(dfd)
    return {"path": path, "kind": "directory", "entries": entries, "total": next(counter), "limit": limit}


def entry_kind(e: os.DirEntry[str], follow: bool) -> str:
    """The entry's type, from the directory listing when it can; with ``follow``, a link's target's."""
    try:
        if e.is_dir(follow_symlinks=follow):
            return "dir"
        return "file" if e.is_file(follow_symlinks=follow) else type_name(e.stat(follow_symlinks=follow).st_mode)
    except OSError:
        return "symlink" if follow and e.is_symlink() else "unknown"  # a dangling or looping link; or gone since


def walk_find(args: dict[str, Any], open_dir: Opener, allow: Allow,
              progress: Callable[[int, int | None, str], None] | None = None, screen: Screen = None) -> dict[str, Any]:
    """The ``files/find`` walk: depth first in name order, one open descriptor per level, loops detected.

    ``args``: parsed ``files/find`` arguments (``root``; ``name``, a glob matched against each
    entry's own name with ``fnmatchcase``; ``type``; ``max_depth``, 1 = the root's entries;
    ``max_results``; ``time_budget_seconds``; ``follow_symlinks``). ``progress(entries seen, None,
    message)`` is called every :data:`PROGRESS_EVERY` entries; ``allow``, ``screen``: the
    privileged route's filters (module docstring).
    Returns ``{"root" (cleaned), "matches": [{"path", "type"}] (sorted component by component),
    "stopped": None | "max_results" | "time_budget", "scanned": int, "errors": [{"path",
    "reason"}] (at most :data:`MAX_ERRORS`), "error_count": int}``. A directory that cannot be
    opened or read, or was already visited, is an error and skipped.

    Raises:
        ToolError: the root's opener error; ``INVALID_ARGUMENT`` for ``follow_symlinks`` with an
            ``allow`` filter (docs/REFERENCE.md §4.4 follows no symlink on the privileged route).
    """
    root, follow, a = clean(args["root"]), bool(args["follow_symlinks"]), args
    if follow and allow is not None:
        raise ToolError(INVALID_ARGUMENT, "follow_symlinks is not available on the privileged route")
    out: dict[str, Any] = {"root": root, "matches": [], "stopped": None, "scanned": 0, "errors": [], "error_count": 0}
    deadline, matches, visited = time.monotonic() + a["time_budget_seconds"], out["matches"], set[tuple[int, int]]()
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY | (0 if follow else os.O_NOFOLLOW)

    def error(path: str, why: OSError | str) -> None:
        out["error_count"] += 1
        if len(out["errors"]) < MAX_ERRORS:
            reason = why if isinstance(why, str) else _REASONS.get(why.errno or 0, "EIO")
            out["errors"].append({"path": path, "reason": reason})

    def walk(fd: int, path: str, depth: int) -> None:  # preorder, in name order: matches come out sorted
        if depth > DEPTH_CAP:
            return error(path, f"deeper than {DEPTH_CAP} levels, not entered")
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) in visited:
                return error(path, "directory already visited (symlink loop or second link to it), not entered again")
            visited.add((st.st_dev, st.st_ino))
            with os.scandir(fd) as it:
                entries = sorted(it, key=lambda e: e.name)
            hidden = shown_all if screen is None else screen(fd)
        except OSError as err:
            return error(path, err)
        for e in entries:
            n = out["scanned"] = out["scanned"] + 1
            if n % 256 == 0 and time.monotonic() > deadline:
                out["stopped"] = "time_budget"
                return
            if progress is not None and n % PROGRESS_EVERY == 0:
                progress(n, None, f"{n} entries scanned, {len(matches)} matches")
            full = posixpath.join(path, e.name)
            if allow is not None and not allow(full) or hidden(e.name):
                continue
            kind = entry_kind(e, follow)
            if (a["name"] is None or fnmatch.fnmatchcase(e.name, a["name"])) and a["type"] in (None, kind):
                matches.append({"path": full, "type": kind})
                if len(matches) >= a["max_results"]:
                    out["stopped"] = "max_results"
                    return
            if kind != "dir" or (a["max_depth"] is not None and depth >= a["max_depth"]):
                continue
            try:
                child = os.open(e.name, flags, dir_fd=fd)
            except OSError as err:
                error(full, err)
                continue
            try:
                walk(child, full, depth + 1)
            finally:
                os.close(child)
            if out["stopped"] is not None:
                return

    rfd = open_dir(root)
    try:
        walk(rfd, root, 1)
    finally:
        os.close(rfd)
    return out
