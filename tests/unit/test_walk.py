"""mcpd.core.walk: the one directory walker (raw results, both routes) and its import contract."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpd.common.readerrors import reader_error
from mcpd.common.typenames import TYPE_NAMES
from mcpd.core import walk
from mcpd.core.fileopen import open_directory
from mcpd.core.fileops import format_find, format_list
from mcpd.core.tools import files_find, files_list
from mcpd.helper.wire.errors import FILE_NOT_FOUND, INVALID_ARGUMENT, PERMISSION_DENIED, ToolError
from tests.support.codelines import code_lines

WALK_PY = Path(walk.__file__)
BUDGET = 171  # one import a line (ruff); # code lines (tests/support/codelines.py): the privileged walker (mcpd.walker, CAP_DAC_READ_SEARCH) loads this module


def find_args(root: Path | str, **kw: object) -> dict:
    args: dict = {"root": str(root), "name": None, "type": None, "max_depth": None, "max_results": 1000,
                  "time_budget_seconds": 10.0, "follow_symlinks": False}
    return {**args, **kw}


class CountingOpener:
    """The unprivileged opener, recording every path it is asked for."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def __call__(self, path: str) -> int:
        self.paths.append(path)
        return open_directory(path)


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "t"
    (d / "sub" / "deep").mkdir(parents=True)
    (d / "a.txt").write_bytes(b"12345")
    (d / "sub" / "b.log").write_bytes(b"")
    (d / "sub" / "deep" / "c.log").write_bytes(b"")
    os.symlink("a.txt", d / "ln")
    os.symlink(str(d / "sub"), d / "dirlink")
    os.mkfifo(d / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(d / "sock"))
        yield d


