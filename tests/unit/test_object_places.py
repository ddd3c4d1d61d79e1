"""The object rule of the privileged route (issue 28, items 3 and 4): an open descriptor is judged
by its place (:func:`mcpd.helper.wire.opener.place`: its file system and its path from that file
system's root), never by the spelling that reached it; the walker screens every folder and entry
by place. Root only: the detours are real bind mounts and a second ``proc`` mount, each
unmounted before the test ends.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from mcpd.common.grantmatch import rules_to_wire
from mcpd.helper.wire import opener
from mcpd.helper.wire.errors import PERMISSION_DENIED, ToolError
from mcpd.policy.grants import parse_policy
from mcpd.walker import main as walker
from tests.support.mounts import mounted

pytestmark = pytest.mark.root


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: makes bind mounts")


def test_a_symlink_or_a_bind_mount_leaves_the_place_of_an_object_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "a" / "sub" / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "a")
    (tmp_path / "c").touch()  # a file's mount point
    table = opener.mounts()
    real = opener.place_of(str(tmp_path / "a" / "sub" / "f"), table)
    assert real is not None and real[1].endswith("/a/sub/f")
    with mounted(tmp_path / "b", "--bind", str(tmp_path / "a" / "sub")) as b, \
            mounted(tmp_path / "c", "--bind", str(tmp_path / "a" / "sub" / "f")) as c:
        table = opener.mounts()
        for spelling in (tmp_path / "link" / "sub" / "f", b / "f", c):
            assert opener.place_of(str(spelling), table) == real, spelling
        assert opener.place_of(str(b), table) == opener.place_of(str(tmp_path / "a" / "sub"), table)


def test_a_process_folder_is_told_by_place_however_procfs_is_reached(tmp_path: Path) -> None:
    pid, tid = os.getpid(), threading.get_native_id()
    with mounted(tmp_path / "proc", "-t", "proc", "proc") as proc2, \
            mounted(tmp_path / "pid", "--bind", f"/proc/{pid}") as bound:
        table = opener.mounts()
        for path in (f"/proc/{pid}/environ", "/proc/self/mem", f"/proc/{pid}/task/{tid}/maps", "/proc/thread-self",
                     "/proc/net/unix", f"{proc2}/{pid}/environ", f"{proc2}/self", f"{bound}/environ", str(bound)):
            where = opener.place_of(path, table)
            assert where is not None and opener.of_a_process(where), (path, where)
        for path in ("/proc", "/proc/meminfo", "/proc/sys/kernel/ostype", f"{proc2}/loadavg", str(tmp_path)):
            where = opener.place_of(path, table)
            assert where is not None and not opener.of_a_process(where), (path, where)


def test_a_judged_object_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    """The judge sees the ``O_PATH`` descriptor: a FIFO it refuses never gets a reader."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    seen: list[int] = []

    def judge(fd: int) -> str | None:
        seen.append(os.fstat(fd).st_ino)
        return "judged"

    for want in ("file", "any"):
        with pytest.raises(ToolError) as info:
            opener.open_checked(str(fifo), want=want, judge=judge)
        assert info.value.code == PERMISSION_DENIED and info.value.details["reason"] == "judged"
    assert seen == [fifo.stat().st_ino] * 2
    with pytest.raises(OSError) as err:
        os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    assert err.value.errno == errno.ENXIO  # no reader: nothing was opened for reading


def _frame(tree: Path, op: str, args: dict[str, Any], secrets: list[str], follow: bool) -> dict[str, Any]:
    rule = {"allowed": True, "paths": ["/" if follow else str(tree)]}
    text = yaml.safe_dump({"users": {"alice": {"privileged": {"tools": {"files/list": rule, "files/find": dict(rule)}}}}})
    return {"op": op, "args": {**args, "privileged": True}, "os_user": "alice", "groups": [], "follow": follow,
            "rules": rules_to_wire(parse_policy(text), "alice", set(), op), "secrets": secrets}


def test_the_walker_shows_no_secret_through_a_bind_mount_or_a_symlink(tmp_path: Path) -> None:
    """``state`` holds ``users.yaml`` (a file secret, ``F*`` and ``.F*``) and ``helper`` (a folder
    secret); listed and searched through a bind mount of ``state`` (within a grant on ``tree``) or
    a symlink to it (a grant on ``/``), neither shows, and ``helper`` cannot be a walk's start."""
    state, tree = tmp_path / "state", tmp_path / "tree"
    (state / "helper").mkdir(parents=True)
    tree.mkdir()
    for name in ("users.yaml", "users.yaml~", ".users.yaml.swp", "notes.txt", "helper/lockout.json"):
        (state / name).write_text("x\n")
    secrets = [f"{state}/users.yaml*", f"{state}/.users.yaml*", str(state / "helper")]
    (tree / "link").symlink_to(state)
    with mounted(tree / "bound", "--bind", str(state)) as bound:
        for base, follow in ((bound, False), (tree / "link", True)):
            listed = walker.run(_frame(tree, "files/list", {"path": str(base)}, secrets, follow))
            assert [e["name"] for e in listed["result"]["entries"]] == ["notes.txt"], (base, listed)
            found = walker.run(_frame(tree, "files/find", {"root": str(base)}, secrets, follow))
            assert [m["path"] for m in found["result"]["matches"]] == [f"{base}/notes.txt"], (base, found)
            for start in (base / "helper", base / "users.yaml"):
                reply = walker.run(_frame(tree, "files/list", {"path": str(start)}, secrets, follow))
                assert reply["ok"] is False and reply["error"]["code"] == PERMISSION_DENIED, (start, reply)
        # a mount point inside the walk is judged as the mount's root: the policy's folder itself
        with mounted(tree / "pol", "--bind", str(state / "helper")):
            listed = walker.run(_frame(tree, "files/list", {"path": str(tree)}, secrets, False))
            assert sorted(e["name"] for e in listed["result"]["entries"]) == ["bound", "link"], listed
