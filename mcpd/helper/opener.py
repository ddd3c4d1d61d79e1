"""The privileged route's safe opener (SPEC §4.4).

The root helper's child opens a granted path exactly once and makes every check on the open
descriptor, so a symlink swapped in at any moment can never make it read something else:

1. Open with ``openat2(RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`` (a ``ctypes`` syscall) when
   the kernel has it; otherwise walk the path from ``/`` one component at a time, each parent with
   ``O_DIRECTORY | O_NOFOLLOW`` relative to the previous descriptor and the leaf with
   ``O_NOFOLLOW | O_NONBLOCK``. A symlink anywhere fails with ``ELOOP`` → ``PERMISSION_DENIED``
   (reason ``symlink in path``). The leaf is opened ``O_NONBLOCK`` so a FIFO never blocks.
2. ``fstat`` the descriptor: a regular file (else ``NOT_A_REGULAR_FILE`` with its ``type``) with one
   hard link (else ``file has several hard links``).
3. ``readlink /proc/self/fd/N`` must equal the checked path (else ``path changed while opening``).

When the grant covers ``/`` (``follow_symlinks=True``) symlinks are followed and step 3 is skipped:
anywhere the link leads is granted. :func:`fd_path` gives the real path for the audit record.

:func:`open_checked` and :func:`open_checked_dir` have the signatures of ``mcpd/fileopen.py``'s
``open_regular``/``open_directory`` so the ops core takes either.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat

from mcpd.common.errors import NOT_A_REGULAR_FILE, PERMISSION_DENIED, ToolError, from_oserror, invalid_argument
from mcpd.core.fileopen import kind as file_kind
from mcpd.helper.pathmatch import PathError, clean_path, components

SYMLINK = "symlink in path"
HARD_LINKS = "file has several hard links"
CHANGED = "path changed while opening"

_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(platform.machine())
_AT_FDCWD = -100
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOCTTY


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _openat2(path: str, flags: int, resolve: int) -> int:
    how = _OpenHow(flags, 0, resolve)
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


def _probe_openat2() -> bool:
    if _SYS_OPENAT2 is None:
        return False
    try:
        os.close(_openat2("/", os.O_PATH | os.O_CLOEXEC, _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS))
    except OSError:
        return False  # ENOSYS on old kernels, EPERM under some seccomp filters
    return True


HAVE_OPENAT2 = _probe_openat2()


def _is_symlink(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _walk(path: str, leaf_flags: int) -> int:
    """Open ``path`` component by component from ``/``, never following a symlink."""
    parts = components(path)
    fd = os.open("/", _DIR_FLAGS)
    try:
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            flags = (leaf_flags if last else _DIR_FLAGS) | os.O_NOFOLLOW
            try:
                nfd = os.open(name, flags, dir_fd=fd)
            except OSError as exc:
                # O_DIRECTORY|O_NOFOLLOW on a symlink gives ENOTDIR: say what it really was
                if exc.errno == errno.ENOTDIR and _is_symlink(name, fd):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path) from None
                raise
            os.close(fd)
            fd = nfd
        if not parts:
            nfd = os.open(".", leaf_flags, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open(path: str, flags: int, follow_symlinks: bool) -> int:
    if follow_symlinks:
        if HAVE_OPENAT2:
            return _openat2(path, flags, _RESOLVE_NO_MAGICLINKS)
        return os.open(path, flags)
    if HAVE_OPENAT2:
        # RESOLVE_NO_SYMLINKS refuses a trailing symlink too (ELOOP); O_NOFOLLOW would make
        # O_DIRECTORY report ENOTDIR instead
        return _openat2(path, flags, _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    return _walk(path, flags)


def _denied(path: str, reason: str) -> ToolError:
    return ToolError(PERMISSION_DENIED, f"permission denied: {path}", path=path, reason=reason)


def fd_path(fd: int) -> str:
    """The kernel's current path of an open descriptor (``/proc/self/fd/N``), for audit records.

    Raises:
        OSError: ``/proc`` is not mounted.
    """
    return os.readlink(f"/proc/self/fd/{fd}")


def _checked(path: str, follow_symlinks: bool, flags: int, want_dir: bool) -> int:
    try:
        cleaned = clean_path(path)
    except PathError as exc:
        raise invalid_argument(str(exc), path=path if isinstance(path, str) else None) from None
    try:
        fd = _open(cleaned, flags, follow_symlinks)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _denied(cleaned, SYMLINK) from None
        if exc.errno == errno.ENXIO:
            raise ToolError(NOT_A_REGULAR_FILE, f"not a regular file: {cleaned}", path=cleaned, type="socket") from None
        if exc.errno == errno.ENOTDIR and want_dir:
            raise ToolError(NOT_A_REGULAR_FILE, f"not a directory: {cleaned}", path=cleaned, type="regular file") from None
        raise from_oserror(exc, cleaned) from None
    try:
        st = os.fstat(fd)
        if want_dir:
            if not stat.S_ISDIR(st.st_mode):
                raise ToolError(NOT_A_REGULAR_FILE, f"not a directory: {cleaned}", path=cleaned, type=file_kind(st.st_mode))
        else:
            if not stat.S_ISREG(st.st_mode):
                kind = file_kind(st.st_mode)
                raise ToolError(NOT_A_REGULAR_FILE, f"not a regular file: {cleaned}", path=cleaned, type=kind)
            if st.st_nlink == 0:
                raise _denied(cleaned, CHANGED)  # unlinked or replaced since it was opened
            if st.st_nlink != 1:
                raise _denied(cleaned, HARD_LINKS)
        if not follow_symlinks and fd_path(fd) != cleaned:
            raise _denied(cleaned, CHANGED)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_checked(path: str, follow_symlinks: bool = False) -> int:
    """Open a granted regular file for reading, safely (SPEC §4.4).

    Args:
        path: an absolute path; it is cleaned lexically exactly as ``grants.decide`` cleans it, and
            the descriptor's real path must equal the cleaned path.
        follow_symlinks: True only when the grant covers ``/`` (see ``grants.grant_covers_root``).

    Returns:
        A descriptor opened ``O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY``; the caller closes it.

    Raises:
        ToolError: ``PERMISSION_DENIED`` (reasons ``symlink in path``, ``file has several hard
            links``, ``path changed while opening``), ``NOT_A_REGULAR_FILE`` (``details.type``),
            ``FILE_NOT_FOUND``, ``INVALID_ARGUMENT`` for a relative path or NUL byte.
    """
    return _checked(path, follow_symlinks, _FILE_FLAGS, want_dir=False)


def open_checked_dir(path: str, follow_symlinks: bool = False) -> int:
    """Open a granted directory for ``files/list``/``files/find``, safely (SPEC §4.4).

    Same checks as :func:`open_checked` except the target must be a directory (hard links are
    not checked: a directory always has several).

    Raises:
        ToolError: as :func:`open_checked`; a non-directory is ``NOT_A_REGULAR_FILE``.
    """
    return _checked(path, follow_symlinks, _DIR_FLAGS, want_dir=True)
