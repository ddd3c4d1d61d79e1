"""docs/REFERENCE.md §3 (``files/read``) row by row through the real daemon: TLS + SSE on 127.0.0.1 (issue 2).

Every call goes through ``mcpd.client.api.Client`` to a real ``mcpd serve`` (the ``daemon`` fixture) and
its worker processes, and every assertion is on what an agent receives over the wire: the tool
result's ``isError``, ``content[0].text`` and ``structuredContent.error.code/details``.
The reading core itself is tested row by row in ``tests/unit/test_textread.py``.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mcpd.client.api import Client
from tests.conftest import Daemon

CALL_TIMEOUT = 30.0  # seconds: a bound against hanging the suite, never asserted on
TOOL = "files/read"


# --- helpers ------------------------------------------------------------------------------------


async def _calls(d: Daemon, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async with Client(d.url, d.token, d.cacert, timeout=CALL_TIMEOUT) as c:
        return [await c.call_tool(TOOL, a, check=False) for a in calls]


def results(d: Daemon, *calls: dict[str, Any]) -> list[dict[str, Any]]:
    """The raw ``CallToolResult`` of each call, made in order on one fresh session."""
    return asyncio.run(_calls(d, list(calls)))


def ok(result: dict[str, Any]) -> str:
    """The text of a successful result; checks its wire shape (one raw text item, no error)."""
    assert not result.get("isError"), result
    assert "structuredContent" not in result, result
    content = result["content"]
    assert len(content) == 1 and content[0]["type"] == "text", result
    text = content[0]["text"]
    assert isinstance(text, str)
    return text


def err(result: dict[str, Any], code: str) -> dict[str, Any]:
    """The ``structuredContent.error`` of a failed result; checks ``isError``, the code, and that
    ``content[0].text`` is the error's human message."""
    assert result.get("isError") is True, result
    error = result["structuredContent"]["error"]
    assert error["code"] == code, result
    assert result["content"][0] == {"type": "text", "text": error["message"]}, result
    assert isinstance(error["details"], dict)
    return dict(error)


def read(d: Daemon, path: Path | str, **args: Any) -> str:
    return ok(results(d, {"path": str(path), **args})[0])


def fail(d: Daemon, path: Path | str | None, code: str, **args: Any) -> dict[str, Any]:
    call = args if path is None else {"path": str(path), **args}
    return err(results(d, call)[0], code)


def mk(tmp_path: Path, data: bytes, name: str = "f.txt") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


WARNING = re.compile(  # the warning is its own line: one "\n" separates it from any text before it
    r"(?:^|\n)\[WARNING: File truncated: showed bytes (\d+)-(\d+) of (.*?)\. "
    r"To read more, call files/read with (\{.*\})\]$"
)


def warning_line(first: int, last: int, total: int, nxt: dict[str, Any]) -> str:
    return (f"[WARNING: File truncated: showed bytes {first}-{last} of {total} bytes total. "
            f"To read more, call files/read with {json.dumps(nxt, ensure_ascii=False)}]")


def follow(d: Daemon, args: dict[str, Any], rounds: int = 20) -> tuple[str, int]:
    """Read, then make exactly the next call each warning names, until no warning; returns the
    joined text and the number of calls."""
    got, calls = "", 0

    async def go() -> None:
        nonlocal got, calls
        nxt: dict[str, Any] | None = args
        async with Client(d.url, d.token, d.cacert, timeout=CALL_TIMEOUT) as c:
            while nxt is not None and calls < rounds:
                answer = ok(await c.call_tool(TOOL, nxt, check=False))
                calls += 1
                m = WARNING.search(answer)
                got += answer if m is None else answer[: m.start()]
                nxt = None if m is None else json.loads(m.group(4))

    asyncio.run(go())
    return got, calls


# --- precedence ---------------------------------------------------------------------------------


def test_precedence_line_mode_then_byte_mode_then_default(daemon: Daemon, tmp_path: Path) -> None:
    p = str(mk(tmp_path, b"one\ntwo\nthree\n"))
    out = [ok(r) for r in results(
        daemon,
        {"path": p, "start_line": 2, "end_line": 2, "offset": 0, "limit": 1},  # line mode wins
        {"path": p, "end_line": 1, "offset": 4},                               # end_line alone is line mode
        {"path": p, "offset": 4, "limit": 3},                                  # byte mode
        {"path": p, "limit": 3},                                               # limit alone is byte mode
        {"path": p},                                                           # default mode
    )]
    assert out == ["two\n", "one\n", "two", "one", "one\ntwo\nthree\n"]


