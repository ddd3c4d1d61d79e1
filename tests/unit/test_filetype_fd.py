"""files/filetype on the privileged content route: root's descriptor (O_RDONLY for a regular
file, O_PATH for anything else) stays in the policy process, which sends the caller's worker its
facts as data and, for a regular file only, a sealed memfd holding the sample
(:func:`mcpd.policy.opened.described`); the worker never opens a directory, never gets a
descriptor of the file, and reads at most ``SAMPLE_BYTES`` (docs/REFERENCE.md §4.1, §4.5a)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.common.config import SAMPLE_BYTES, ReadLimits
from mcpd.common.readerrors import reader_error
from mcpd.core import ops
from mcpd.core.fileopen import open_directory, open_regular
from mcpd.core.fileops import filetype as filetype_module
from mcpd.core.fileops.filetype import filetype
from mcpd.helper.wire.errors import FILE_NOT_FOUND, INTERNAL_ERROR, ToolError
from mcpd.policy.opened import SAMPLE_SEALS, described

NAMES = ("t.txt", "dir", "ln", "fifo", "sock")


def root_open(path: str) -> int:
    """What root's opener gives ``files/filetype``: the leaf checked with ``O_PATH | O_NOFOLLOW``
    and ``fstat``; only a regular file is opened for reading (through ``/proc/self/fd``)."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(fd)


def hand_over(path: str) -> tuple[dict[str, Any], int | None]:
    """What the policy process sends the worker for ``path``: facts and the sample memfd."""
    fd = root_open(path)
    try:
        return described(fd)
    finally:
        os.close(fd)


def no_dir(path: str) -> int:
    raise AssertionError(f"open_dir called for {path}")


def privileged_ctx(facts: dict[str, Any] | None, open_file: Callable[[str], int],
                   allow: Callable[[str], bool] | None = None) -> ops.OpContext:
    return ops.OpContext(limits=ReadLimits(), open_file=open_file, open_dir=no_dir, allow=allow, facts=facts)


