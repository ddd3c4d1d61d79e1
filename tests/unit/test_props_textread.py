"""Property tests (hypothesis) of files/read's line and byte selection (docs/REFERENCE.md §3) against a simple
reference model written here: whole bytes in memory, ``split`` at ``\\n``, slices.

Every example goes through ``ops.run`` with the real unprivileged opener, on a real file, with small
limits so the errors (``LINE_TOO_LONG``, ``FILE_TOO_LARGE``, ``RANGE_OUT_OF_BOUNDS``) and the
truncation warning are reached often. Derandomized with a bounded example count: CI sees the same
examples every run.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcpd.common.config import ReadLimits
from mcpd.core import fileopen, ops

LIMITS = ReadLimits(default_bytes=40, response_cap=400, max_line_bytes=24)
CTX = ops.OpContext(limits=LIMITS, open_file=fileopen.open_regular, open_dir=fileopen.open_directory)
SETTINGS = settings(derandomize=True, max_examples=400, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
WARNING = re.compile(r"\n\[WARNING: File truncated: showed bytes (\d+)-(\d+) of (.*?)\. To read more, call files/read "
                     r"with (\{.*\})\]$")

# Text the model can reason about: ASCII with \r, \f and spaces, plus 2- and 3-byte UTF-8
# characters (so a byte window cuts characters) and the separators Python's splitlines would use.
ALPHABET = st.sampled_from(["a", "b", " ", "\n", "\n", "\n", "\r", "\f", "é", "€", "\u2028", "\x85"])
CONTENT = st.lists(ALPHABET, max_size=600).map(lambda cs: "".join(cs).encode("utf-8"))
LINE_NO = st.integers(min_value=1, max_value=60)


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def run(folder: Path, data: bytes, **args: Any) -> dict[str, Any]:
    path = folder / "f.txt"
    path.write_bytes(data)
    reply = ops.run({"id": 1, "op": "files/read", "args": {"path": str(path), **args}}, dataclasses.replace(CTX))
    assert reply["id"] == 1
    return reply


# -- the reference model ------------------------------------------------------------------------------


def model_lines(data: bytes, start: int | None, end: int | None) -> set[str] | bytes:
    """The selected bytes, or the set of error codes any one of which is a right answer."""
    lines = data.split(b"\n")
    pieces = [line + b"\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    total = len(pieces)
    first = start or 1
    last = end if end is not None and end >= first else total
    if first > total and not (total == 0 and first == 1):
        return {"RANGE_OUT_OF_BOUNDS"}
    chosen = pieces[first - 1:min(last, total)]
    errors = set()
    if any(len(p.rstrip(b"\n")) > LIMITS.max_line_bytes for p in chosen):
        errors.add("LINE_TOO_LONG")
    if sum(map(len, chosen)) > LIMITS.response_cap:
        errors.add("FILE_TOO_LARGE")
    return errors or b"".join(chosen)


def whole_chars(data: bytes, lo: int, hi: int) -> tuple[int, int]:
    """``[lo, hi)`` shrunk to whole UTF-8 characters: a cut character at either edge is left out."""
    hi = min(hi, len(data))
    if lo >= hi:
        return lo, lo
    while lo < hi and data[lo] & 0xC0 == 0x80:  # a continuation byte: the character began before
        lo += 1
    k = hi
    while k > lo and data[k - 1] & 0xC0 == 0x80:
        k -= 1
    if k > lo:  # k - 1 is a lead byte (or ASCII): is its character whole before hi?
        lead = data[k - 1]
        need = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        if k - 1 + need > hi:
            hi = k - 1
    return lo, hi


# -- properties ---------------------------------------------------------------------------------------


@SETTINGS
@given(data=CONTENT, start=st.none() | LINE_NO, end=st.none() | LINE_NO)
def test_line_selection_matches_the_model(folder: Path, data: bytes, start: int | None, end: int | None) -> None:
    if start is None and end is None:
        start = 1
    args = {k: v for k, v in (("start_line", start), ("end_line", end)) if v is not None}
    reply = run(folder, data, **args)
    want = model_lines(data, start, end)
    if isinstance(want, set):
        assert not reply["ok"] and reply["error"]["code"] in want, (reply, want)
        return
    assert reply["ok"], reply
    assert reply["result"]["text"].encode("utf-8") == want


@SETTINGS
@given(data=CONTENT, offset=st.integers(0, 700) | st.sampled_from([2 ** 63 - 1, 2 ** 63, 2 ** 64, 10 ** 30]),
       limit=st.integers(1, 500))
def test_byte_window_with_a_limit_matches_the_model(folder: Path, data: bytes, offset: int, limit: int) -> None:
    reply = run(folder, data, offset=offset, limit=limit)
    if limit > LIMITS.response_cap and len(data) - offset > LIMITS.response_cap:
        assert not reply["ok"] and reply["error"]["code"] == "FILE_TOO_LARGE", reply
        return
    assert reply["ok"], reply
    lo, hi = whole_chars(data, offset, offset + limit)
    assert reply["result"]["text"].encode("utf-8") == data[lo:hi]
    assert "WARNING" not in reply["result"]["text"] or b"WARNING" in data


@SETTINGS
@given(data=CONTENT, offset=st.none() | st.integers(0, 700))
def test_default_and_offset_only_windows_warn_exactly_when_more_remains(folder: Path, data: bytes,
                                                                        offset: int | None) -> None:
    reply = run(folder, data, **({} if offset is None else {"offset": offset}))
    assert reply["ok"], reply
    text: str = reply["result"]["text"]
    start = offset or 0
    lo, hi = whole_chars(data, start, start + LIMITS.default_bytes)
    more = len(data) > start + LIMITS.default_bytes
    m = WARNING.search(text)
    assert (m is not None) == more, (text, more)
    shown = text[:m.start()] if m else text
    assert shown.encode("utf-8") == data[lo:hi]
    if m:  # the warning names the bytes shown and where the next call starts
        assert (int(m.group(1)), int(m.group(2))) == (lo, hi - 1)
        assert f'"offset": {hi}' in m.group(4)
