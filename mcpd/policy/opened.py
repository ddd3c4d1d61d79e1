"""Descriptors root opened for privileged reads, kept for the next read of the same path.

A privileged read asks root to open the granted path (:mod:`mcpd.helper.wire.opener`): one round trip
to root and about a fifth of the privileged route's cost. Reading the same file again (an agent
paging through a log) does not need a new open, only the same proof that the descriptor is what
the path names now. So the policy process keeps the read descriptors root gave it, by principal
and path (only where no symlink may be followed, so the checked path is the real one), and before
handing one out again makes on it the checks root's opener makes on a new one (docs/REFERENCE.md §4.4):

* ``fstat``: still a regular file with exactly one hard link (a hard link made since, or the file
  removed, and the descriptor is dropped);
* ``readlink /proc/self/fd/N``: the kernel's path of the descriptor is still exactly the checked
  path. A rename of the file or of any folder above it, a symlink or another file put in its
  place (the old one is then ``... (deleted)`` or elsewhere) all change it.

Any failure drops the descriptor and the call goes to root as a first read would. Nothing here
decides: the grant is decided for every call before a descriptor is looked up, and a descriptor is
only what root's opener already proved. The workers read with ``pread`` only, so the open file
description's offset, which every holder shares, is never used; its status flags and ``flock``
locks are checked and released (see :class:`OpenedFiles`). Descriptors are closed 5 s after their
last use, and all of them when the mount table changes.

``files/filetype`` never hands root's descriptor to a worker: :func:`described` turns it into
facts sent as data and, for a regular file, a sealed memfd holding the sample the op judges.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import select
import stat
import threading
import time
from typing import Any

from mcpd.common.config import SAMPLE_BYTES

SIZE = 64  # descriptors kept, least recently used dropped first
IDLE_SECONDS = 5.0  # a descriptor not handed out for this long is closed (see OpenedFiles.sweep)
#: the seals of a sample memfd: its size and bytes are final, and so are the seals
SAMPLE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
#: what the kernel appends to the path of an unlinked file: the descriptor of ``d/f (deleted)``,
#: renamed to ``d/f``, hard-linked anywhere and unlinked from ``d/f``, reads ``d/f (deleted)`` again
DELETED = " (deleted)"


def still_at(fd: int, path: str) -> bool:
    """Whether the open ``fd`` is a regular file with one hard link whose kernel path is exactly
    ``path`` now (root's opener's checks, docs/REFERENCE.md §4.4). A ``path`` ending in :data:`DELETED` never
    is: the kernel's path cannot tell that name from an unlinked file's. Never raises."""
    try:
        st = os.fstat(fd)
        return (stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and not path.endswith(DELETED)
                and os.readlink(f"/proc/self/fd/{fd}") == path)
    except OSError:
        return False


def described(fd: int) -> tuple[dict[str, Any], int | None]:
    """What ``files/filetype`` needs of root's descriptor ``fd`` of a granted path, so that the
    descriptor itself never leaves this process (docs/REFERENCE.md §4.1: a call gets what its tool's grant
    covers; a filetype grant is no read grant, and an ``O_PATH`` descriptor could be reopened
    through ``/proc/self/fd`` past the folders above the file).

    Copies, never parses: the bytes are read with ``pread`` (root's descriptor's shared offset is
    never used) and written to the memfd as they are, at most :data:`SAMPLE_BYTES` of them.

    Args:
        fd: a descriptor root's opener gave (``O_RDONLY`` for a regular file, ``O_PATH`` else);
            the caller keeps and closes it.

    Returns:
        ``(facts, memfd)``: ``facts`` is ``{"mode": st_mode, "size": bytes, "dev", "ino",
        "target": a symlink's target or None}`` from ``fstat`` (and ``readlinkat(fd, "")``);
        ``memfd`` is None unless the file is regular, else a new ``memfd`` (close-on-exec, the
        caller's to close) holding the file's first ``min(size, SAMPLE_BYTES)`` bytes, sealed with
        :data:`SAMPLE_SEALS`.

    Raises:
        OSError: from ``fstat``, ``readlinkat``, ``pread`` or the memfd.
    """
    st = os.fstat(fd)
    target = os.readlink("", dir_fd=fd) if stat.S_ISLNK(st.st_mode) else None  # readlinkat(fd, "")
    facts = {"mode": st.st_mode, "size": st.st_size, "dev": st.st_dev, "ino": st.st_ino, "target": target}
    if not stat.S_ISREG(st.st_mode):
        return facts, None
    memfd = os.memfd_create("mcpd-filetype-sample", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        got = 0
        while got < SAMPLE_BYTES and (chunk := os.pread(fd, SAMPLE_BYTES - got, got)):
            done = 0
            while done < len(chunk):
                done += os.pwrite(memfd, chunk[done:], got + done)
            got += done
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, SAMPLE_SEALS)
    except BaseException:
        os.close(memfd)
        raise
    return facts, memfd


class OpenedFiles:
    """Thread-safe keeper of read descriptors by principal and checked path (see the module
    docstring).

    A descriptor is kept per principal: the workers it is handed to share its open file
    description (status flags, ``flock`` locks), so what one principal's worker (maybe
    compromised) does to its copy never reaches another principal's read. Before a descriptor is
    handed out again its status flags must be the ones root's opener set (else it is dropped)
    and any ``flock`` a holder left on it is released. Nothing is kept while the mount table
    cannot be watched; when it changes (a file system mounted over a kept file's folder hides the
    file without changing its kernel path), everything kept is dropped.

    Args:
        size: how many descriptors are kept at most.
    """

    def __init__(self, size: int = SIZE) -> None:
        self._size = size
        #: (principal, path) -> (fd, status flags when kept, last handed out)
        self._fds: collections.OrderedDict[tuple[str, str], tuple[int, int, float]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._mounts = _watch_mounts()

    def _drop_if_mounts_changed(self) -> bool:
        """Whether nothing may be handed out: the mount table cannot be watched, or it changed
        since last asked (then everything kept is dropped, and the watch re-armed, at once)."""
        if self._mounts < 0:
            return True
        if not select.select([], [], [self._mounts], 0)[2]:  # POLLPRI: the table changed
            return False
        with self._lock:
            dropped = [fd for fd, _, _ in self._fds.values()]
            self._fds.clear()
            os.lseek(self._mounts, 0, os.SEEK_SET)  # reading it again re-arms the event
            while os.read(self._mounts, 65536):
                pass
        for fd in dropped:
            os.close(fd)
        return True

    def take(self, path: str, owner: str) -> int | None:
        """A new descriptor (a ``dup``, the caller's to close) of the file kept for ``owner``'s
        reads of ``path`` if it still passes :func:`still_at` with the status flags it was kept
        with; else None (and a stale one is dropped)."""
        if self._drop_if_mounts_changed():
            return None
        key = (owner, path)
        with self._lock:
            kept = self._fds.get(key)
            if kept is None:
                return None
            self._fds[key] = (kept[0], kept[1], time.monotonic())
            self._fds.move_to_end(key)
            fd = os.dup(kept[0])  # under the lock: nobody closes it meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)  # a lock a holder left on the shared description
            ok = fcntl.fcntl(fd, fcntl.F_GETFL) == kept[1] and still_at(fd, path)
        except OSError:
            ok = False
        if ok:
            return fd
        os.close(fd)
        with self._lock:
            if (now := self._fds.get(key)) is not None and now[0] == kept[0]:
                del self._fds[key]
                os.close(kept[0])
        return None

    def keep(self, path: str, owner: str, fd: int) -> None:
        """Keep a ``dup`` of ``fd`` (a regular file root opened at ``path`` without following a
        symlink) for ``owner``'s next read of ``path``; the caller keeps ``fd``. Never raises: a
        descriptor that cannot be kept is simply not."""
        try:
            if self._mounts < 0 or not stat.S_ISREG(os.fstat(fd).st_mode) or path.endswith(DELETED):
                return  # an O_PATH descriptor of something else (files/filetype), or a name still_at refuses
            flags, mine = fcntl.fcntl(fd, fcntl.F_GETFL), os.dup(fd)
        except OSError:
            return
        with self._lock:
            old = self._fds.pop((owner, path), None)
            self._fds[(owner, path)] = (mine, flags, time.monotonic())
            dropped = [old[0]] if old is not None else []
            while len(self._fds) > self._size:
                dropped.append(self._fds.popitem(last=False)[1][0])
        for d in dropped:
            os.close(d)

    def sweep(self, idle_seconds: float = IDLE_SECONDS) -> None:
        """Close the descriptors not handed out for ``idle_seconds``, and those whose path no
        longer names them (:func:`still_at`): a rotated or removed log's disk space, or a file
        system someone wants to unmount, is never held here for long. A ``flock`` a holder left
        on a kept one is released. The policy process calls it about twice a second."""
        now = time.monotonic()
        with self._lock:
            stale = [(k, fd) for k, (fd, _, used) in self._fds.items()
                     if now - used > idle_seconds or not still_at(fd, k[1])]
            for k, _ in stale:
                del self._fds[k]
            for fd, _, _ in self._fds.values():
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)  # a lock a holder left behind on the shared description
        for _, fd in stale:
            os.close(fd)

    def clear(self) -> None:
        """Close every descriptor kept."""
        self.sweep(-1.0)


def _watch_mounts() -> int:
    """``/proc/self/mounts`` opened and read once (the kernel then raises ``POLLPRI`` on it when
    the mount table changes), or -1 when it cannot be."""
    try:
        fd = os.open("/proc/self/mounts", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        os.close(fd)
        return -1
    return fd
