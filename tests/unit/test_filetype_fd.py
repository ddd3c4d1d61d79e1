"""files/filetype on the privileged content route: the worker runs the op on the one descriptor the
root helper opened (O_RDONLY for a regular file, O_PATH for anything else), never opening a
directory and never reading a non-regular file (DESIGN-v2.md, SPEC §4.5a)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcpd.common.config import ReadLimits
from mcpd.core import ops
from mcpd.core.fileopen import open_directory, open_regular
from mcpd.core.fileops.filetype import filetype


class HandedOver:
    """``open_file`` of the privileged route: the leaf checked with ``O_PATH | O_NOFOLLOW`` and
    ``fstat``; only a regular file is opened for reading (through ``/proc/self/fd``)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, path: str) -> int:
        self.calls.append(path)
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
        try:
            return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        finally:
            os.close(fd)


def no_dir(path: str) -> int:
    raise AssertionError(f"open_dir called for {path}")


def privileged_ctx(opener: HandedOver) -> ops.OpContext:
    return ops.OpContext(limits=ReadLimits(), open_file=opener, open_dir=no_dir, allow=lambda p: True)


def unprivileged_ctx() -> ops.OpContext:
    return ops.OpContext(limits=ReadLimits(), open_file=open_regular, open_dir=open_directory)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_same_answers_as_the_unprivileged_route(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_bytes(b"one\r\ntwo\r\n")
    (tmp_path / "dir").mkdir()
    os.symlink("t.txt", tmp_path / "ln")
    os.mkfifo(tmp_path / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    try:
        for name in ("t.txt", "dir", "ln", "fifo", "sock"):
            opener = HandedOver()
            before = open_fds()
            got = filetype(str(tmp_path / name), privileged_ctx(opener))
            assert open_fds() == before, name  # the handed-over descriptor is closed
            assert opener.calls == [str(tmp_path / name)]  # exactly once
            assert got == filetype(str(tmp_path / name), unprivileged_ctx()), name
    finally:
        sock.close()
    assert filetype(str(tmp_path / "ln"), privileged_ctx(HandedOver()))["target"] == "t.txt"


def test_devices_described_from_the_o_path_descriptor() -> None:
    got = filetype("/dev/zero", privileged_ctx(HandedOver()))
    assert (got["type"], got["mime"]) == ("char", "inode/chardevice")
    assert "text" not in got


def test_fifo_writer_stays_blocked(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'wb').write(b'x')"])
    try:
        time.sleep(0.2)
        reply = ops.run({"id": 1, "op": "files/filetype", "args": {"path": str(fifo)}}, privileged_ctx(HandedOver()))
        assert reply["ok"] is True and reply["result"]["mime"] == "inode/fifo"
        time.sleep(0.2)
        assert writer.poll() is None  # an O_PATH descriptor is no reader: open() in the writer still waits
    finally:
        writer.kill()
        writer.wait()


def test_grant_filter_still_applies(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("x\n")
    ctx = ops.OpContext(limits=ReadLimits(), open_file=HandedOver(), open_dir=no_dir, allow=lambda p: False)
    reply = ops.run({"id": 2, "op": "files/filetype", "args": {"path": str(tmp_path / "x")}}, ctx)
    assert reply["ok"] is False and reply["error"]["details"]["reason"] == "no grant covers this path"


@pytest.mark.parametrize("name", ["t.txt", "fifo"])
def test_opener_errors_pass_through(tmp_path: Path, name: str) -> None:
    from mcpd.common.errors import FILE_NOT_FOUND, ToolError, from_oserror

    def missing(path: str) -> int:
        raise from_oserror(FileNotFoundError(2, "gone"), path)

    ctx = ops.OpContext(limits=ReadLimits(), open_file=missing, open_dir=no_dir, allow=lambda p: True)
    with pytest.raises(ToolError) as exc:
        filetype(str(tmp_path / name), ctx)
    assert exc.value.code == FILE_NOT_FOUND
