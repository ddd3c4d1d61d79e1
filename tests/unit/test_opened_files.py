"""The policy process's kept descriptors (:mod:`mcpd.policy.opened`): a descriptor root opened
for a privileged read is handed out again only while root's opener would accept it anew (docs/REFERENCE.md
§4.4): a regular file with one hard link whose kernel path is still exactly the checked path.

Each test plays the local user who changes the granted tree between two reads."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from mcpd.policy.opened import OpenedFiles, still_at


def open_kept(kept: OpenedFiles, path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # as root's opener hands it
    try:
        kept.keep(str(path), "alice", fd)
    finally:
        os.close(fd)


def read_all(fd: int) -> bytes:
    try:
        return os.pread(fd, 1 << 16, 0)
    finally:
        os.close(fd)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "app.log").write_bytes(b"first\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "app.log").write_bytes(b"OTHER SECRET\n")
    return tmp_path


def test_an_unchanged_file_is_handed_out_again_and_sees_appends(tree: Path) -> None:
    kept, path = OpenedFiles(), tree / "logs" / "app.log"
    open_kept(kept, path)
    assert read_all(kept.take(str(path), "alice")) == b"first\n"
    with open(path, "ab") as f:
        f.write(b"second\n")  # the same file, grown: still the same inode at the same path
    assert read_all(kept.take(str(path), "alice")) == b"first\nsecond\n"
    assert kept.take(str(tree / "logs" / "other.log"), "alice") is None


def _replace(tree: Path) -> None:
    new = tree / "logs" / ".new"
    new.write_bytes(b"replaced\n")
    os.rename(new, tree / "logs" / "app.log")


def _unlink(tree: Path) -> None:
    (tree / "logs" / "app.log").unlink()


def _rename_away(tree: Path) -> None:
    os.rename(tree / "logs" / "app.log", tree / "logs" / "app.log.1")  # log rotation


def _hard_link(tree: Path) -> None:
    os.link(tree / "logs" / "app.log", tree / "elsewhere")


def _folder_swapped_for_a_symlink(tree: Path) -> None:
    os.rename(tree / "logs", tree / "logs.old")
    os.symlink(tree / "other", tree / "logs")


def _folder_replaced(tree: Path) -> None:
    os.rename(tree / "logs", tree / "logs.old")
    (tree / "logs").mkdir()
    (tree / "logs" / "app.log").write_bytes(b"new folder\n")


def _symlink_over_the_file(tree: Path) -> None:
    os.symlink(tree / "other" / "app.log", tree / "logs" / ".link")
    os.rename(tree / "logs" / ".link", tree / "logs" / "app.log")


@pytest.mark.parametrize("change", [_replace, _unlink, _rename_away, _hard_link, _folder_swapped_for_a_symlink,
                                    _folder_replaced, _symlink_over_the_file])
def test_a_changed_path_drops_the_kept_descriptor(tree: Path, change: Callable[[Path], None]) -> None:
    kept, path = OpenedFiles(), tree / "logs" / "app.log"
    open_kept(kept, path)
    change(tree)
    assert kept.take(str(path), "alice") is None
    assert kept.take(str(path), "alice") is None  # dropped, not kept for later
    if not path.exists():
        return
    open_kept(kept, path)  # opened again as the test (following symlinks), kept
    fd = kept.take(str(path), "alice")
    if os.path.realpath(path) != str(path) or os.stat(path).st_nlink != 1:
        assert fd is None  # a descriptor that is not what the path names without links is never handed out
    else:
        assert read_all(fd) in (b"replaced\n", b"new folder\n")


def test_only_regular_files_are_kept(tree: Path) -> None:
    kept, fifo = OpenedFiles(), tree / "logs" / "fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_PATH | os.O_CLOEXEC)  # what root's opener gives files/filetype for it
    try:
        kept.keep(str(fifo), "alice", fd)
    finally:
        os.close(fd)
    assert kept.take(str(fifo), "alice") is None
    assert not still_at(-1, str(fifo))


def test_at_most_size_descriptors_are_kept_least_recently_used_first(tree: Path) -> None:
    kept = OpenedFiles(size=2)
    before = len(os.listdir("/proc/self/fd"))
    paths = []
    for i in range(5):
        p = tree / "logs" / f"f{i}"
        p.write_bytes(b"%d\n" % i)
        paths.append(p)
    open_kept(kept, paths[0])
    open_kept(kept, paths[1])
    os.close(kept.take(str(paths[0]), "alice"))  # used: paths[1] is now the least recently used
    open_kept(kept, paths[2])
    assert kept.take(str(paths[1]), "alice") is None
    assert read_all(kept.take(str(paths[0]), "alice")) == b"0\n" and read_all(kept.take(str(paths[2]), "alice")) == b"2\n"
    for p in paths[3:]:
        open_kept(kept, p)
    assert len(os.listdir("/proc/self/fd")) == before + 2
    kept.clear()
    assert len(os.listdir("/proc/self/fd")) == before


def test_threads_taking_keeping_and_changing_the_file_never_get_a_wrong_or_closed_descriptor(tree: Path) -> None:
    """Eight threads take and keep the same path while another replaces the file: every
    descriptor handed out reads one of the two contents whole, and none leaks (bounded: 4000
    takes per thread)."""
    kept, path = OpenedFiles(size=4), tree / "logs" / "app.log"
    path.write_bytes(b"A" * 100)
    before = len(os.listdir("/proc/self/fd"))
    stop, bad = threading.Event(), []

    def replacer() -> None:
        i = 0
        while not stop.is_set():
            new = tree / "logs" / f".n{i % 2}"
            new.write_bytes((b"A" if i % 2 else b"B") * 100)
            os.rename(new, path)
            i += 1

    def reader() -> None:
        for _ in range(4000):
            fd = kept.take(str(path), "alice")
            if fd is None:
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
                kept.keep(str(path), "alice", fd)
            data = read_all(fd)
            if data not in (b"A" * 100, b"B" * 100):
                bad.append(data)

    threads = [threading.Thread(target=reader) for _ in range(8)]
    swap = threading.Thread(target=replacer)
    swap.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stop.set()
    swap.join(timeout=10)
    assert bad == []
    kept.clear()
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_removed_or_idle_file_is_not_held_open(tree: Path) -> None:
    """A rotated and removed log must not keep its disk space because a descriptor of it is
    kept: the sweep the policy process runs twice a second closes it, and one not used for
    ``idle_seconds`` too."""
    kept, path, other = OpenedFiles(), tree / "logs" / "app.log", tree / "other" / "app.log"
    open_kept(kept, path)
    open_kept(kept, other)
    before = len(os.listdir("/proc/self/fd"))
    kept.sweep()
    assert len(os.listdir("/proc/self/fd")) == before  # both unchanged and recently used: kept
    os.rename(path, tree / "logs" / "app.log.1")
    os.unlink(tree / "logs" / "app.log.1")
    kept.sweep()
    assert len(os.listdir("/proc/self/fd")) == before - 1
    kept.sweep(idle_seconds=0.0)
    assert len(os.listdir("/proc/self/fd")) == before - 2
    assert kept.take(str(other), "alice") is None


def test_a_file_named_like_an_unlinked_one_is_not_served_after_it_moved_elsewhere(tree: Path) -> None:
    """The kernel names the descriptor of an unlinked file ``PATH (deleted)``. A file kept under
    ``logs/app.log (deleted)`` is renamed to ``logs/app.log``, hard-linked outside and unlinked
    there: its descriptor's link reads exactly the kept path again and the file has one hard link
    (outside). It must not be handed out for that path, where another file now is."""
    kept, path = OpenedFiles(), tree / "logs" / "app.log (deleted)"
    path.write_bytes(b"granted\n")
    open_kept(kept, path)
    os.rename(path, tree / "logs" / "app.log.moving")
    os.rename(tree / "logs" / "app.log.moving", tree / "logs" / "app.log")
    os.link(tree / "logs" / "app.log", tree / "other" / "moved")
    os.unlink(tree / "logs" / "app.log")
    (tree / "other" / "moved").write_bytes(b"OTHER SECRET\n")  # the same inode, outside
    path.write_bytes(b"the file at the path now\n")
    fd = kept.take(str(path), "alice")
    assert fd is None or read_all(fd) == b"the file at the path now\n"


@pytest.mark.parametrize("flag", ["O_DIRECT", "O_APPEND"])
def test_a_holders_status_flags_on_its_copy_are_not_handed_to_the_next_reader(tree: Path, flag: str) -> None:
    """A worker that was handed a copy sets a status flag on it (they belong to the open file
    description, which the kept descriptor shares). The next reader (maybe another principal's
    worker) reads as if nobody had."""
    import fcntl

    kept, path = OpenedFiles(), tree / "logs" / "app.log"
    open_kept(kept, path)
    fd = kept.take(str(path), "alice")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | getattr(os, flag))
    os.close(fd)
    fd = kept.take(str(path), "alice")
    if fd is not None:
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & getattr(os, flag) == 0
        assert read_all(fd) == b"first\n"


def test_a_lock_taken_on_a_handed_out_copy_ends_with_its_holder(tree: Path) -> None:
    """A worker (compromised) takes an exclusive ``flock`` on the copy it was handed, then
    closes it (or ends). Nothing of it stays behind once the policy process's sweep (twice a
    second) or the next hand-out has run: another process can lock the file."""
    import fcntl

    kept, path = OpenedFiles(), tree / "logs" / "app.log"
    open_kept(kept, path)
    fd = kept.take(str(path), "alice")
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.close(fd)
    kept.sweep()
    other = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(other)
        kept.clear()


def test_another_principals_reads_never_share_a_kept_description(tree: Path) -> None:
    """What alice's worker (maybe compromised) does to the description it was handed cannot reach
    bob's reads: descriptors are kept per principal."""
    kept, path = OpenedFiles(), tree / "logs" / "app.log"
    open_kept(kept, path)
    assert kept.take(str(path), "bob") is None
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    kept.keep(str(path), "bob", fd)
    os.close(fd)
    a, b = kept.take(str(path), "alice"), kept.take(str(path), "bob")
    try:
        os.lseek(a, 3, os.SEEK_SET)
        assert os.lseek(b, 0, os.SEEK_CUR) == 0  # two open file descriptions
    finally:
        os.close(a)
        os.close(b)


def test_a_file_system_mounted_over_a_kept_files_folder_drops_what_is_kept(tree: Path) -> None:
    """The kernel path of a kept descriptor does not change when a file system is mounted over
    its folder, yet the path now names another file: a change of the mount table drops every
    kept descriptor."""
    import subprocess

    kept, path = OpenedFiles(), tree / "logs" / "app.log"
    open_kept(kept, path)
    os.close(kept.take(str(path), "alice"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tree / "logs")], check=True)
    try:
        path.write_bytes(b"on the new file system\n")
        assert kept.take(str(path), "alice") is None
        open_kept(kept, path)
        assert read_all(kept.take(str(path), "alice")) == b"on the new file system\n"
    finally:
        kept.clear()
        subprocess.run(["umount", "-l", str(tree / "logs")], check=True)