def test_walk_imports_only_stdlib_the_wire_and_mcpd_common() -> None:
    code = (
        "import json, sys; before = set(sys.modules); import mcpd.core.walk; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60, check=True)
    new = json.loads(out.stdout)
    ours = {m for m in new if m.split(".")[0] == "mcpd"}
    shared = {m for m in ours if m.startswith(("mcpd.common.", "mcpd.helper.wire."))}
    assert ours <= {"mcpd", "mcpd.core", "mcpd.core.walk", "mcpd.common", "mcpd.helper", "mcpd.helper.wire"} | shared
    foreign = [m for m in new if m.split(".")[0] != "mcpd" and m.split(".")[0] not in sys.stdlib_module_names]
    assert foreign == []


def test_walk_stays_within_its_line_budget() -> None:
    assert code_lines(WALK_PY.read_text()) <= BUDGET


def test_list_raw_is_metadata_only_and_json(tree: Path) -> None:
    os.utime(tree / "a.txt", ns=(0, 1_700_000_000_123_456_789))
    raw = walk.walk_list({"path": str(tree) + "/", "limit": 100}, open_directory, None)
    assert raw["path"] == str(tree) and raw["kind"] == "directory"
    assert (raw["total"], raw["limit"]) == (6, 100)
    by = {e["name"]: e for e in raw["entries"]}
    st = os.lstat(tree / "a.txt")
    assert by["a.txt"] == {"name": "a.txt", "type": "file", "mode": st.st_mode, "size": 5, "uid": st.st_uid,
                           "gid": st.st_gid, "nlink": 1, "mtime_ns": 1_700_000_000_123_456_789}
    assert by["ln"]["target"] == "a.txt" and by["ln"]["type"] == "symlink"
    assert by["dirlink"]["type"] == "symlink"  # a link to a directory is listed as a link
    assert {by["fifo"]["type"], by["sock"]["type"], by["sub"]["type"]} == {"fifo", "socket", "dir"}
    assert all("target" not in e for n, e in by.items() if n not in ("ln", "dirlink"))
    # the raw result crosses the helper channel as JSON: formatting the decoded copy changes nothing
    assert format_list(json.loads(json.dumps(raw))) == format_list(raw)
    assert format_list(raw)["entries"][0]["mtime"] == "2023-11-14T22:13:20Z"


def test_list_raw_limit_and_total(tmp_path: Path) -> None:
    for i in range(30):
        (tmp_path / f"n{i:02d}").write_bytes(b"")
    raw = walk.walk_list({"path": str(tmp_path), "limit": 4}, open_directory, None)
    assert [e["name"] for e in raw["entries"]] == ["n00", "n01", "n02", "n03"]
    assert (raw["total"], raw["limit"]) == (30, 4)
    assert format_list(raw)["truncated"] is True


def test_list_opens_only_the_named_directory(tree: Path) -> None:
    opener = CountingOpener()
    walk.walk_list({"path": str(tree), "limit": 100}, opener, None)
    assert opener.paths == [str(tree)]


def test_list_single_entry_raw(tree: Path) -> None:
    raw = walk.walk_list({"path": str(tree / "ln"), "limit": 5}, open_directory, None)
    assert raw["kind"] == "entry" and raw["total"] == 1
    assert raw["entries"][0]["name"] == "ln" and raw["entries"][0]["target"] == "a.txt"
    privileged = CountingOpener()
    raw = walk.walk_list({"path": str(tree / "fifo"), "limit": 5}, privileged, lambda p: True)
    assert raw["entries"][0]["type"] == "fifo"
    assert privileged.paths == [str(tree / "fifo"), str(tree)]  # the entry relative to its parent's descriptor
    with pytest.raises(ToolError) as exc:
        walk.walk_list({"path": str(tree / "fifo"), "limit": 5}, open_directory, lambda p: False)
    assert exc.value.code == PERMISSION_DENIED and exc.value.details["reason"] == "no grant covers this path"
    with pytest.raises(ToolError) as exc:
        walk.walk_list({"path": str(tree / "missing"), "limit": 5}, open_directory, None)
    assert exc.value.code == FILE_NOT_FOUND


def test_list_allow_sees_every_entry_and_hides_refused_names(tree: Path) -> None:
    seen: list[str] = []

    def allow(path: str) -> bool:
        seen.append(path)
        return not path.endswith((".txt", "fifo"))

    raw = walk.walk_list({"path": str(tree), "limit": 100}, open_directory, allow)
    assert sorted(seen) == sorted(str(tree / n) for n in ("a.txt", "ln", "dirlink", "fifo", "sock", "sub"))
    assert [e["name"] for e in raw["entries"]] == ["dirlink", "ln", "sock", "sub"]
    assert raw["total"] == 4
    assert '"a.txt"' not in json.dumps(raw).replace('"target": "a.txt"', "") and "fifo" not in json.dumps(raw)


def test_find_raw_shape_and_single_open(tree: Path) -> None:
    opener = CountingOpener()
    raw = walk.walk_find(find_args(tree, name="*.log"), opener, None)
    assert opener.paths == [str(tree)]  # subdirectories are opened relative to their parent
    assert raw == {"root": str(tree), "matches": [{"path": str(tree / "sub" / "b.log"), "type": "file"},
                                                   {"path": str(tree / "sub" / "deep" / "c.log"), "type": "file"}],
                   "stopped": None, "scanned": 9, "errors": [], "error_count": 0}
    assert format_find(raw)["truncated"] is False
    assert format_find(json.loads(json.dumps(raw))) == format_find(raw)


def test_find_matches_come_out_sorted_by_component(tmp_path: Path) -> None:
    for rel in ("a/x", "a.b/y", "a-c/z", "b/a/q"):
        (tmp_path / rel).mkdir(parents=True)
    raw = walk.walk_find(find_args(tmp_path), open_directory, None)
    paths = [m["path"] for m in raw["matches"]]
    assert paths == sorted(paths, key=lambda p: p.split("/"))
    capped = walk.walk_find(find_args(tmp_path, max_results=3), open_directory, None)
    assert capped["matches"] == raw["matches"][:3] and capped["stopped"] == "max_results"


def test_find_symlinked_directory_not_entered_unless_followed(tree: Path) -> None:
    plain = walk.walk_find(find_args(tree, name="b.log"), open_directory, None)
    assert [m["path"] for m in plain["matches"]] == [str(tree / "sub" / "b.log")]
    followed = walk.walk_find(find_args(tree, name="b.log", follow_symlinks=True), open_directory, None)
    # dirlink comes first in name order and is entered; sub is then the same directory again
    assert [m["path"] for m in followed["matches"]] == [str(tree / "dirlink" / "b.log")]
    assert followed["errors"] == [{"path": str(tree / "sub"), "reason": "directory already visited (symlink loop or "
                                   "second link to it), not entered again"}]
    with pytest.raises(ToolError) as exc:
        walk.walk_find(find_args(tree, follow_symlinks=True), open_directory, lambda p: True)
    assert exc.value.code == INVALID_ARGUMENT


def test_find_enters_only_allowed_directories(tree: Path) -> None:
    asked: list[str] = []

    def allow(path: str) -> bool:
        asked.append(path)
        return path != str(tree / "sub" / "deep")

    raw = walk.walk_find(find_args(tree), open_directory, allow)
    paths = [m["path"] for m in raw["matches"]]
    assert str(tree / "sub" / "b.log") in paths
    assert not [p for p in paths if p.startswith(str(tree / "sub" / "deep"))]
    assert str(tree / "sub" / "deep" / "c.log") not in asked  # never entered, so never even named


def test_find_depth_cap_reported(tmp_path: Path) -> None:
    path = tmp_path
    for _ in range(walk.DEPTH_CAP + 3):
        path = path / "d"
    path.mkdir(parents=True)
    raw = walk.walk_find(find_args(tmp_path, type="file"), open_directory, None)
    assert raw["stopped"] is None and raw["error_count"] == 1
    assert "deeper than" in raw["errors"][0]["reason"]
    assert raw["errors"][0]["path"].count("/d") == walk.DEPTH_CAP


def test_find_errors_capped_and_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(walk.MAX_ERRORS + 5):
        (tmp_path / f"d{i:03d}").mkdir()
    real_open = os.open

    def failing_open(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if dir_fd is not None:  # every subdirectory (root is searched anyway: permissions do not stop it)
            raise PermissionError(13, "denied")
        return real_open(path, flags, mode)

    monkeypatch.setattr(walk.os, "open", failing_open)
    raw = walk.walk_find(find_args(tmp_path), open_directory, None)
    monkeypatch.undo()
    assert raw["error_count"] == walk.MAX_ERRORS + 5 and len(raw["errors"]) == walk.MAX_ERRORS
    assert {e["reason"] for e in raw["errors"]} == {"permission denied"}
    assert len(raw["matches"]) == walk.MAX_ERRORS + 5  # named by their parent's listing, not entered


def test_find_root_opener_error_propagates(tmp_path: Path) -> None:
    def refuse(path: str) -> int:
        raise reader_error(PermissionError(13, "denied"), path)

    with pytest.raises(ToolError) as exc:
        walk.walk_find(find_args(tmp_path), refuse, None)
    assert exc.value.code == PERMISSION_DENIED


def test_find_progress(tmp_path: Path) -> None:
    for i in range(walk.PROGRESS_EVERY + 1):
        (tmp_path / f"f{i}").write_bytes(b"")
    calls: list[tuple[int, int | None]] = []
    walk.walk_find(find_args(tmp_path, name="none"), open_directory, None, lambda d, t, m: calls.append((d, t)))
    assert calls == [(walk.PROGRESS_EVERY, None)]


def test_parsers_are_the_tools_parsers_and_match_their_schemas() -> None:
    assert files_list.parse_args is walk.parse_list_args and files_find.parse_args is walk.parse_find_args
    assert set(walk.parse_list_args({"path": "/"})) == set(files_list.INPUT_SCHEMA["properties"])
    assert set(walk.parse_find_args({"root": "/"})) == set(files_find.INPUT_SCHEMA["properties"])
    assert files_find.INPUT_SCHEMA["properties"]["type"]["enum"] == list(TYPE_NAMES)


def test_find_parser_null_is_absent_and_budget_is_float() -> None:
    args = walk.parse_find_args({"root": "/srv/", "time_budget_seconds": None, "name": None, "max_results": None})
    assert (args["root"], args["time_budget_seconds"], args["name"], args["max_results"]) == ("/srv/", 10.0, None, 1000)
    assert walk.parse_find_args({"root": "/", "time_budget_seconds": 1})["time_budget_seconds"] == 1.0
    for bad in ({"root": "/", "name": "x" * (walk.MAX_PATTERN + 1)}, {"root": "/", "name": "a\0b"},
                {"root": "/", "time_budget_seconds": "5"}, {"root": "/", "type": "link"}):
        with pytest.raises(ToolError) as exc:
            walk.parse_find_args(bad)
        assert exc.value.code == INVALID_ARGUMENT
