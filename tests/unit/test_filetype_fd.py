"""files/filetype on the privileged content route: the caller's worker runs the op on the one
descriptor the root helper opened (O_RDONLY for a regular file, O_PATH for anything else), never
opening a directory and never reading a non-regular file (DESIGN-v2.md, SPEC §4.5a)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpd.common.config import ReadLimits
from mcpd.common.errors import FILE_NOT_FOUND, ToolError, from_oserror
from mcpd.core import ops
from mcpd.core.fileopen import open_directory, open_regular
from mcpd.core.fileops import filetype as filetype_module
from mcpd.core.fileops.filetype import filetype

NAMES = ("t.txt", "dir", "ln", "fifo", "sock")


def hand_over(path: str) -> int:
    """What the helper passes: the leaf checked with ``O_PATH | O_NOFOLLOW`` and ``fstat``; only a
    regular file is opened for reading (through ``/proc/self/fd``)."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(fd)


def no_dir(path: str) -> int:
    raise AssertionError(f"open_dir called for {path}")


def privileged_ctx(open_file: object, allow: object = None) -> ops.OpContext:
    return ops.OpContext(limits=ReadLimits(), open_file=open_file, open_dir=no_dir, allow=allow)  # type: ignore[arg-type]


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "t.txt").write_bytes(b"one\r\ntwo\r\n")
    (tmp_path / "dir").mkdir()
    os.symlink("t.txt", tmp_path / "ln")
    os.mkfifo(tmp_path / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock"))
        yield tmp_path


def test_described_from_the_descriptor_when_the_caller_cannot_lstat(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unprivileged = ops.OpContext(limits=ReadLimits(), open_file=open_regular, open_dir=open_directory)
    expected = {name: filetype(str(tree / name), unprivileged) for name in NAMES}

    def hidden(name: str, dfd: int | None) -> tuple[os.stat_result, str | None]:
        raise PermissionError(13, "Permission denied", name)

    monkeypatch.setattr(filetype_module, "lstat_at", hidden)
    for name in NAMES:
        calls: list[str] = []

        def open_file(path: str) -> int:
            calls.append(path)
            return hand_over(path)

        before = len(os.listdir("/proc/self/fd"))
        assert filetype(str(tree / name), privileged_ctx(open_file)) == expected[name], name
        assert len(os.listdir("/proc/self/fd")) == before, name  # the handed-over descriptor is closed
        assert calls == [str(tree / name)], name  # exactly once
    assert filetype("/dev/zero", privileged_ctx(hand_over))["mime"] == "inode/chardevice"


def test_grant_filter_and_opener_errors_still_apply(tree: Path) -> None:
    reply = ops.run({"id": 2, "op": "files/filetype", "args": {"path": str(tree / "t.txt")}},
                    privileged_ctx(hand_over, allow=lambda p: False))
    assert reply["ok"] is False and reply["error"]["details"]["reason"] == "no grant covers this path"

    def missing(path: str) -> int:
        raise from_oserror(FileNotFoundError(2, "gone"), path)

    with pytest.raises(ToolError) as exc:
        filetype(str(tree / "gone"), privileged_ctx(missing))
    assert exc.value.code == FILE_NOT_FOUND


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand descriptors to another account")
def test_worker_as_another_account_on_root_only_files() -> None:
    """The real shape: root opens, an unprivileged process (nobody) describes; a FIFO's blocked
    writer stays blocked and /dev/zero is only ever an O_PATH descriptor."""
    base = Path(tempfile.mkdtemp(prefix="mcpd-ftfd-"))
    writer = None
    try:
        secret = base / "secret"
        secret.mkdir(mode=0o700)
        (secret / "t.txt").write_text("x\n")
        os.mkfifo(secret / "fifo")
        os.symlink("t.txt", secret / "ln")
        paths = [str(secret / n) for n in ("t.txt", "fifo", "ln")] + ["/dev/zero"]
        writer = subprocess.Popen([sys.executable, "-c", f"open({str(secret / 'fifo')!r}, 'wb').write(b'x')"])
        fds = {p: hand_over(p) for p in paths}
        for fd in fds.values():
            os.set_inheritable(fd, True)
        code = (
            "import json, os, sys; from mcpd.common.config import ReadLimits; from mcpd.core import ops;"
            "from mcpd.core.fileops.filetype import filetype\n"
            "fds = json.loads(sys.argv[1])\n"
            "def no_dir(p): raise AssertionError(p)\n"
            "ctx = ops.OpContext(limits=ReadLimits(), open_file=lambda p: os.dup(fds[p]), open_dir=no_dir)\n"
            "print(json.dumps({p: filetype(p, ctx) for p in fds}))"
        )
        out = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-I", "-c", code,
             json.dumps(fds)],
            capture_output=True, text=True, timeout=60, check=True, pass_fds=list(fds.values()),
        ).stdout
        for fd in fds.values():
            os.close(fd)
        got = json.loads(out)
        assert got[str(secret / "t.txt")]["text"] is True
        assert (got[str(secret / "fifo")]["mime"], got["/dev/zero"]["mime"]) == ("inode/fifo", "inode/chardevice")
        assert got[str(secret / "ln")]["target"] == "t.txt"
        time.sleep(0.2)
        assert writer.poll() is None  # an O_PATH descriptor is no reader: the writer's open() still waits
    finally:
        if writer is not None:
            writer.kill()
            writer.wait()
        shutil.rmtree(base)