# --- default mode -------------------------------------------------------------------------------


def test_default_mode_whole_file_up_to_10240_bytes(daemon: Daemon, tmp_path: Path) -> None:
    data = b"x" * 10239 + b"\n"
    assert read(daemon, mk(tmp_path, data)) == data.decode()


def test_default_mode_truncation_warning_exact_and_next_call_continues(daemon: Daemon, tmp_path: Path) -> None:
    data = b"".join(b"line %05d\n" % i for i in range(2200))  # 24200 bytes
    p = mk(tmp_path, data)
    answer = read(daemon, p)
    assert answer == data[:10240].decode() + "\n" + warning_line(0, 10239, 24200, {"path": str(p), "offset": 10240})
    got, calls = follow(daemon, {"path": str(p)})
    assert (got, calls) == (data.decode(), 3)


def test_default_mode_cut_back_to_whole_character_and_continuity(daemon: Daemon, tmp_path: Path) -> None:
    data = b"a" * 10239 + "€".encode() + b"tail\n"  # the cut at 10240 falls inside the euro sign
    p = mk(tmp_path, data)
    answer = read(daemon, p)
    assert answer == "a" * 10239 + "\n" + warning_line(0, 10238, len(data), {"path": str(p), "offset": 10239})
    assert "\ufffd" not in answer
    multi = ("é" * 9000 + "\n").encode() * 3  # 2-byte characters: every cut falls inside one
    q = mk(tmp_path, multi, "multi.txt")
    got, calls = follow(daemon, {"path": str(q)})
    assert got == multi.decode() and calls == 6


def test_default_mode_warning_separator_unambiguous_when_cut_after_newline(daemon: Daemon, tmp_path: Path) -> None:
    """A cut right after a line's ``\n``: the warning line still follows one added ``\n``, so an
    agent strips exactly one line break before ``[WARNING`` and never loses a newline of the file."""
    data = b"".join(b"row %011d\n" % i for i in range(1500))  # 16-byte lines: 10240 ends on a newline
    p = mk(tmp_path, data)
    answer = read(daemon, p)
    assert answer == data[:10240].decode() + "\n" + warning_line(0, 10239, 24000, {"path": str(p), "offset": 10240})
    got, calls = follow(daemon, {"path": str(p)})
    assert (got, calls) == (data.decode(), 3)


# --- byte mode ----------------------------------------------------------------------------------


def test_byte_mode_offset_alone_10240_bytes_with_warning(daemon: Daemon, tmp_path: Path) -> None:
    data = bytes(range(32, 127)) * 400  # 38000 bytes
    p = mk(tmp_path, data)
    answer = read(daemon, p, offset=100)
    nxt = {"path": str(p), "offset": 10340}
    assert answer == data[100:10340].decode() + "\n" + warning_line(100, 10339, 38000, nxt)
    got, _ = follow(daemon, {"path": str(p), "offset": 100})
    assert got == data[100:].decode()
    assert read(daemon, p, offset=30000) == data[30000:].decode()  # nothing remains: no warning


def test_byte_mode_with_limit(daemon: Daemon, tmp_path: Path) -> None:
    p = str(mk(tmp_path, b"0123456789" * 3000))
    out = [ok(r) for r in results(
        daemon,
        {"path": p, "offset": 5, "limit": 7},
        {"path": p, "limit": 3},
        {"path": p, "offset": 20000, "limit": 20000},  # more than 10240 with limit, no warning
    )]
    assert out == ["5678901", "012", "0123456789" * 1000]


def test_byte_mode_offset_at_or_past_end_is_empty(daemon: Daemon, tmp_path: Path) -> None:
    p = str(mk(tmp_path, b"abc"))
    out = [ok(r) for r in results(
        daemon, {"path": p, "offset": 3}, {"path": p, "offset": 4, "limit": 10}, {"path": p, "offset": 10**15})]
    assert out == ["", "", ""]


