"""The privileged route's safe opener (docs/REFERENCE.md §4.4).

The root helper resolves a granted path exactly once, to an ``O_PATH`` descriptor, and makes every
check on that descriptor, so a symlink swapped in at any moment can never make it read something
else, and nothing it will refuse is ever opened (an ``O_PATH`` open runs no device driver and does
not count as a FIFO's reader):

1. Resolve with ``openat2(O_PATH, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`` (a ``ctypes``
   syscall; Linux 5.6 or later, else every privileged open fails closed with ``INTERNAL_ERROR``).
   A symlink anywhere is ``PERMISSION_DENIED`` (reason ``symlink in path``).
2. ``fstat`` the descriptor: the kind the call needs (else ``NOT_A_REGULAR_FILE`` with its
   ``type``), a regular file with one hard link (else ``file has several hard links``).
3. ``readlink /proc/self/fd/N`` must equal the checked path (else ``path changed while opening``).
   The caller's ``judge`` sees the ``O_PATH`` descriptor too, and may refuse its object.
4. Only then is the same inode opened for reading, through ``/proc/self/fd/N`` (the magic link
   names the inode already checked, not a path), and its identity compared again.

When the grant covers ``/`` (``follow_symlinks=True``) symlinks are followed and step 3 is skipped:
anywhere the link leads is granted. :func:`fd_path` gives the real path for the audit record.

What an open descriptor *is* does not depend on the path that reached it: :func:`place` names its
object by the file system it lies on and its path from that file system's root (the mount's root
within the file system, from ``/proc/self/mountinfo``, plus the descriptor's path below the mount
point), so a symlink, a bind mount or a second mount of the same file system all give the same
place. Root judges the daemon's secrets and a process's ``/proc`` folder (:func:`of_a_process`) by
place, before anything is opened for reading, and so does the walker for every folder and entry of
a privileged list or find.

:func:`open_checked` with ``want="dir"`` is the walker's (:func:`mcpd.walker.main.open_checked_dir`,
not root's): the walker of privileged list/find opens its starting folder with it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import re
import stat
import sys
from collections.abc import Callable

from mcpd.helper.wire.errors import NOT_A_REGULAR_FILE, ToolError, denied, from_oserror, invalid_argument
from mcpd.helper.wire.filekind import kind as file_kind
from mcpd.helper.wire.openrules import CHANGED, NOT_DIR, NOT_REGULAR, SYMLINK, refusal
from mcpd.helper.wire.pathmatch import PathError, clean_path

PROCESS = "a process's own files are never served"  # /proc/PID, /proc/self, ... (:func:`of_a_process`)

_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(platform.machine())
_AT_FDCWD = -100
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_STATX_FLAGS, _STATX_MNT_ID = 0x100 | 0x800 | 0x1000, 0x1000  # AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | AT_EMPTY_PATH
Mounts = dict[int, tuple[str, str, str, str, str]]  # mount id -> (file system "major:minor", root, point, type, options)
Place = tuple[str, str, str]  # (file system "major:minor", path from its root, file system type)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _openat2(path: str, follow_symlinks: bool) -> int:
    """An ``O_PATH`` descriptor of ``path`` resolved by ``openat2``: no magic link, and no symlink
    at all unless ``follow_symlinks``. Raises ``OSError`` (``ELOOP``: a symlink refused)."""
    resolve = _RESOLVE_NO_MAGICLINKS if follow_symlinks else _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
    how = _OpenHow(os.O_PATH | os.O_CLOEXEC, 0, resolve)
    fd = _libc.syscall(
        ctypes.c_long(_SYS_OPENAT2 or -1),
        ctypes.c_int(_AT_FDCWD),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def fd_path(fd: int) -> str:
    """The kernel's current path of an open descriptor (``/proc/self/fd/N``).

    Raises:
        OSError: ``/proc`` is not mounted.
    """
    return os.readlink(f"/proc/self/fd/{fd}")


def mounts() -> Mounts:
    """The mounts of this process's mount namespace (``/proc/self/mountinfo``): mount id ->
    ``(file system "major:minor", the folder of that file system it shows, where it is mounted,
    file system type, its super options as the kernel escapes them)``. Raises ``OSError``."""
    with open("/proc/self/mountinfo", "rb") as f:
        rows = [line.rstrip(b"\n").split(b" ") for line in f]  # one space apart, even around an empty source
    return {int(r[0]): (r[2].decode(), _unescape(r[3]), _unescape(r[4]), r[(i := r.index(b"-")) + 1].decode(),
                        os.fsdecode(r[i + 3])) for r in rows}


def _unescape(field: bytes) -> str:  # mountinfo writes space, tab, newline and backslash as \ooo
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), field))


def layers(where: Place, table: Mounts) -> list[str]:
    """The folders stacked by the overlay file system a :func:`place` lies on (its ``lowerdir``,
    ``upperdir``, ``lowerdir+`` and ``datadir+`` super options, as the mounter gave them: maybe
    relative); ``[]`` for any other file system type."""
    opts = next((m[4] for m in table.values() if m[0] == where[0]), "") if where[2] == "overlay" else ""
    return [d for k, _, v in (o.partition("=") for o in opts.split(",")) if k in ("lowerdir", "upperdir", "lowerdir+", "datadir+")
            for d in _unescape(os.fsencode(v)).split(":") if d]


def mount_id(dfd: int, name: str = "") -> int:
    """The id of the mount that ``name`` in the folder ``dfd`` lies on (``""``: ``dfd`` itself):
    ``statx``'s ``stx_mnt_id``, following no symlink and triggering no automount. A name that is
    a mount point gives the mount there. Raises ``OSError``."""
    buf = ctypes.create_string_buffer(256)
    if _libc.statx(dfd, os.fsencode(name), _STATX_FLAGS, _STATX_MNT_ID, buf) != 0:
        raise OSError(ctypes.get_errno(), "statx failed", name)
    return int.from_bytes(buf.raw[144:152], sys.byteorder)  # struct statx: __u64 stx_mnt_id at 144


def place(fd: int, table: Mounts) -> Place:
    """Where the object of ``fd`` lies, whatever path reached it (module docstring): its file
    system, its path from that file system's root, the file system's type (``proc``, ``ext4``, ...).

    Args:
        fd: any descriptor of a file or folder (``O_PATH`` will do). table: :func:`mounts`.
    Raises:
        OSError, KeyError (its mount is not in ``table``), ValueError (the kernel's path of the
        descriptor is not below its mount point): the caller fails closed.
    """
    fs, root, point, kind, _ = table[mount_id(fd)]
    path, point = fd_path(fd), point.rstrip("/")
    if not (path + "/").startswith(point + "/"):
        raise ValueError(f"{path!r} is not below its mount point {point!r}")
    return fs, clean_path(root + "/" + path[len(point):]), kind


def place_of(path: str, table: Mounts) -> Place | None:
    """:func:`place` of what ``path`` names now (symlinks followed), or None when it cannot be reached."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            return place(fd, table)
        finally:
            os.close(fd)
    except (OSError, KeyError, ValueError):
        return None


