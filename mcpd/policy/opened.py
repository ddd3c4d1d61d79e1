"""Descriptors root opened for privileged reads, kept for the next read of the same path.

A privileged read asks root to open the granted path (:mod:`mcpd.helper.opener`): one round trip
to root and about a fifth of the privileged route's cost. Reading the same file again (an agent
paging through a log) does not need a new open, only the same proof that the descriptor is what
the path names now. So the policy process keeps the read descriptors root gave it, by path (only
where no symlink may be followed, so the checked path is the real one), and before handing one
out again makes on it the checks root's opener makes on a new one (SPEC §4.4):

* ``fstat``: still a regular file with exactly one hard link (a hard link made since, or the file
  removed, and the descriptor is dropped);
* ``readlink /proc/self/fd/N``: the kernel's path of the descriptor is still exactly the checked
  path. A rename of the file or of any folder above it, a symlink or another file put in its
  place (the old one is then ``... (deleted)`` or elsewhere) all change it.

Any failure drops the descriptor and the call goes to root as a first read would. Nothing here
decides: the grant is decided for every call before a descriptor is looked up, and a descriptor is
only what root's opener already proved. The workers read with ``pread`` only, so the open file
description's offset, which every holder shares, is never used.
"""

from __future__ import annotations

import collections
import os
import stat
import threading

SIZE = 64  # descriptors kept, least recently used dropped first
#: what the kernel appends to the path of an unlinked file: the descriptor of ``d/f (deleted)``,
#: renamed to ``d/f``, hard-linked anywhere and unlinked from ``d/f``, reads ``d/f (deleted)`` again
DELETED = " (deleted)"


def still_at(fd: int, path: str) -> bool:
    """Whether the open ``fd`` is a regular file with one hard link whose kernel path is exactly
    ``path`` now (root's opener's checks, SPEC §4.4). A ``path`` ending in :data:`DELETED` never
    is: the kernel's path cannot tell that name from an unlinked file's. Never raises."""
    try:
        st = os.fstat(fd)
        return (stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and not path.endswith(DELETED)
                and os.readlink(f"/proc/self/fd/{fd}") == path)
    except OSError:
        return False


class OpenedFiles:
    """Thread-safe keeper of read descriptors by checked path (see the module docstring).

    Args:
        size: how many descriptors are kept at most.
    """

    def __init__(self, size: int = SIZE) -> None:
        self._size = size
        self._fds: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._lock = threading.Lock()

    def take(self, path: str) -> int | None:
        """A new descriptor (a ``dup``, the caller's to close) of the file kept for ``path`` if
        it still passes :func:`still_at`; else None (and a stale one is dropped)."""
        with self._lock:
            kept = self._fds.get(path)
            if kept is None:
                return None
            self._fds.move_to_end(path)
            fd = os.dup(kept)  # under the lock: nobody closes ``kept`` meanwhile
        if still_at(fd, path):
            return fd
        os.close(fd)
        with self._lock:
            if self._fds.get(path) == kept:
                del self._fds[path]
                os.close(kept)
        return None

    def keep(self, path: str, fd: int) -> None:
        """Keep a ``dup`` of ``fd`` (a regular file root opened at ``path`` without following a
        symlink) for the next read of ``path``; the caller keeps ``fd``."""
        if not stat.S_ISREG(os.fstat(fd).st_mode) or path.endswith(DELETED):
            return  # an O_PATH descriptor of something else (files/filetype), or a name still_at refuses
        mine = os.dup(fd)
        with self._lock:
            old = self._fds.pop(path, None)
            self._fds[path] = mine
            dropped = [old] if old is not None else []
            while len(self._fds) > self._size:
                dropped.append(self._fds.popitem(last=False)[1])
        for d in dropped:
            os.close(d)

    def clear(self) -> None:
        """Close every descriptor kept."""
        with self._lock:
            fds, self._fds = list(self._fds.values()), collections.OrderedDict()
        for fd in fds:
            os.close(fd)
