"""mcpd.common.reload.Reloading: the one holder of files re-read on change (users, grants)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from mcpd.common.reload import Reloading
from mcpd.helper.wire.securefile import ConfigFileError


def load_int(path: str) -> int:
    text = Path(path).read_text()
    if not text.strip().isdigit():
        raise ConfigFileError([f"{path}:1: not a number"])
    return int(text)


def rewrite(path: Path, text: str) -> None:
    """Replace the file (new inode), so the signature changes even within one mtime tick."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_loads_at_once_and_again_only_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "n"
    path.write_text("1")
    calls: list[str] = []

    def load(p: str) -> int:
        calls.append(p)
        return load_int(p)

    holder = Reloading(str(path), load)
    assert holder.current == 1 and holder.last_errors == [] and len(calls) == 1
    assert holder.refresh() is False and len(calls) == 1
    rewrite(path, "2")
    assert holder.refresh() is True and holder.current == 2
    assert holder.refresh(force=True) is True and len(calls) == 3


def test_a_failing_load_keeps_the_last_good_value_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "n"
    path.write_text("7")
    holder = Reloading(str(path), load_int)
    rewrite(path, "oops")
    assert holder.refresh() is True
    assert holder.current == 7
    assert holder.last_errors == [f"{path}:1: not a number"]
    assert holder.refresh() is False and holder.last_errors  # unchanged file: not retried
    rewrite(path, "8")
    assert holder.refresh() and holder.current == 8 and holder.last_errors == []
    path.unlink()
    assert holder.refresh() is True and holder.current == 8 and holder.last_errors


def test_plain_exceptions_are_reported_by_their_text(tmp_path: Path) -> None:
    holder = Reloading(str(tmp_path / "missing"), load_int, empty=0)
    assert holder.current == 0 and holder.last_errors and "missing" in holder.last_errors[0]


def test_first_load_failure_raises_without_an_empty_value(tmp_path: Path) -> None:
    path = tmp_path / "n"
    path.write_text("bad")
    with pytest.raises(ConfigFileError):
        Reloading(str(path), load_int)
    holder = Reloading(str(path), load_int, empty=-1)
    assert holder.current == -1 and holder.last_errors


def test_fail_closed_drops_to_the_empty_value(tmp_path: Path) -> None:
    path = tmp_path / "n"
    path.write_text("5")
    holder = Reloading(str(path), load_int, empty=0, fail_closed=True)
    assert holder.current == 5
    rewrite(path, "broken")
    holder.refresh()
    assert holder.current == 0 and holder.last_errors


def test_concurrent_refreshes_load_a_change_once(tmp_path: Path) -> None:
    path = tmp_path / "n"
    path.write_text("1")
    calls: list[int] = []
    gate = threading.Event()

    def slow(p: str) -> int:
        calls.append(1)
        gate.wait(0.2)
        return load_int(p)

    holder = Reloading(str(path), slow)
    rewrite(path, "2")
    threads = [threading.Thread(target=holder.refresh) for _ in range(8)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert holder.current == 2 and len(calls) == 2  # the first load + one reload
