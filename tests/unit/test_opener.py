"""docs/REFERENCE.md §4.4: the privileged opener (openat2), on real files."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mcpd.helper.wire import opener
from mcpd.helper.wire.errors import FILE_NOT_FOUND, INVALID_ARGUMENT, NOT_A_REGULAR_FILE, PERMISSION_DENIED, ToolError
from mcpd.walker.main import open_checked_dir


def read_all(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def refused(path: str, code: str, **kwargs: bool) -> ToolError:
    with pytest.raises(ToolError) as info:
        opener.open_checked(path, **kwargs)
    assert info.value.code == code, info.value
    return info.value


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "granted").mkdir()
    (tmp_path / "granted" / "ok.txt").write_bytes(b"public\n")
    (tmp_path / "secret").write_bytes(b"TOPSECRET\n")
    return tmp_path


def test_regular_file_opens(tree: Path) -> None:
    assert read_all(opener.open_checked(str(tree / "granted" / "ok.txt"))[0]) == b"public\n"
    # the path is cleaned lexically as the grant decision cleans it
    assert read_all(opener.open_checked(str(tree / "granted" / "x" / ".." / "ok.txt"))[0]) == b"public\n"


def test_symlink_inside_granted_dir_refused(tree: Path) -> None:
    link = tree / "granted" / "link"
    link.symlink_to(tree / "secret")
    err = refused(str(link), PERMISSION_DENIED)
    assert err.details["reason"] == "symlink in path"


def test_symlink_in_parent_component_refused(tree: Path) -> None:
    (tree / "granted" / "sub").symlink_to(tree)
    err = refused(str(tree / "granted" / "sub" / "secret"), PERMISSION_DENIED)
    assert err.details["reason"] == "symlink in path"


def test_symlink_followed_only_when_grant_covers_root(tree: Path) -> None:
    link = tree / "granted" / "link"
    link.symlink_to(tree / "secret")
    fd = opener.open_checked(str(link), follow_symlinks=True)[0]
    assert opener.fd_path(fd) == str(tree / "secret")
    assert read_all(fd) == b"TOPSECRET\n"


def test_hard_link_refused(tree: Path) -> None:
    os.link(tree / "secret", tree / "granted" / "hard")
    err = refused(str(tree / "granted" / "hard"), PERMISSION_DENIED)
    assert err.details["reason"] == "file has several hard links"


def test_fifo_refused_without_blocking(tree: Path) -> None:
    fifo = tree / "granted" / "fifo"
    os.mkfifo(fifo)
    outcome: list[BaseException | int] = []

    def attempt() -> None:
        try:
            outcome.append(opener.open_checked(str(fifo))[0])
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(30)
    if worker.is_alive():  # unblock the thread before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("opening a FIFO blocked")
    err = outcome[0]
    assert isinstance(err, ToolError) and err.code == NOT_A_REGULAR_FILE and err.details["type"] == "fifo"


def test_socket_refused(tree: Path) -> None:
    path = tree / "granted" / "sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))
        err = refused(str(path), NOT_A_REGULAR_FILE)
    assert err.details["type"] == "socket"


def test_device_and_directory_refused(tree: Path) -> None:
    assert refused("/dev/zero", NOT_A_REGULAR_FILE).details["type"] == "char device"
    assert refused(str(tree / "granted"), NOT_A_REGULAR_FILE).details["type"] == "directory"
    assert refused("/", NOT_A_REGULAR_FILE).details["type"] == "directory"


def test_missing_and_invalid_paths(tree: Path) -> None:
    refused(str(tree / "granted" / "nope"), FILE_NOT_FOUND)
    refused("granted/ok.txt", INVALID_ARGUMENT)
    refused(str(tree) + "/\0x", INVALID_ARGUMENT)


def test_open_checked_dir(tree: Path) -> None:
    fd = open_checked_dir(str(tree / "granted"))
    try:
        assert "ok.txt" in os.listdir(fd)
    finally:
        os.close(fd)
    (tree / "dirlink").symlink_to(tree / "granted")
    with pytest.raises(ToolError) as info:
        open_checked_dir(str(tree / "dirlink"))
    assert info.value.details["reason"] == "symlink in path"
    with pytest.raises(ToolError) as info:
        open_checked_dir(str(tree / "granted" / "ok.txt"))
    assert info.value.code == NOT_A_REGULAR_FILE


SWAPPER = r"""
import os, sys, time
target, secret, folder, ready = sys.argv[1:5]
deadline = time.monotonic() + 120          # bounded even if the parent dies
link, plain = os.path.join(folder, ".l"), os.path.join(folder, ".f")
swaps = 0
while time.monotonic() < deadline:
    os.symlink(secret, link)
    os.rename(link, target)                # a symlink to the secret now sits at the checked path
    with open(plain, "wb") as f:
        f.write(b"public\n")
    os.rename(plain, target)               # and a regular file again
    swaps += 1
    if swaps == 100:
        open(ready, "w").close()
"""


@pytest.mark.slow
def test_symlink_swap_race_never_leaks_a_byte(tree: Path) -> None:
    target = tree / "granted" / "target"
    target.write_bytes(b"public\n")
    ready = tree / "ready"
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(target), str(tree / "secret"), str(tree / "granted"), str(ready)]
    )
    try:
        for _ in range(3000):  # wait (bounded) until the swapper is really running
            if ready.exists() or swapper.poll() is not None:
                break
            time.sleep(0.01)
        assert ready.exists(), "swapper did not start"
        outcomes: dict[str, int] = {}
        leaked = 0
        for _ in range(20_000):
            try:
                data = read_all(opener.open_checked(str(target))[0])
            except ToolError as exc:
                key = exc.details.get("reason") or exc.code
                outcomes[key] = outcomes.get(key, 0) + 1
                continue
            outcomes["read"] = outcomes.get("read", 0) + 1
            if b"TOPSECRET" in data or (data and data != b"public\n"[: len(data)]):
                leaked += 1
        still_running = swapper.poll() is None
    finally:
        swapper.kill()
        swapper.wait(30)
    print(f"\nopenat2: 20000 opens during symlink swaps: {outcomes}")
    assert still_running, "the swapper stopped before the opens finished"
    assert leaked == 0
