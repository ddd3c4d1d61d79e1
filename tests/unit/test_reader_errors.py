"""The ``OSError`` mappings (docs/REFERENCE.md §2.5): root's opener's and the readers', which adds
a symlink at the leaf, a directory and a FIFO or socket to it; on real failures where the kernel
can give them."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from mcpd.common.readerrors import reader_error
from mcpd.helper.wire.errors import (
    FILE_NOT_FOUND,
    INTERNAL_ERROR,
    NOT_A_REGULAR_FILE,
    PERMISSION_DENIED,
    from_oserror,
)


def failure(call: Callable[..., object], *args: object) -> OSError:
    with pytest.raises(OSError) as info:
        call(*args)
    return info.value


def test_the_readers_own_errors(tmp_path: Path) -> None:
    """What only a reader's open meets maps to the codes and details the readers answer."""
    (tmp_path / "link").symlink_to(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    loop = failure(os.open, str(tmp_path / "link"), os.O_RDONLY | os.O_NOFOLLOW)
    is_dir = failure(os.open, str(tmp_path), os.O_WRONLY)
    no_reader = failure(os.open, str(tmp_path / "fifo"), os.O_WRONLY | os.O_NONBLOCK)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock"))
        a_socket = failure(os.open, str(tmp_path / "sock"), os.O_RDONLY)
    assert [e.errno for e in (loop, is_dir, no_reader, a_socket)] == [errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ENXIO]
    err = reader_error(loop, "/p")
    assert (err.code, err.details) == (PERMISSION_DENIED, {"path": "/p", "reason": "symlink in path"})
    err = reader_error(is_dir, "/p")
    assert (err.code, err.details) == (NOT_A_REGULAR_FILE, {"path": "/p", "type": "directory"})
    for exc in (no_reader, a_socket):
        err = reader_error(exc, "/p")
        assert (err.code, err.details) == (NOT_A_REGULAR_FILE, {"path": "/p", "type": "fifo or socket"})


def test_the_rest_is_mapped_as_root_maps_it(tmp_path: Path) -> None:
    """Not found, not allowed and anything else: the readers answer exactly what root's opener does."""
    gone = failure(os.open, str(tmp_path / "nope"), os.O_RDONLY)
    for exc in (gone, PermissionError(errno.EACCES, "denied"), PermissionError(errno.EPERM, "denied"), OSError(errno.EIO, "io")):
        assert reader_error(exc, "/p").to_dict() == from_oserror(exc, "/p").to_dict()
    assert from_oserror(gone, "/p").code == FILE_NOT_FOUND
    assert from_oserror(PermissionError(errno.EACCES, "x"), "/p").details["reason"] == "the account may not read it"
    assert from_oserror(OSError(errno.EIO, "io"), "/p").to_dict() == {
        "code": INTERNAL_ERROR, "message": "cannot read /p: EIO", "details": {"path": "/p", "errno": "EIO"}}