def test_byte_mode_two_byte_character_cut_by_limit_left_out(daemon: Daemon, tmp_path: Path) -> None:
    p = str(mk(tmp_path, "aé".encode()))  # 61 C3 A9
    q = str(mk(tmp_path, "é€x".encode(), "start.txt"))  # C3 A9 | E2 82 AC | 78
    out = [ok(r) for r in results(
        daemon,
        {"path": p, "limit": 2},       # ends between C3 and A9
        {"path": p, "limit": 3},
        {"path": q, "offset": 1},      # starts on A9
        {"path": q, "offset": 2, "limit": 2},
    )]
    assert out == ["a", "aé", "€x", ""]
    assert not any("\ufffd" in t for t in out)


# --- line mode ----------------------------------------------------------------------------------


def test_line_mode_lines_end_at_newline_only(daemon: Daemon, tmp_path: Path) -> None:
    line1 = "a\rb\fc\vd\u2028e\u0085f\u2029g"
    p = str(mk(tmp_path, (line1 + "\nsecond\n").encode()))
    r1, r2, r3 = results(daemon, {"path": p, "start_line": 1, "end_line": 1}, {"path": p, "start_line": 2},
                         {"path": p, "start_line": 3})
    assert ok(r1) == line1 + "\n"
    assert ok(r2) == "second\n"
    assert err(r3, "RANGE_OUT_OF_BOUNDS")["details"] == {"start_line": 3, "totalLines": 2}


def test_line_mode_crlf_and_missing_last_newline_byte_exact(daemon: Daemon, tmp_path: Path) -> None:
    crlf = str(mk(tmp_path, b"a\r\nb\r\nc\r\n", "crlf.txt"))
    nolf = str(mk(tmp_path, b"a\nb\nlast", "nolf.txt"))
    out = [ok(r) for r in results(
        daemon,
        {"path": crlf, "start_line": 2, "end_line": 3},
        {"path": crlf},
        {"path": nolf, "start_line": 3},
        {"path": nolf, "start_line": 2, "end_line": 5},
        {"path": nolf},
    )]
    assert out == ["b\r\nc\r\n", "a\r\nb\r\nc\r\n", "last", "b\nlast", "a\nb\nlast"]


def test_start_line_alone_reads_to_end(daemon: Daemon, tmp_path: Path) -> None:
    assert read(daemon, mk(tmp_path, b"1\n2\n3\n4\n"), start_line=3) == "3\n4\n"


def test_end_line_alone_reads_from_line_one(daemon: Daemon, tmp_path: Path) -> None:
    assert read(daemon, mk(tmp_path, b"1\n2\n3\n4\n"), end_line=2) == "1\n2\n"


def test_end_line_before_start_line_is_ignored(daemon: Daemon, tmp_path: Path) -> None:
    assert read(daemon, mk(tmp_path, b"1\n2\n3\n4\n"), start_line=3, end_line=1) == "3\n4\n"


def test_end_line_past_end_is_clamped(daemon: Daemon, tmp_path: Path) -> None:
    assert read(daemon, mk(tmp_path, b"1\n2\n3"), start_line=2, end_line=999) == "2\n3"


@pytest.mark.parametrize(("data", "lines", "last"), [(b"a\nb", 2, "b"), (b"a\nb\n", 2, "b\n"), (b"x", 1, "x"),
                                                     (b"\n\n\n", 3, "\n")])
def test_start_line_past_end_out_of_bounds_and_last_line_succeeds(
        daemon: Daemon, tmp_path: Path, data: bytes, lines: int, last: str) -> None:
    p = str(mk(tmp_path, data))
    on_last, past = results(daemon, {"path": p, "start_line": lines}, {"path": p, "start_line": lines + 1})
    assert ok(on_last) == last
    error = err(past, "RANGE_OUT_OF_BOUNDS")
    assert error["details"] == {"start_line": lines + 1, "totalLines": lines}


def test_empty_file_is_empty_in_every_mode(daemon: Daemon, tmp_path: Path) -> None:
    p = str(mk(tmp_path, b""))
    calls: list[dict[str, Any]] = [
        {"path": p}, {"path": p, "offset": 0}, {"path": p, "offset": 5, "limit": 5}, {"path": p, "limit": 1},
        {"path": p, "start_line": 1}, {"path": p, "start_line": 1, "end_line": 1}, {"path": p, "end_line": 3},
    ]
    assert [ok(r) for r in results(daemon, *calls)] == [""] * len(calls)
    assert fail(daemon, p, "RANGE_OUT_OF_BOUNDS", start_line=2)["details"] == {"start_line": 2, "totalLines": 0}