def privileged(path: str, calls: list[str] | None = None) -> dict[str, Any]:
    """``filetype(path)`` in the worker's context as :func:`mcpd.worker.main.serve_granted` builds
    it: the facts, and ``open_file`` giving (a copy of) the frame's one descriptor, the memfd."""
    facts, memfd = hand_over(path)

    def open_file(p: str) -> int:
        if calls is not None:
            calls.append(p)
        if memfd is None or p != path:
            raise AssertionError(f"open_file({p}) without a sample")
        return os.dup(memfd)

    try:
        return filetype(path, privileged_ctx(facts, open_file))
    finally:
        if memfd is not None:
            os.close(memfd)


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "t.txt").write_bytes(b"one\r\ntwo\r\n")
    (tmp_path / "dir").mkdir()
    os.symlink("t.txt", tmp_path / "ln")
    os.mkfifo(tmp_path / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock"))
        yield tmp_path


def test_described_from_the_facts_when_the_caller_cannot_lstat(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unprivileged = ops.OpContext(limits=ReadLimits(), open_file=open_regular, open_dir=open_directory)
    expected = {name: filetype(str(tree / name), unprivileged) for name in NAMES}

    def hidden(name: str, dfd: int | None) -> tuple[os.stat_result, str | None]:
        raise PermissionError(13, "Permission denied", name)

    monkeypatch.setattr(filetype_module, "lstat_at", hidden)
    for name in NAMES:
        calls: list[str] = []
        before = len(os.listdir("/proc/self/fd"))
        assert privileged(str(tree / name), calls) == expected[name], name
        assert len(os.listdir("/proc/self/fd")) == before, name  # the sample's copy is closed by the op
        assert calls == ([str(tree / name)] if name == "t.txt" else []), name  # a sample for a regular file only
    assert privileged("/dev/zero")["mime"] == "inode/chardevice"


def test_the_same_answer_when_the_caller_can_lstat(tree: Path) -> None:
    unprivileged = ops.OpContext(limits=ReadLimits(), open_file=open_regular, open_dir=open_directory)
    for name in NAMES:
        assert privileged(str(tree / name)) == filetype(str(tree / name), unprivileged), name


def test_another_inode_than_the_callers_lstat_is_refused(tree: Path) -> None:
    facts, memfd = hand_over(str(tree / "t.txt"))
    assert memfd is not None
    try:
        ctx = privileged_ctx(dict(facts, ino=facts["ino"] + 1), lambda p: os.dup(memfd))
        with pytest.raises(ToolError) as exc:
            filetype(str(tree / "t.txt"), ctx)
        assert exc.value.details["reason"] == "path changed while opening"
    finally:
        os.close(memfd)


def test_missing_or_malformed_facts_are_an_internal_error(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def hidden(name: str, dfd: int | None) -> tuple[os.stat_result, str | None]:
        raise PermissionError(13, "Permission denied", name)

    monkeypatch.setattr(filetype_module, "lstat_at", hidden)
    for facts in ({}, {"mode": "0644", "size": 1, "dev": 1, "ino": 1}, {"mode": stat.S_IFREG, "size": True, "dev": 1, "ino": 1},
                  {"mode": stat.S_IFLNK, "size": 1, "dev": 1, "ino": 1, "target": 5}):
        with pytest.raises(ToolError) as exc:
            filetype(str(tree / "t.txt"), privileged_ctx(facts, no_dir))
        assert exc.value.code == INTERNAL_ERROR, facts


def test_grant_filter_and_opener_errors_still_apply(tree: Path) -> None:
    facts, memfd = hand_over(str(tree / "t.txt"))
    assert memfd is not None
    try:
        reply = ops.run({"id": 2, "op": "files/filetype", "args": {"path": str(tree / "t.txt")}},
                        privileged_ctx(facts, lambda p: os.dup(memfd), allow=lambda p: False))
    finally:
        os.close(memfd)
    assert reply["ok"] is False and reply["error"]["details"]["reason"] == "no grant covers this path"

    def missing(path: str) -> int:
        raise reader_error(FileNotFoundError(2, "gone"), path)

    with pytest.raises(ToolError) as exc:
        filetype(str(tree / "gone"), ops.OpContext(limits=ReadLimits(), open_file=missing, open_dir=no_dir))
    assert exc.value.code == FILE_NOT_FOUND


@pytest.mark.parametrize("size", [0, 10, SAMPLE_BYTES - 1, SAMPLE_BYTES, SAMPLE_BYTES + 1, 3 * SAMPLE_BYTES + 7])
def test_the_sample_memfd_is_sealed_and_holds_at_most_sample_bytes(tmp_path: Path, size: int) -> None:
    """The one descriptor a filetype worker gets for a regular file: a memfd (not the file), its
    first ``min(size, SAMPLE_BYTES)`` bytes and nothing more, which nobody can change or grow."""
    data = bytes(i % 251 for i in range(size))
    (tmp_path / "f").write_bytes(data)
    facts, memfd = hand_over(str(tmp_path / "f"))
    assert memfd is not None
    try:
        st = os.fstat(memfd)
        assert facts["size"] == size and facts["target"] is None and stat.S_ISREG(facts["mode"])
        assert (facts["dev"], facts["ino"]) != (st.st_dev, st.st_ino)  # not the file
        assert os.readlink(f"/proc/self/fd/{memfd}").startswith("/memfd:")
        assert st.st_size == min(size, SAMPLE_BYTES)
        assert os.pread(memfd, 4 * SAMPLE_BYTES, 0) == data[:SAMPLE_BYTES]
        assert fcntl.fcntl(memfd, fcntl.F_GET_SEALS) == SAMPLE_SEALS
        assert fcntl.fcntl(memfd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        changes = [lambda: os.pwrite(memfd, b"x", 0), lambda: os.ftruncate(memfd, SAMPLE_BYTES + 1),
                   lambda: fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)]
        if st.st_size:
            changes.append(lambda: os.ftruncate(memfd, st.st_size - 1))
        for change in changes:
            with pytest.raises(OSError) as err:
                change()
            assert err.value.errno == errno.EPERM
        reopened = os.open(f"/proc/self/fd/{memfd}", os.O_RDWR)  # a new description: the seals still hold
        try:
            with pytest.raises(OSError):
                os.write(reopened, b"x")
        finally:
            os.close(reopened)
    finally:
        os.close(memfd)


def test_nothing_but_facts_for_what_is_not_a_regular_file(tree: Path) -> None:
    for name, kind, target in (("dir", stat.S_ISDIR, None), ("ln", stat.S_ISLNK, "t.txt"), ("fifo", stat.S_ISFIFO, None),
                               ("sock", stat.S_ISSOCK, None)):
        facts, memfd = hand_over(str(tree / name))
        assert memfd is None and kind(facts["mode"]) and facts["target"] == target, name
        st = os.lstat(tree / name)
        assert (facts["dev"], facts["ino"], facts["size"]) == (st.st_dev, st.st_ino, st.st_size), name


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand descriptors to another account")
def test_worker_as_another_account_on_root_only_files() -> None:
    """The real shape: root opens, the policy's :func:`described` keeps root's descriptors, an
    unprivileged process (nobody) describes from the facts and samples; a FIFO's blocked writer
    stays blocked, and nothing nobody holds reaches the root-only file past its sample."""
    base = Path(tempfile.mkdtemp(prefix="mcpd-ftfd-"))
    writer = None
    try:
        secret = base / "secret"
        secret.mkdir(mode=0o700)
        (secret / "t.txt").write_bytes(b"x\n" * SAMPLE_BYTES)  # twice the sample
        os.mkfifo(secret / "fifo")
        os.symlink("t.txt", secret / "ln")
        paths = [str(secret / n) for n in ("t.txt", "fifo", "ln")] + ["/dev/zero"]
        writer = subprocess.Popen([sys.executable, "-c", f"open({str(secret / 'fifo')!r}, 'wb').write(b'x')"])
        handed = {p: hand_over(p) for p in paths}
        fds = {p: memfd for p, (_, memfd) in handed.items() if memfd is not None}
        assert list(fds) == [str(secret / "t.txt")]
        for fd in fds.values():
            os.set_inheritable(fd, True)
        code = (
            "import json, os, sys; from mcpd.common.config import ReadLimits; from mcpd.core import ops;"
            "from mcpd.core.fileops.filetype import filetype\n"
            "facts, fds = json.loads(sys.argv[1]), json.loads(sys.argv[2])\n"
            "def no_dir(p): raise AssertionError(p)\n"
            "out = {p: filetype(p, ops.OpContext(limits=ReadLimits(), open_file=lambda p: os.dup(fds[p]),"
            " open_dir=no_dir, facts=facts[p])) for p in facts}\n"
            "fd = fds[sys.argv[3]]\n"
            "out['reachable'] = len(os.pread(fd, 4 * 65536, 0))\n"
            "out['reopened'] = len(os.pread(os.open(f'/proc/self/fd/{fd}', os.O_RDONLY), 4 * 65536, 0))\n"
            "print(json.dumps(out))"
        )
        out = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-I", "-c", code,
             json.dumps({p: facts for p, (facts, _) in handed.items()}), json.dumps(fds), str(secret / "t.txt")],
            capture_output=True, text=True, timeout=60, check=True, pass_fds=list(fds.values()),
        ).stdout
        for fd in fds.values():
            os.close(fd)
        got = json.loads(out)
        assert got[str(secret / "t.txt")]["text"] is True and got[str(secret / "t.txt")]["size"] == 2 * SAMPLE_BYTES
        assert got[str(secret / "t.txt")]["sampled_bytes"] == SAMPLE_BYTES
        assert got["reachable"] == got["reopened"] == SAMPLE_BYTES  # the sample, never the rest of the file
        assert (got[str(secret / "fifo")]["mime"], got["/dev/zero"]["mime"]) == ("inode/fifo", "inode/chardevice")
        assert got[str(secret / "ln")]["target"] == "t.txt"
        time.sleep(0.2)
        assert writer.poll() is None  # nothing opened the FIFO for reading: the writer's open() still waits
    finally:
        if writer is not None:
            writer.kill()
            writer.wait()
        shutil.rmtree(base)
