"""The worker's side of a privileged files/grep (:func:`mcpd.core.fileops.grep.grep_granted`): it
searches the descriptors of each batch in order, counts what the grant refused without naming
it, stops asking for batches once the search stopped, and refuses a malformed batch."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.common.config import ReadLimits
from mcpd.core.fileops.grep import grep_granted
from mcpd.helper.wire.errors import ToolError


def _batches(tmp_path: Path, frames_: list[dict[str, Any]], asked: list[int]) -> Iterator[tuple[dict[str, Any],
                                                                                             list[int]]]:
    """Each frame with descriptors of its files (opened here, as root would), closed after use."""
    for n, frame in enumerate(frames_):
        asked.append(n)
        fds = [os.open(p, os.O_RDONLY) for p in frame["files"]]
        try:
            yield frame, fds
        finally:
            for fd in fds:
                os.close(fd)


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    out = []
    for name in ("a.txt", "b.txt", "c.txt"):
        (tmp_path / name).write_text(f"one\nneedle {name}\n")
        out.append(str(tmp_path / name))
    return out


def frame(files: list[str], last: bool, **kw: Any) -> dict[str, Any]:
    return {"files": files, "skips": [], "not_granted": 0, "last": last, **kw}


def test_batches_are_searched_in_order_and_refusals_counted_unnamed(tmp_path: Path, files: list[str]) -> None:
    asked: list[int] = []
    plan = [frame(files[:2], False, skips=[[str(tmp_path / "ln"), "symlink"]], not_granted=2),
            frame(files[2:], True, not_granted=1, walk={"stopped": None, "stop_path": None})]
    out = grep_granted({"pattern": "needle", "path": str(tmp_path), "privileged": True}, ReadLimits(),
                       _batches(tmp_path, plan, asked))
    assert [(m["path"], m["line"]) for m in out["matches"]] == [(f, 2) for f in files]
    assert out["files_skipped"] == {"not_granted": 3, "symlink": 1}
    assert out["skipped"] == [{"path": str(tmp_path / "ln"), "reason": "symlink"}]  # not_granted: never named
    assert out["stopped"] is None and asked == [0, 1]


def test_a_stopped_search_asks_for_no_more_batches(tmp_path: Path, files: list[str]) -> None:
    asked: list[int] = []
    plan = [frame(files[:1], False), frame(files[1:], True)]
    out = grep_granted({"pattern": "needle", "path": str(tmp_path), "privileged": True, "max_matches": 1},
                       ReadLimits(), _batches(tmp_path, plan, asked))
    assert out["stopped"] == "max_matches" and out["next_cursor"] and asked == [0]


def test_the_walkers_time_budget_gives_a_cursor_at_its_stop(tmp_path: Path, files: list[str]) -> None:
    plan = [frame(files[:1], True, walk={"stopped": "time_budget", "stop_path": files[1]})]
    out = grep_granted({"pattern": "needle", "path": str(tmp_path), "privileged": True}, ReadLimits(),
                       _batches(tmp_path, plan, []))
    assert out["stopped"] == "time_budget" and out["truncated"] is True and out["next_cursor"]


def test_a_file_named_alone_keeps_its_errors(tmp_path: Path) -> None:
    binary = tmp_path / "bin.dat"
    binary.write_bytes(b"\0needle")
    with pytest.raises(ToolError) as err:
        grep_granted({"pattern": "needle", "path": str(binary), "privileged": True}, ReadLimits(),
                     _batches(tmp_path, [frame([str(binary)], True)], []))
    assert err.value.code == "BINARY_FILE"


@pytest.mark.parametrize("bad", [{"files": 3}, {"skips": None}, {"not_granted": "1"}])
def test_a_malformed_batch_is_an_internal_error(tmp_path: Path, files: list[str], bad: dict[str, Any]) -> None:
    plan = [dict(frame(files[:1], True), **bad)]

    def batches() -> Iterator[tuple[dict[str, Any], list[int]]]:
        fd = os.open(files[0], os.O_RDONLY)
        try:
            yield plan[0], [fd]
        finally:
            os.close(fd)

    with pytest.raises(ToolError) as err:
        grep_granted({"pattern": "needle", "path": str(tmp_path), "privileged": True}, ReadLimits(), batches())
    assert err.value.code == "INTERNAL_ERROR"


def test_more_files_than_descriptors_is_an_internal_error(tmp_path: Path, files: list[str]) -> None:
    def batches() -> Iterator[tuple[dict[str, Any], list[int]]]:
        fd = os.open(files[0], os.O_RDONLY)
        try:
            yield frame(files[:2], True), [fd]
        finally:
            os.close(fd)

    with pytest.raises(ToolError) as err:
        grep_granted({"pattern": "needle", "path": str(tmp_path), "privileged": True}, ReadLimits(), batches())
    assert err.value.code == "INTERNAL_ERROR"