# --- long lines ---------------------------------------------------------------------------------


def test_long_line_selected_is_line_too_long_outside_selection_fine(daemon: Daemon, tmp_path: Path) -> None:
    p = str(mk(tmp_path, b"short\n" + b"L" * (64 * 1024 + 1) + b"\nafter\nend\n"))
    whole, second, around, edge = results(
        daemon, {"path": p, "start_line": 1}, {"path": p, "start_line": 2, "end_line": 2},
        {"path": p, "start_line": 3}, {"path": p, "end_line": 1})
    assert err(whole, "LINE_TOO_LONG")["details"] == {"line": 2, "offset": 6}
    assert err(second, "LINE_TOO_LONG")["details"] == {"line": 2, "offset": 6}
    assert (ok(around), ok(edge)) == ("after\nend\n", "short\n")
    exact = mk(tmp_path, b"x" * (64 * 1024) + b"\n", "exact.txt")
    assert read(daemon, exact, start_line=1) == "x" * (64 * 1024) + "\n"


# --- binary -------------------------------------------------------------------------------------


def test_binary_nul_in_first_8k_of_file_not_selection(daemon: Daemon, tmp_path: Path) -> None:
    p = str(mk(tmp_path, b"\x00\n" + b"clean line\n" * 2000))
    for r in results(daemon, {"path": p}, {"path": p, "start_line": 1500, "end_line": 1500},
                     {"path": p, "offset": 15000, "limit": 10}):
        error = err(r, "BINARY_FILE")
        assert error["message"] == "cannot read binary file"
        assert r["content"][0]["text"] == "cannot read binary file"
    late = mk(tmp_path, b"a" * 8192 + b"\x00tail", "late.txt")  # NUL past the first 8 KiB
    assert read(daemon, late, offset=8190, limit=3) == "aa\x00"


def test_binary_utf16_bom_says_otherwise(daemon: Daemon, tmp_path: Path) -> None:
    p = mk(tmp_path, codecs.BOM_UTF16_LE + "hello\nworld\n".encode("utf-16-le"))  # NUL bytes everywhere
    assert read(daemon, p) == "hello\nworld\n"
    assert read(daemon, p, start_line=2) == "world\n"
    bare = mk(tmp_path, "hello\n".encode("utf-16-le"), "bare.txt")  # no BOM: binary
    assert fail(daemon, bare, "BINARY_FILE")["message"] == "cannot read binary file"


# --- decoding -----------------------------------------------------------------------------------


def test_decoding_bom_selects_encoding_and_is_stripped(daemon: Daemon, tmp_path: Path) -> None:
    u8 = str(mk(tmp_path, codecs.BOM_UTF8 + b"first\nsecond\n", "u8.txt"))
    u16 = str(mk(tmp_path, codecs.BOM_UTF16_BE + "Ċ 😀\r\nend".encode("utf-16-be"), "u16.txt"))
    u32 = str(mk(tmp_path, codecs.BOM_UTF32_LE + "x\ny\n".encode("utf-32-le"), "u32.txt"))
    out = [ok(r) for r in results(
        daemon, {"path": u8}, {"path": u8, "start_line": 1, "end_line": 1},
        {"path": u16}, {"path": u16, "start_line": 2}, {"path": u32, "start_line": 2})]
    assert out == ["first\nsecond\n", "first\n", "Ċ 😀\r\nend", "end", "y\n"]


def test_decoding_invalid_bytes_encoding_error(daemon: Daemon, tmp_path: Path) -> None:
    p = mk(tmp_path, "Größe und Maße: café, naïve résumé.\n".encode("latin-1") * 20)
    details = fail(daemon, p, "ENCODING_ERROR")["details"]
    assert set(details) == {"requestedEncoding", "detectedEncoding"}
    assert details["requestedEncoding"] == "utf-8"
    assert isinstance(details["detectedEncoding"], str) and details["detectedEncoding"] not in ("", "utf-8")


# --- response cap -------------------------------------------------------------------------------


