"""Opening files on the unprivileged route (docs/REFERENCE.md §3 "non-regular files", INTERNALS.md).

The kernel decides what the worker's account may read. Files are opened without blocking
(``O_NONBLOCK``: a FIFO with no writer opens at once), never become a controlling terminal
(``O_NOCTTY``) and are not inherited (``O_CLOEXEC``); the type is then checked with ``fstat`` on
the descriptor, so a FIFO, socket or device (``/dev/zero``) is refused before a byte is read.
A ``stat`` before opening also spares devices the side effects of being opened at all; the
``fstat`` after opening stays the authoritative check.
"""

from __future__ import annotations

import errno
import os
import stat

from mcpd.common.readerrors import reader_error
from mcpd.helper.wire.errors import INVALID_ARGUMENT, NOT_A_REGULAR_FILE, ToolError
from mcpd.helper.wire.filekind import kind  # the one file-type table (docs/REFERENCE.md §2.5 details.type)

_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def not_regular(path: str, mode: int) -> ToolError:
    """``NOT_A_REGULAR_FILE`` for ``path`` whose ``st_mode`` is ``mode`` (details: ``path``, ``type``)."""
    t = kind(mode)
    return ToolError(NOT_A_REGULAR_FILE, f"not a regular file: {path} is a {t}", path=path, type=t)


def _open(path: str, flags: int) -> int:
    try:
        return os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket (or a device without its driver)
            try:
                return_mode = os.stat(path).st_mode
            except OSError:
                raise reader_error(exc, path) from None
            raise not_regular(path, return_mode) from None
        raise reader_error(exc, path) from None


def open_regular(path: str) -> int:
    """Open ``path`` (absolute) for reading and return the descriptor of a regular file.

    The path is resolved once to an ``O_PATH`` descriptor and its type checked with ``fstat``;
    only a regular file is then opened, through ``/proc/self/fd/N`` (the same inode; the kernel
    checks the account's read permission there). A FIFO, socket or device is never opened: a
    FIFO's blocked writer stays blocked and no device driver runs (docs/REFERENCE.md §4.5a).

    Raises:
        ToolError: ``FILE_NOT_FOUND``, ``PERMISSION_DENIED`` (details ``path``, ``reason``),
            ``NOT_A_REGULAR_FILE`` (details ``path``, ``type``: ``directory|fifo|socket|char
            device|block device``).
    """
    try:
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise reader_error(exc, path) from None
    try:
        st = os.fstat(pfd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(path, st.st_mode)
        return os.open(f"/proc/self/fd/{pfd}", _FILE_FLAGS)
    except OSError as exc:
        raise reader_error(exc, path) from None
    finally:
        os.close(pfd)


def open_directory(path: str) -> int:
    """Open ``path`` (absolute) as a directory (``O_DIRECTORY``) and return the descriptor.

    Raises:
        ToolError: ``FILE_NOT_FOUND``, ``PERMISSION_DENIED``, or ``INVALID_ARGUMENT`` (details
            ``path``, ``type``) when it exists but is not a directory.
    """
    try:
        return os.open(path, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            try:
                mode = os.stat(path).st_mode
            except OSError:
                raise reader_error(exc, path) from None
            raise ToolError(INVALID_ARGUMENT, f"not a directory: {path}", path=path, type=kind(mode)) from None
        raise reader_error(exc, path) from None