def of_a_process(where: Place) -> bool:
    """Whether a :func:`place` lies on procfs in a process's folder (``PID``, ``self``,
    ``thread-self`` below the proc root) or below one: memory, environment, maps, descriptors,
    threads. What else procfs holds (``meminfo``, ``loadavg``, ``sys/...``) is the kernel's own."""
    top = where[1].split("/")[1]
    return where[2] == "proc" and (top.isdigit() or top in ("self", "thread-self"))


def _reopen(fd: int, st: os.stat_result, flags: int, path: str) -> int:
    new = os.open(f"/proc/self/fd/{fd}", flags | os.O_CLOEXEC | os.O_NOCTTY)
    now = os.fstat(new)
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        os.close(new)
        raise denied(path, CHANGED)
    return new


Judge = Callable[[int], "str | None"]  # O_PATH descriptor -> why its object is refused, or None


def open_checked(path: str, follow_symlinks: bool = False, want: str = "file",
                 judge: Judge | None = None) -> tuple[int, os.stat_result]:
    """Resolve and check a granted path, then open it the way the call needs (docs/REFERENCE.md §4.4, §4.5a).

    Args:
        path: an absolute path, cleaned lexically exactly as ``grants.decide`` cleans it.
        follow_symlinks: True only when the grant covers ``/``.
        want: ``"file"`` (a regular file, opened ``O_RDONLY | O_NONBLOCK``), ``"dir"`` (a
            directory, opened ``O_RDONLY | O_DIRECTORY``), or ``"any"`` (a regular file opened as
            for ``"file"``; anything else is returned as its ``O_PATH`` descriptor, never opened).
        judge: called with the ``O_PATH`` descriptor once it is checked (step 3): a reason it
            returns is a ``PERMISSION_DENIED`` with that reason; what it raises passes through.

    Returns:
        ``(fd, stat)``; the caller closes ``fd``.

    Raises:
        ToolError: ``PERMISSION_DENIED`` (reasons ``symlink in path``, ``file has several hard
            links``, ``path changed while opening``), ``NOT_A_REGULAR_FILE`` (``details.type``),
            ``FILE_NOT_FOUND``, ``INVALID_ARGUMENT`` for a relative path or NUL byte.
    """
    try:
        cleaned = clean_path(path)
    except PathError as exc:
        raise invalid_argument(str(exc), path=path if isinstance(path, str) else None) from None
    try:
        fd = _openat2(cleaned, follow_symlinks)
    except OSError as exc:
        raise (denied(cleaned, SYMLINK) if exc.errno == errno.ELOOP else from_oserror(exc, cleaned)) from None
    try:
        st = os.fstat(fd)
        if not follow_symlinks and fd_path(fd) != cleaned:
            raise denied(cleaned, CHANGED)
        if judge is not None and (why := judge(fd)) is not None:
            raise denied(cleaned, why)
        why = refusal(st.st_mode, st.st_nlink, want)  # the judgement `mcpd grants test` predicts with
        if why is not None:
            raise (ToolError(NOT_A_REGULAR_FILE, f"{why}: {cleaned}", path=cleaned, type=file_kind(st.st_mode))
                   if why in (NOT_DIR, NOT_REGULAR) else denied(cleaned, why))
        if want == "any" and not stat.S_ISREG(st.st_mode):
            fd, keep = -1, fd
            return keep, st
        return _reopen(fd, st, os.O_RDONLY | (os.O_DIRECTORY if want == "dir" else os.O_NONBLOCK), cleaned), st
    finally:
        if fd >= 0:
            os.close(fd)