def test_response_cap_file_too_large_with_suggestion(daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = daemon_factory(read={"response_cap": 65536})
    p = str(mk(tmp_path, b"0123456789abcde\n" * 10000))  # 160000 bytes
    byte_mode, line_mode, fits_bytes, fits_lines = results(
        d, {"path": p, "offset": 0, "limit": 100_000}, {"path": p, "start_line": 1},
        {"path": p, "offset": 0, "limit": 65536}, {"path": p, "start_line": 1, "end_line": 4096})
    for r in (byte_mode, line_mode):
        details = err(r, "FILE_TOO_LARGE")["details"]
        assert set(details) == {"size", "limit", "suggestion"}
        assert details["limit"] == 65536 and details["size"] > 65536
        assert isinstance(details["suggestion"], str) and details["suggestion"]
    assert err(byte_mode, "FILE_TOO_LARGE")["details"]["size"] == 160000
    assert len(ok(fits_bytes)) == 65536 and len(ok(fits_lines)) == 65536


# --- file size never trusted --------------------------------------------------------------------


def test_file_size_not_trusted_proc_self_status_non_empty(daemon: Daemon) -> None:
    whole, first = results(daemon, {"path": "/proc/self/status"}, {"path": "/proc/self/status", "end_line": 1})
    text = ok(whole)
    assert text.startswith("Name:") and "\nPid:" in text and "\nVmRSS:" in text
    assert ok(first).startswith("Name:") and ok(first).count("\n") == 1


def test_file_size_not_trusted_sparse_file_range_deep_inside(daemon: Daemon, tmp_path: Path) -> None:
    p = tmp_path / "sparse.log"
    with open(p, "wb") as f:
        f.write(b"".join(b"header %04d\n" % i for i in range(1000)))  # the first 8 KiB hold no NUL
        f.seek(10 * 1024**3)  # reports 10 GiB, holds almost nothing
        f.write(b"tail line\n")
    size = p.stat().st_size
    tail, middle, whole = results(
        daemon, {"path": str(p), "offset": size - 10}, {"path": str(p), "offset": size - 5, "limit": 3},
        {"path": str(p), "offset": 0, "limit": size})
    assert (ok(tail), ok(middle)) == ("tail line\n", "lin")
    assert err(whole, "FILE_TOO_LARGE")["details"]["size"] == size


def test_file_size_not_trusted_growing_file_cut_at_cap(daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """A writer appends while the daemon reads the file to its end: no answer is over the cap."""
    d = daemon_factory(read={"response_cap": 65536})
    p = mk(tmp_path, b"start\n")
    writer = subprocess.Popen([sys.executable, "-c", "import sys\nf=open(sys.argv[1],'ab',buffering=0)\n"
                               "for _ in range(4000): f.write(b'g'*99+b'\\n')", str(p)])
    try:
        for r in results(d, *([{"path": str(p), "start_line": 1}] * 20)):
            if r.get("isError"):
                assert err(r, "FILE_TOO_LARGE")["details"]["limit"] == 65536
            else:
                text = ok(r)
                assert len(text) <= 65536 and text.startswith("start\n")
    finally:
        writer.wait(timeout=60)
    assert fail(d, p, "FILE_TOO_LARGE", start_line=1)["details"]["size"] > 65536


# --- non-regular files --------------------------------------------------------------------------


def test_non_regular_fifo_socket_dev_zero_refused_sessions_keep_working(daemon: Daemon, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "s.sock"))
    plain = mk(tmp_path, b"still here\n")

    async def go() -> list[str]:
        async with Client(daemon.url, daemon.token, daemon.cacert, timeout=CALL_TIMEOUT) as a, \
                Client(daemon.url, daemon.token, daemon.cacert, timeout=CALL_TIMEOUT) as b:
            types = []
            for path in (str(fifo), str(tmp_path / "s.sock"), "/dev/zero"):
                # a hang would end in the worker deadline's TIMEOUT, not in NOT_A_REGULAR_FILE
                error = err(await a.call_tool(TOOL, {"path": path}, check=False), "NOT_A_REGULAR_FILE")
                types.append(error["details"]["type"])
                assert ok(await a.call_tool(TOOL, {"path": str(plain)}, check=False)) == "still here\n"
                assert ok(await b.call_tool(TOOL, {"path": str(plain), "limit": 5}, check=False)) == "still"
            return types

    try:
        assert asyncio.run(go()) == ["fifo", "socket", "char device"]
    finally:
        sock.close()


def test_non_regular_fifo_with_silent_writer_never_hangs(daemon: Daemon, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen(  # holds the FIFO open for writing and never writes
        [sys.executable, "-c",
         "import os,sys,time\nfd=os.open(sys.argv[1], os.O_RDWR)\nprint('ready', flush=True)\ntime.sleep(120)",
         str(fifo)], stdout=subprocess.PIPE)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"ready\n"
        r_fifo, r_lines, r_plain = results(daemon, {"path": str(fifo)}, {"path": str(fifo), "start_line": 1},
                                           {"path": "/proc/self/status", "end_line": 1})
        assert err(r_fifo, "NOT_A_REGULAR_FILE")["details"]["type"] == "fifo"
        assert err(r_lines, "NOT_A_REGULAR_FILE")["details"]["type"] == "fifo"
        assert ok(r_plain).startswith("Name:")
    finally:
        writer.kill()
        writer.wait(timeout=10)
        if writer.stdout is not None:
            writer.stdout.close()


def test_non_regular_directory(daemon: Daemon, tmp_path: Path) -> None:
    details = fail(daemon, tmp_path, "NOT_A_REGULAR_FILE")["details"]
    assert details["type"] == "directory"


def test_file_not_found(daemon: Daemon, tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    assert fail(daemon, missing, "FILE_NOT_FOUND")["details"]["path"] == str(missing)
    assert fail(daemon, missing / "below", "FILE_NOT_FOUND", start_line=1)["details"]["path"] == str(missing / "below")


# --- argument validation (docs/REFERENCE.md §2.5 INVALID_ARGUMENT rows) --------------------------------------


@pytest.mark.parametrize(("args", "argument"), [
    ({"path": 42}, "path"),                                   # wrong type
    ({"path": "/etc/hosts", "start_line": "2"}, "start_line"),  # wrong type
    ({"path": "/etc/hosts", "limit": 1.5}, "limit"),           # wrong type
    ({"path": "/etc/hosts", "offset": True}, "offset"),        # true is not a number
    ({"path": "/etc/hosts", "privileged": "yes"}, "privileged"),
    ({"start_line": 1}, "path"),                               # missing path
    ({"path": "etc/hosts"}, "path"),                           # relative path
    ({"path": "/etc/hosts\x00.txt"}, "path"),                  # NUL byte
    ({"path": "/etc/hosts", "start_line": 0}, "start_line"),   # line < 1
    ({"path": "/etc/hosts", "end_line": -1}, "end_line"),      # line < 1
    ({"path": "/etc/hosts", "offset": -1}, "offset"),          # negative offset
    ({"path": "/etc/hosts", "limit": 0}, "limit"),
])
def test_invalid_argument_is_a_tool_error(daemon: Daemon, args: dict[str, Any], argument: str) -> None:
    error = err(results(daemon, args)[0], "INVALID_ARGUMENT")
    assert error["details"]["argument"] == argument
    assert error["message"]


# --- privileged without the root helper (docs/REFERENCE.md §4.1) ---------------------------------------------


def test_privileged_without_helper_is_helper_unavailable_never_downgraded(daemon: Daemon, tmp_path: Path) -> None:
    p = str(mk(tmp_path, b"readable by the account itself\n"))
    for r in results(daemon, {"path": p, "privileged": True}, {"path": p, "privileged": True, "start_line": 1}):
        error = err(r, "HELPER_UNAVAILABLE")
        assert "readable by the account" not in json.dumps(r)
        assert error["code"] == "HELPER_UNAVAILABLE"
    assert read(daemon, p, privileged=False) == "readable by the account itself\n"


# --- memory (slow) ------------------------------------------------------------------------------

GIB = 1024**3
BLOCK_LINES = 16384  # 64-byte lines per 1 MiB block


def _block(tag: bytes) -> bytes:
    return b"".join(b"%s %010d %s\n" % (tag, i, b"." * (63 - 12 - len(tag))) for i in range(BLOCK_LINES))


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
    return sorted(set(kids))


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


@pytest.mark.slow
def test_memory_1gb_file_line_in_middle_and_file_too_large(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    if shutil.disk_usage(tmp_path).free < 3 * GIB:
        pytest.skip("needs 3 GB of free disk space")
    d = daemon_factory(workers={"per_account": 1, "timeout_seconds": 120})
    p = tmp_path / "big.log"
    plain, marked = _block(b"plain"), _block(b"MIDDLE")
    assert len(plain) == len(marked) == 1024 * 1024
    try:
        with open(p, "wb") as f:
            for i in range(1024):
                f.write(marked if i == 512 else plain)
        mid = 512 * BLOCK_LINES + 1 + 4242  # line number inside the marked block
        warm = read(d, "/proc/self/status", end_line=1)  # spawns the one worker
        assert warm.startswith("Name:")
        workers = _children(d.pid)
        assert len(workers) == 1, workers
        w = workers[0]
        rss_before, hwm_before = _status_kb(w, "VmRSS"), _status_kb(w, "VmHWM")
        line, deep, whole_bytes, whole_lines = results(
            d, {"path": str(p), "start_line": mid, "end_line": mid},
            {"path": str(p), "offset": 1000 * 1024 * 1024 + 64 * 7, "limit": 64},
            {"path": str(p), "offset": 0, "limit": 1_000_000_000},
            {"path": str(p), "start_line": 1})
        assert _children(d.pid) == [w]  # the same worker did it all (none killed and replaced)
        rss_after, hwm_after = _status_kb(w, "VmRSS"), _status_kb(w, "VmHWM")
        assert ok(line) == "MIDDLE %010d %s\n" % (4242, "." * 45)
        assert ok(deep) == "plain %010d %s\n" % (7, "." * 46)
        for r in (whole_bytes, whole_lines):
            details = err(r, "FILE_TOO_LARGE")["details"]
            assert details["limit"] == 10 * 1024 * 1024
        assert err(whole_bytes, "FILE_TOO_LARGE")["details"]["size"] == GIB
        print(f"\nworker {w}: VmRSS {rss_before} -> {rss_after} kB, VmHWM {hwm_before} -> {hwm_after} kB "
              f"(peak growth {(hwm_after - rss_before) / 1024:.1f} MiB)")
        assert hwm_after - rss_before < 20 * 1024, "worker memory grew with the file, not the answer"
    finally:
        p.unlink(missing_ok=True)


def test_a_worker_never_answers_a_changed_file_from_its_line_index(daemon_factory: Callable[..., Daemon],
                                                                   tmp_path: Path) -> None:
    """Issue 11: the one worker of the account indexes a deep read; every change after it (append,
    truncate, rewrite in place with the old mtime put back, replace) is read afresh, over the
    real daemon."""
    d = daemon_factory(workers={"per_account": 1, "timeout_seconds": 30})
    log = tmp_path / "live.log"
    rows = [b"row %07d %s\n" % (i, b"z" * (i % 23)) for i in range(1, 150_001)]  # ~4 MiB
    log.write_bytes(b"".join(rows))

    def lines(start: int, end: int) -> dict[str, Any]:
        return {"path": str(log), "start_line": start, "end_line": end}

    def expect(start: int, end: int) -> str:
        return b"".join(rows[start - 1:end]).decode()

    first, again = results(d, lines(120_000, 120_004), lines(120_000, 120_004))
    assert ok(first) == ok(again) == expect(120_000, 120_004)
    with open(log, "ab") as f:  # a live log grows
        f.write(b"tail 1\ntail 2\n")
    rows += [b"tail 1\n", b"tail 2\n"]
    [grown] = results(d, lines(150_000, 150_002))
    assert ok(grown) == expect(150_000, 150_002)
    st = os.stat(log)
    shifted = b"".join(rows).replace(b"\n", b" ", 3000)  # same size, lines moved up
    with open(log, "r+b") as f:
        f.write(shifted)
    os.utime(log, ns=(st.st_atime_ns, st.st_mtime_ns))
    rows = [r + b"\n" for r in shifted.split(b"\n")[:-1]]
    [rewritten] = results(d, lines(120_000, 120_004))
    assert ok(rewritten) == expect(120_000, 120_004)
    with open(log, "r+b") as f:
        f.truncate(sum(len(r) for r in rows[:100_000]))
    [cut] = results(d, lines(120_000, 120_004))
    assert err(cut, "RANGE_OUT_OF_BOUNDS")["details"]["totalLines"] == 100_000
    other = tmp_path / "other.log"
    rows = [b"other %07d\n" % i for i in range(1, 130_001)]
    other.write_bytes(b"".join(rows))
    os.replace(other, log)
    [replaced] = results(d, lines(120_000, 120_004))
    assert ok(replaced) == expect(120_000, 120_004)
