"""The line index of deep line reads: used when the file is the same, never when it
changed (appended, truncated, rewritten in place, replaced), and bounded in memory.

Every read goes through ``ops.run`` with the real opener, as a worker runs it; the expected text
is computed from the file's bytes independently of the reading core.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from mcpd.core import textread
from tests.support.textread import text

LINES = 120_000  # about 3.3 MiB: several 1 MiB chunks, so checkpoints exist past the first


def make_log(path: Path, lines: int = LINES, tag: str = "a") -> list[bytes]:
    rows = [f"{tag} line {i:07d} {'x' * (i % 17)}\n".encode() for i in range(1, lines + 1)]
    path.write_bytes(b"".join(rows))
    return rows


def expect(rows: list[bytes], start: int, end: int) -> str:
    return b"".join(rows[start - 1:end]).decode()


@pytest.fixture(autouse=True)
def fresh_index(monkeypatch: pytest.MonkeyPatch) -> textread.LineIndex:
    index = textread.LineIndex()
    monkeypatch.setattr(textread, "LINE_INDEX", index)
    return index


def scanned_from(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the offset of every ``pread`` the reading core makes."""
    seen: list[int] = []
    real = os.pread

    def pread(fd: int, n: int, pos: int) -> bytes:
        seen.append(pos)
        return real(fd, n, pos)

    monkeypatch.setattr(textread.os, "pread", pread)
    return seen


def test_a_deep_read_after_the_first_starts_near_its_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          fresh_index: textread.LineIndex) -> None:
    log = tmp_path / "app.log"
    rows = make_log(log)
    assert text(log, start_line=100_000, end_line=100_100) == expect(rows, 100_000, 100_100)
    assert len(fresh_index) == 1
    preads = scanned_from(monkeypatch)
    for start in (100_000, 99_999, 100_050, 60_000, 2, 1):
        preads.clear()
        assert text(log, start_line=start, end_line=start + 10) == expect(rows, start, start + 10), start
    # a selection longer than the reads made from a checkpoint, and one running to the end
    assert text(log, start_line=100_000, end_line=112_000) == expect(rows, 100_000, 112_000)
    assert text(log, start_line=119_000) == expect(rows, 119_000, LINES)
    target = sum(len(r) for r in rows[:99_999])
    preads.clear()
    assert text(log, start_line=100_000, end_line=100_100) == expect(rows, 100_000, 100_100)
    line_reads = [p for p in preads if p >= textread.BINARY_PROBE]
    assert line_reads and min(line_reads) > target - textread.CHUNK, (line_reads, target)


@pytest.mark.parametrize("change", ["append", "truncate", "rewrite same size", "rewrite, mtime put back", "replace"])
def test_a_changed_file_is_never_answered_from_a_stale_index(tmp_path: Path, change: str) -> None:
    log = tmp_path / "app.log"
    rows = make_log(log)
    assert text(log, start_line=90_000, end_line=90_005) == expect(rows, 90_000, 90_005)
    if change == "append":
        with open(log, "ab") as f:  # a live log: lines shift nothing, but the tail grows
            f.write(b"".join(f"new {i}\n".encode() for i in range(50)))
        rows += [f"new {i}\n".encode() for i in range(50)]
        assert text(log, start_line=LINES + 1, end_line=LINES + 3) == "new 0\nnew 1\nnew 2\n"
    elif change == "truncate":
        with open(log, "r+b") as f:
            f.truncate(sum(len(r) for r in rows[:80_000]))
        rows = rows[:80_000]
        reply: dict[str, Any] = {}
        from tests.support.textread import call

        reply = call(log, start_line=90_000, end_line=90_005)
        assert reply["ok"] is False and reply["error"]["code"] == "RANGE_OUT_OF_BOUNDS", reply
    elif change.startswith("rewrite"):  # same length, lines moved: one long line up front
        data = log.read_bytes()
        st = os.stat(log)
        shifted = data.replace(b"\n", b" ", 2000)
        with open(log, "r+b") as f:  # in place: same inode, same size
            f.write(shifted)
        # the old mtime put back (as `touch -r` or a restore would): only the ctime tells
        bump = 0 if change.endswith("put back") else 1_000_000
        os.utime(log, ns=(st.st_atime_ns, st.st_mtime_ns + bump))
        assert (os.stat(log).st_size, os.stat(log).st_ino) == (st.st_size, st.st_ino)
        rows = [r + b"\n" for r in shifted.split(b"\n")[:-1]]
    else:
        other = tmp_path / "new.log"
        rows = make_log(other, LINES, tag="b")
        os.replace(other, log)
    if change != "truncate":
        assert text(log, start_line=90_000, end_line=90_005) == expect(rows, 90_000, 90_005), change


def test_the_index_is_bounded() -> None:
    index = textread.LineIndex(files=3, points=8)
    for f in range(5):
        for p in range(20):
            index.add((1, f, 100, 0), p * 10, p + 1)
    assert len(index) == 3
    assert index.before((1, 0, 100, 0), 5) is None  # the least recently used files were dropped
    points = index.points((1, 4, 100, 0))
    assert 0 < len(points) <= 8
    pos, line, nxt = index.before((1, 4, 100, 0), 15) or (None, None, None)
    assert line is not None and line < 15 and pos == (line - 1) * 10
    assert nxt == -1 or (pos is not None and nxt > pos)
