"""mcpd.helper.wire.filekind: the one file-type table, checked against real files of each type."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

from mcpd.common.typenames import TYPE_NAMES, type_name
from mcpd.helper.wire.filekind import kind


def test_every_type_has_both_names(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    (tmp_path / "l").symlink_to("f")
    os.mkfifo(tmp_path / "p")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "s"))
    try:
        cases = {"f": ("file", "regular file"), "d": ("dir", "directory"), "l": ("symlink", "symlink"),
                 "p": ("fifo", "fifo"), "s": ("socket", "socket")}
        for name, names in cases.items():
            mode = os.lstat(tmp_path / name).st_mode
            assert (type_name(mode), kind(mode)) == names, name
    finally:
        sock.close()
    dev = os.stat("/dev/null").st_mode
    assert (type_name(dev), kind(dev)) == ("char", "char device")
    blk = stat.S_IFBLK | 0o600
    assert (type_name(blk), kind(blk)) == ("block", "block device")
    assert type_name(0) == kind(0) == "unknown"
    assert TYPE_NAMES == ("file", "dir", "symlink", "fifo", "socket", "char", "block")
