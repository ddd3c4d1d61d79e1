"""files/find: globs, types, depth, caps, symlinks, loops, unreadable dirs, grants."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpd.core.fileops.find import FindQuery, find, op_find
from mcpd.core.tools import files_find
from mcpd.helper.wire.errors import INVALID_ARGUMENT, ToolError

#: Where the fileops helpers live, for a child that imports them by file name.
SUPPORT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
from tests.support.fileops import make_ctx  # noqa: E402

ROOT = os.geteuid() == 0


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    r = tmp_path / "r"
    (r / "a" / "deep" / "deeper").mkdir(parents=True)
    (r / "b").mkdir()
    (r / "top.txt").write_bytes(b"")
    (r / "TOP.TXT").write_bytes(b"")
    (r / "a" / "one.txt").write_bytes(b"")
    (r / "a" / "deep" / "two.txt").write_bytes(b"")
    (r / "a" / "deep" / "deeper" / "three.txt").write_bytes(b"")
    (r / "b" / "notes.md").write_bytes(b"")
    os.mkfifo(r / "b" / "pipe")
    return r


def paths(res: dict, root: Path) -> list[str]:
    return [os.path.relpath(m["path"], root) for m in res["matches"]]


def test_find_name_glob_per_name_case_sensitive(tree: Path) -> None:
    res = find(str(tree), make_ctx(), FindQuery(name="*.txt"))
    assert paths(res, tree) == ["a/deep/deeper/three.txt", "a/deep/two.txt", "a/one.txt", "top.txt"]
    assert res["stopped"] is None and res["truncated"] is False
    # the glob is matched against each name, never against a path with slashes
    assert find(str(tree), make_ctx(), FindQuery(name="a/*.txt"))["matches"] == []
    assert paths(find(str(tree), make_ctx(), FindQuery(name="*.TXT")), tree) == ["TOP.TXT"]


def test_find_type_filter(tree: Path) -> None:
    dirs = find(str(tree), make_ctx(), FindQuery(type="dir"))
    assert paths(dirs, tree) == ["a", "a/deep", "a/deep/deeper", "b"]
    fifos = find(str(tree), make_ctx(), FindQuery(type="fifo"))
    assert paths(fifos, tree) == ["b/pipe"]
    assert fifos["matches"][0]["type"] == "fifo"


def test_find_max_depth(tree: Path) -> None:
    one = find(str(tree), make_ctx(), FindQuery(name="*.txt", max_depth=1))
    assert paths(one, tree) == ["top.txt"]
    two = find(str(tree), make_ctx(), FindQuery(name="*.txt", max_depth=2))
    assert paths(two, tree) == ["a/one.txt", "top.txt"]


def test_find_result_cap(tree: Path) -> None:
    res = find(str(tree), make_ctx(), FindQuery(max_results=3))
    assert len(res["matches"]) == 3
    assert res["stopped"] == "max_results" and res["truncated"] is True
    assert "stopped at max_results" in files_find.format_result(res)["content"][0]["text"]


def test_find_time_budget_stops_the_walk(tmp_path: Path) -> None:
    for i in range(20):
        d = tmp_path / f"d{i}"
        d.mkdir()
        for j in range(100):
            (d / f"f{j}").write_bytes(b"")
    res = find(str(tmp_path), make_ctx(), FindQuery(time_budget=1e-9))
    assert res["stopped"] == "time_budget"
    assert res["scanned"] < 2020
    assert "time budget" in files_find.format_result(res)["content"][0]["text"]


def test_find_does_not_follow_symlinks_by_default(tree: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "far.txt").write_bytes(b"")
    os.symlink(outside, tree / "jump")
    res = find(str(tree), make_ctx(), FindQuery(name="*"))
    assert "jump/far.txt" not in paths(res, tree)
    assert {"path": str(tree / "jump"), "type": "symlink"} in res["matches"]
    followed = find(str(tree), make_ctx(), FindQuery(name="far.txt", follow_symlinks=True))
    assert paths(followed, tree) == ["jump/far.txt"]


def test_find_symlink_loop_with_follow_terminates(tmp_path: Path) -> None:
    (tmp_path / "x" / "y").mkdir(parents=True)
    os.symlink("..", tmp_path / "x" / "y" / "up")  # y/up -> x
    os.symlink(str(tmp_path), tmp_path / "x" / "root")  # x/root -> tmp_path
    os.symlink("self", tmp_path / "self")  # dangling self-loop
    res = find(str(tmp_path), make_ctx(), FindQuery(follow_symlinks=True, max_results=10000))
    assert res["stopped"] is None
    assert len(res["matches"]) < 10
    assert any("already visited" in e["reason"] for e in res["errors"])


def test_find_progress_callback(tmp_path: Path) -> None:
    for i in range(11000):
        (tmp_path / f"f{i}").write_bytes(b"")
    calls: list[tuple[int, int | None, str]] = []
    res = find(str(tmp_path), make_ctx(progress=lambda d, t, m: calls.append((d, t, m))), FindQuery(name="nomatch"))
    assert [c[0] for c in calls] == [5000, 10000]
    assert all(c[1] is None for c in calls)
    assert res["scanned"] == 11000


def test_find_allow_filter_nothing_outside_listed(tree: Path) -> None:
    (tree / "a" / "secret.key").write_bytes(b"")
    granted_dir = str(tree / "a")

    def allow(p: str) -> bool:
        return (p == granted_dir or p.startswith(granted_dir + "/")) and not p.endswith("secret.key")

    res = find(str(tree), make_ctx(allow=allow), FindQuery())
    assert paths(res, tree) == ["a", "a/deep", "a/deep/deeper", "a/deep/deeper/three.txt", "a/deep/two.txt", "a/one.txt"]
    dumped = json.dumps(files_find.format_result(res))
    for hidden in ("secret.key", "top.txt", "TOP.TXT", "notes.md", "pipe", '/b"'):
        assert hidden not in dumped
    # a directory the grant does not cover is not entered, even if a name below would match
    denied_sub = find(str(tree), make_ctx(allow=lambda p: p != str(tree / "a" / "deep")), FindQuery(name="*.txt"))
    assert paths(denied_sub, tree) == ["a/one.txt", "top.txt"]


def test_find_follow_symlinks_refused_on_privileged_route(tree: Path) -> None:
    with pytest.raises(ToolError) as exc:
        find(str(tree), make_ctx(allow=lambda p: True), FindQuery(follow_symlinks=True))
    assert exc.value.code == INVALID_ARGUMENT
    with pytest.raises(ToolError) as exc:
        files_find.parse_args({"root": "/var", "follow_symlinks": True, "privileged": True})
    assert exc.value.code == INVALID_ARGUMENT


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="mcpd-find-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d)


@pytest.mark.skipif(not ROOT, reason="needs root to switch to nobody")
def test_find_unreadable_subdirectory_reported_and_skipped(shared_dir: Path) -> None:
    (shared_dir / "open").mkdir()
    (shared_dir / "open" / "seen.txt").write_bytes(b"")
    (shared_dir / "closed").mkdir(mode=0o700)
    (shared_dir / "closed" / "hidden.txt").write_bytes(b"")
    (shared_dir / "z.txt").write_bytes(b"")
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1]);"
        "from fileops import make_ctx; from mcpd.core.fileops.find import find, FindQuery;"
        "print(json.dumps(find(sys.argv[2], make_ctx(), FindQuery(name='*.txt'))))"
    )
    out = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c", code,
         SUPPORT_DIR, str(shared_dir)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    res = json.loads(out)
    assert paths(res, shared_dir) == ["open/seen.txt", "z.txt"]
    assert res["errors"] == [{"path": str(shared_dir / "closed"), "reason": "permission denied"}]
    assert "[ERROR: " in files_find.format_result(res)["content"][0]["text"]


@pytest.fixture
def big_tree() -> Iterator[Path]:
    """100 directories of 1000 empty files (created relative to directory descriptors), removed after."""
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # tmpfs: fast to fill and empty
    root = Path(tempfile.mkdtemp(prefix="mcpd-find-100k-", dir=shm))
    try:
        for i in range(100):
            os.mkdir(root / f"dir{i:03d}")
            dfd = os.open(root / f"dir{i:03d}", os.O_RDONLY | os.O_DIRECTORY)
            try:
                for j in range(1000):
                    os.close(os.open(f"file{j:04d}.log", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=dfd))
            finally:
                os.close(dfd)
        yield root
    finally:
        shutil.rmtree(root)


@pytest.mark.slow
def test_find_100k_tree_under_time_budget(big_tree: Path) -> None:
    tmp_path = big_tree
    (tmp_path / "dir099" / "needle.conf").write_bytes(b"")
    t0 = time.monotonic()
    res = find(str(tmp_path), make_ctx(), FindQuery(name="needle.*", time_budget=60))
    elapsed = time.monotonic() - t0
    print(f"find over {res['scanned']} entries: {elapsed:.2f} s")
    assert res["stopped"] is None
    assert res["scanned"] == 100 * 1000 + 100 + 1
    assert paths(res, tmp_path) == ["dir099/needle.conf"]
    capped = find(str(tmp_path), make_ctx(), FindQuery(name="*.log", max_results=1000, time_budget=60))
    assert len(capped["matches"]) == 1000 and capped["stopped"] == "max_results"


def test_find_op_handler_uses_parsed_args(tree: Path) -> None:
    args = files_find.parse_args({"root": str(tree), "name": "*.md", "type": "file", "max_depth": 2})
    assert paths(op_find(args, make_ctx()), tree) == ["b/notes.md"]


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"root": "rel"},
        {"root": "/x\0"},
        {"root": "/", "name": ""},
        {"root": "/", "name": 5},
        {"root": "/", "type": "regular"},
        {"root": "/", "max_depth": 0},
        {"root": "/", "max_results": 0},
        {"root": "/", "max_results": 10001},
        {"root": "/", "time_budget_seconds": 0},
        {"root": "/", "time_budget_seconds": 61},
        {"root": "/", "time_budget_seconds": True},
        {"root": "/", "follow_symlinks": 1},
        {"root": "/", "bogus": 1},
    ],
)
def test_find_invalid_arguments(args: dict) -> None:
    with pytest.raises(ToolError) as exc:
        files_find.parse_args(args)
    assert exc.value.code == INVALID_ARGUMENT


def test_find_parse_args_defaults() -> None:
    assert files_find.parse_args({"root": "/srv"}) == {
        "root": "/srv",
        "name": None,
        "type": None,
        "max_depth": None,
        "max_results": 1000,
        "time_budget_seconds": 10.0,
        "follow_symlinks": False,
        "privileged": False,
    }
    assert files_find.INPUT_SCHEMA["additionalProperties"] is False


def test_find_registered_in_ops_run(tree: Path) -> None:
    from mcpd.core import ops

    reply = ops.run({"id": 1, "op": "files/find", "args": {"root": str(tree), "name": "two.txt"}}, make_ctx())
    assert reply["ok"] is True
    assert paths(reply["result"], tree) == ["a/deep/two.txt"]
    bad = ops.run({"id": 2, "op": "files/find", "args": {"root": str(tree), "max_results": -1}}, make_ctx())
    assert bad["ok"] is False and bad["error"]["code"] == INVALID_ARGUMENT
