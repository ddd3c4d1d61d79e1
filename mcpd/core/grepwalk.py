"""The files of a tree for ``files/grep``: the walk of :func:`walk_files`, beside the metadata walk
of :mod:`mcpd.core.walk` whose entry rules (kinds, filters, depth cap) it shares. Not loaded by
the walker of privileged list and find.
"""

from __future__ import annotations

import errno
import fnmatch
import os
from collections.abc import Callable, Iterator
from typing import Any

from mcpd.core.walk import DEPTH_CAP, Allow, Screen, entry_kind, shown_all

#: why ``walk_files`` passed over an entry (files/grep's ``files_skipped`` reasons)
_SKIPS = {errno.EACCES: "permission", errno.EPERM: "permission", errno.ENOENT: "vanished", errno.ENOTDIR: "vanished",
          errno.ELOOP: "symlink"}


def skip_reason(err: OSError) -> str:
    """The ``files_skipped`` reason of an ``OSError`` met on the way (``permission``, ``vanished``,
    ``symlink``; any other is ``error``)."""
    return _SKIPS.get(err.errno or 0, "error")


class _Halt(Exception):
    """A tick stopped :func:`walk_files`."""


def resume_at(root: str, cursor: dict[str, Any] | None) -> tuple[str, ...] | None:
    """The components below ``root`` of a decoded cursor's path (``()`` without a cursor, or for
    ``root`` itself); None when it lies elsewhere (the cursor is then refused)."""
    if cursor is None:
        return ()
    path = cursor["p"]
    if path == root:
        return ()
    prefix = root.rstrip("/") + "/"
    return tuple(path[len(prefix):].split("/")) if path.startswith(prefix) else None


def walk_files(rfd: int, root: str, args: dict[str, Any], skip: Callable[[str, str], None],
               tick: Callable[[str], bool], allow: Allow = None, screen: Screen = None,
               resume: tuple[str, ...] = (), refused: Callable[[str], None] | None = None,
               ) -> Iterator[tuple[int, str, str, bool]]:
    """The files of a tree for ``files/grep``: depth first in name order, like :func:`walk_find`.

    ``rfd``: the open folder ``root`` (the caller keeps and closes it). ``args``: parsed
    ``files/grep`` arguments (``include``/``exclude``: globs on the file's own name, case
    sensitive; ``max_depth``, 1 = ``root``'s own entries; ``follow_symlinks``: symlinks to files
    and folders are followed, a folder met again, by (st_dev, st_ino), is not entered). Yields
    ``(folder fd, name, path, resumed)`` for each regular file (by the listing's type; the caller
    opens it and checks again), ``resumed`` true for the file ``resume`` (the components of a
    cursor's path below ``root``) names; entries ordered before ``resume`` are passed over.
    ``skip(path, reason)`` hears of every entry passed over for a reason (``not_regular``,
    ``symlink``, ``loop``, ``too_deep``, or :func:`skip_reason`'s for a folder that could not be
    read); ``tick(path)`` is called before each entry and stops the walk when it returns True.
    ``allow`` and ``screen`` are the privileged route's filters (module docstring); an entry they
    refuse is passed over in silence, but ``refused(path)`` hears of each regular file (by the
    listing's type) that ``allow`` refused and the globs would have searched (``screen``'s are
    never told). Descriptors are closed when the iterator is closed.
    """
    follow, include, exclude, max_depth = bool(args["follow_symlinks"]), args["include"], args["exclude"], \
        args["max_depth"]
    visited = set[tuple[int, int]]()
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY | (0 if follow else os.O_NOFOLLOW)

    def wanted(name: str) -> bool:  # the include and exclude globs
        return not (include and not any(fnmatch.fnmatchcase(name, g) for g in include) or any(
            fnmatch.fnmatchcase(name, g) for g in exclude))

    globs = bool(include or exclude)  # (without globs every name is wanted: no call per entry)

    def level(fd: int, path: str, depth: int, at: tuple[str, ...]) -> Iterator[tuple[int, str, str, bool]]:
        if depth > DEPTH_CAP:
            return skip(path, "too_deep")
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) in visited:
                return skip(path, "loop")
            visited.add((st.st_dev, st.st_ino))
            with os.scandir(fd) as it:
                entries = sorted(it, key=lambda e: e.name)
            hidden = shown_all if screen is None else screen(fd)
        except OSError as err:
            return skip(path, skip_reason(err))
        prefix = path if path.endswith("/") else path + "/"  # (posixpath.join's, for a name without "/")
        for e in entries:
            here = at[0] if at else None
            if here is not None and e.name < here:
                continue
            inner = at[1:] if e.name == here else ()
            full = prefix + e.name
            if tick(full):
                raise _Halt
            if hidden(e.name):
                continue
            if allow is not None and not allow(full):
                if refused is not None and entry_kind(e, follow) == "file" and (not globs or wanted(e.name)):
                    refused(full)
                continue
            kind = entry_kind(e, follow)
            if kind == "dir":
                if max_depth is not None and depth >= max_depth:
                    continue
                try:
                    child = os.open(e.name, flags, dir_fd=fd)
                except OSError as err:
                    skip(full, skip_reason(err))
                    continue
                try:
                    yield from level(child, full, depth + 1, inner)
                finally:
                    os.close(child)
            elif kind == "file":
                if globs and not wanted(e.name):
                    continue
                yield fd, e.name, full, e.name == here and len(at) == 1
            else:
                skip(full, "symlink" if kind in ("symlink", "unknown") else "not_regular")

    try:
        yield from level(rfd, root, 1, resume)
    except _Halt:
        return
