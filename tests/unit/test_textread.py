"""docs/REFERENCE.md §3 (files/read) row by row, and the encoding and include_metadata arguments, against real files.

Every call goes through ``ops.run`` with the real unprivileged opener (``mcpd.core.fileopen``), so the
request frame, validation, opening, reading and the reply frame are all exercised.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from mcpd.common.config import ReadLimits
from mcpd.core import fileopen, ops, textread
from tests.support.textread import CTX, LIMITS, call, text


def error(path: Path | str, code: str, limits: ReadLimits = LIMITS, **args: Any) -> dict[str, Any]:
    reply = call(path, limits, **args)
    assert not reply["ok"], reply
    assert reply["error"]["code"] == code, reply
    return dict(reply["error"])


def mk(tmp_path: Path, data: bytes, name: str = "f.txt") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


WARNING = re.compile(r"\n?\[WARNING: File truncated: showed bytes (\d+)-(\d+) of (.*?)\. To read more, call files/read with (\{.*\})\]$")


def split_warning(answer: str) -> tuple[str, int, int, str, dict[str, Any]]:
    m = WARNING.search(answer)
    assert m, answer[-300:]
    return answer[: m.start()], int(m.group(1)), int(m.group(2)), m.group(3), json.loads(m.group(4))


# --- precedence ---------------------------------------------------------------------------------


def test_precedence_line_mode_over_byte_mode(tmp_path: Path) -> None:
    p = mk(tmp_path, b"one\ntwo\nthree\n")
    assert text(p, start_line=2, end_line=2, offset=0, limit=1) == "two\n"


def test_precedence_byte_mode_over_default_mode(tmp_path: Path) -> None:
    p = mk(tmp_path, b"one\ntwo\nthree\n")
    assert text(p, offset=4, limit=3) == "two"
    assert text(p) == "one\ntwo\nthree\n"


# --- default mode -------------------------------------------------------------------------------


def test_default_mode_whole_file_up_to_10240_bytes(tmp_path: Path) -> None:
    data = b"x" * 10239 + b"\n"
    assert text(mk(tmp_path, data)) == data.decode()


def test_default_mode_truncates_with_warning_and_next_call(tmp_path: Path) -> None:
    data = b"".join(b"line %05d\n" % i for i in range(2000))  # 22000 bytes
    p = mk(tmp_path, data)
    body, first, last, total, nxt = split_warning(text(p))
    assert body == data[:10240].decode()
    assert (first, last) == (0, 10239)
    assert total == f"{len(data)} bytes total"
    assert nxt == {"path": str(p), "offset": 10240}


def test_default_mode_warning_is_its_own_line(tmp_path: Path) -> None:
    p = mk(tmp_path, b"y" * 20000)
    answer = text(p)
    assert answer.startswith("y" * 10240 + "\n[WARNING: File truncated")


def test_default_mode_next_call_continues_exactly(tmp_path: Path) -> None:
    data = ("é" * 9000 + "\n").encode() * 3  # 2-byte characters: cuts fall inside them
    p = mk(tmp_path, data)
    got, args = "", {"path": str(p)}
    for _ in range(10):
        answer = text(args["path"], offset=args.get("offset"))
        if "[WARNING: File truncated" not in answer:
            got += answer
            break
        body, _, _, _, args = split_warning(answer)
        got += body
    assert got == data.decode()


def test_default_mode_cut_back_to_whole_character(tmp_path: Path) -> None:
    data = b"a" * 10239 + "€".encode() + b"tail"
    body, first, last, _, nxt = split_warning(text(mk(tmp_path, data)))
    assert body == "a" * 10239
    assert (first, last) == (0, 10238)
    assert nxt["offset"] == 10239


def test_default_mode_warning_repeats_encoding_argument(tmp_path: Path) -> None:
    p = mk(tmp_path, b"\xe9" * 20000)
    _, _, _, _, nxt = split_warning(text(p, encoding="latin-1"))
    assert nxt == {"path": str(p), "offset": 10240, "encoding": "latin-1"}


# --- byte mode ----------------------------------------------------------------------------------


def test_byte_mode_offset_alone_reads_10240_with_warning(tmp_path: Path) -> None:
    data = bytes(range(32, 127)) * 400  # 38000 bytes
    p = mk(tmp_path, data)
    body, first, last, total, nxt = split_warning(text(p, offset=100))
    assert body == data[100:10340].decode()
    assert (first, last, total) == (100, 10339, "38000 bytes total")
    assert nxt == {"path": str(p), "offset": 10340}


def test_byte_mode_offset_alone_no_warning_when_nothing_remains(tmp_path: Path) -> None:
    data = b"z" * 15000
    assert text(mk(tmp_path, data), offset=5000) == "z" * 10000


def test_byte_mode_with_limit(tmp_path: Path) -> None:
    p = mk(tmp_path, b"0123456789" * 3000)
    assert text(p, offset=5, limit=7) == "5678901"
    assert text(p, limit=3) == "012"
    assert text(p, offset=20000, limit=20000) == ("0123456789" * 1000)  # no warning with limit


def test_byte_mode_offset_at_or_past_end_is_empty(tmp_path: Path) -> None:
    p = mk(tmp_path, b"abc")
    assert text(p, offset=3) == ""
    assert text(p, offset=4, limit=10) == ""
    assert text(p, offset=10**15) == ""


def test_byte_mode_character_cut_by_limit_left_out(tmp_path: Path) -> None:
    p = mk(tmp_path, "aé".encode())  # a, then C3 A9
    assert text(p, limit=2) == "a"
    assert text(p, limit=3) == "aé"


def test_byte_mode_character_cut_at_start_left_out(tmp_path: Path) -> None:
    p = mk(tmp_path, "é€x".encode())  # C3 A9 | E2 82 AC | 78
    assert text(p, offset=1) == "€x"
    assert text(p, offset=2, limit=3) == "€"
    assert text(p, offset=3) == "x"
    assert text(p, offset=4) == "x"
    assert text(p, offset=2, limit=2) == ""


def test_byte_mode_invalid_bytes_inside_window_are_an_error(tmp_path: Path) -> None:
    p = mk(tmp_path, b"abc\xffdef")
    error(p, "ENCODING_ERROR", offset=1, limit=5)


# --- line mode ----------------------------------------------------------------------------------


def test_line_mode_crlf_byte_exact(tmp_path: Path) -> None:
    p = mk(tmp_path, b"a\r\nb\r\nc\r\n")
    assert text(p, start_line=2, end_line=3) == "b\r\nc\r\n"


def test_line_mode_missing_last_newline_byte_exact(tmp_path: Path) -> None:
    p = mk(tmp_path, b"a\nb\nlast")
    assert text(p, start_line=3) == "last"
    assert text(p, start_line=2, end_line=5) == "b\nlast"


def test_line_mode_only_newline_ends_lines(tmp_path: Path) -> None:
    line1 = "a\rb\fc\vd\u2028e\u0085f\u2029g\x1c"
    p = mk(tmp_path, (line1 + "\nsecond\n").encode())
    assert text(p, start_line=1, end_line=1) == line1 + "\n"
    assert text(p, start_line=2) == "second\n"
    assert error(p, "RANGE_OUT_OF_BOUNDS", start_line=3)["details"]["totalLines"] == 2


def test_start_line_alone_reads_to_end(tmp_path: Path) -> None:
    p = mk(tmp_path, b"1\n2\n3\n4\n")
    assert text(p, start_line=3) == "3\n4\n"


def test_end_line_alone_reads_from_line_one(tmp_path: Path) -> None:
    p = mk(tmp_path, b"1\n2\n3\n4\n")
    assert text(p, end_line=2) == "1\n2\n"


def test_end_line_before_start_line_is_ignored(tmp_path: Path) -> None:
    p = mk(tmp_path, b"1\n2\n3\n4\n")
    assert text(p, start_line=3, end_line=1) == "3\n4\n"


def test_end_line_past_end_is_clamped(tmp_path: Path) -> None:
    p = mk(tmp_path, b"1\n2\n3")
    assert text(p, start_line=2, end_line=999) == "2\n3"


@pytest.mark.parametrize(("data", "lines"), [(b"a\nb", 2), (b"a\nb\n", 2), (b"\n", 1), (b"x", 1), (b"\n\n\n", 3)])
def test_start_line_past_end_out_of_bounds(tmp_path: Path, data: bytes, lines: int) -> None:
    p = mk(tmp_path, data)
    assert text(p, start_line=lines, end_line=lines) != "" or data.endswith(b"\n\n")
    err = error(p, "RANGE_OUT_OF_BOUNDS", start_line=lines + 1)
    assert err["details"] == {"start_line": lines + 1, "totalLines": lines}


def test_start_line_on_last_line_succeeds(tmp_path: Path) -> None:
    p = mk(tmp_path, b"a\nb\n")
    assert text(p, start_line=2) == "b\n"
    error(p, "RANGE_OUT_OF_BOUNDS", start_line=3)


def test_empty_file_is_empty_in_every_mode(tmp_path: Path) -> None:
    p = mk(tmp_path, b"")
    assert text(p) == ""
    assert text(p, offset=0) == ""
    assert text(p, offset=5, limit=5) == ""
    assert text(p, start_line=1) == ""
    assert text(p, end_line=3) == ""
    assert text(p, start_line=1, end_line=1, include_metadata=True) == ""
    assert error(p, "RANGE_OUT_OF_BOUNDS", start_line=2)["details"]["totalLines"] == 0


def test_line_mode_range_across_chunk_boundaries(tmp_path: Path) -> None:
    lines = [b"%07d %s\n" % (i, b"q" * (i % 50)) for i in range(120000)]  # about 4.4 MB
    p = mk(tmp_path, b"".join(lines))
    assert text(p, start_line=100001, end_line=100003) == b"".join(lines[100000:100003]).decode()
    assert text(p, start_line=119999).encode() == b"".join(lines[119998:])


# --- long lines ---------------------------------------------------------------------------------


def test_long_line_selected_is_line_too_long(tmp_path: Path) -> None:
    data = b"short\n" + b"L" * (64 * 1024 + 1) + b"\nafter\n"
    err = error(mk(tmp_path, data), "LINE_TOO_LONG", start_line=1)
    assert err["details"] == {"line": 2, "offset": 6}


def test_long_line_exactly_at_limit_is_fine(tmp_path: Path) -> None:
    data = b"x" * (64 * 1024) + b"\n"
    assert len(text(mk(tmp_path, data), start_line=1)) == 64 * 1024 + 1


def test_long_line_outside_selection_does_not_matter(tmp_path: Path) -> None:
    data = b"a\n" + b"L" * 200_000 + b"\nb\nc\n"
    p = mk(tmp_path, data)
    assert text(p, start_line=3, end_line=4) == "b\nc\n"
    assert text(p, end_line=1) == "a\n"


def test_long_line_detected_among_short_lines_and_across_chunks(tmp_path: Path) -> None:
    limits = dataclasses.replace(LIMITS, max_line_bytes=100)
    short = b"".join(b"%099d\n" % i for i in range(20000))  # exactly 100-byte lines, 2 MB
    data = short + b"y" * 101 + b"\n" + short
    p = mk(tmp_path, data)
    err = error(p, "LINE_TOO_LONG", limits, start_line=1)
    assert err["details"] == {"line": 20001, "offset": len(short)}
    assert text(p, limits, start_line=20002, end_line=20002) == "%099d\n" % 0


def test_long_unterminated_last_line_is_line_too_long(tmp_path: Path) -> None:
    limits = dataclasses.replace(LIMITS, max_line_bytes=10)
    err = error(mk(tmp_path, b"ok\n" + b"z" * 11), "LINE_TOO_LONG", limits, start_line=2)
    assert err["details"] == {"line": 2, "offset": 3}


def test_long_line_in_utf16_reports_byte_offset(tmp_path: Path) -> None:
    limits = dataclasses.replace(LIMITS, max_line_bytes=10)
    p = mk(tmp_path, codecs.BOM_UTF16_LE + ("ok\n" + "w" * 6 + "\n").encode("utf-16-le"))
    err = error(p, "LINE_TOO_LONG", limits, start_line=2)
    assert err["details"] == {"line": 2, "offset": 8}
    assert text(p, limits, start_line=1, end_line=1) == "ok\n"


def test_line_mode_invalid_bytes_in_selection_only(tmp_path: Path) -> None:
    p = mk(tmp_path, b"bad \xff line\ngood line\n")
    assert text(p, start_line=2) == "good line\n"
    err = error(p, "ENCODING_ERROR", start_line=1, end_line=1)
    assert err["details"]["requestedEncoding"] == "utf-8" and err["details"]["detectedEncoding"]


# --- binary -------------------------------------------------------------------------------------


def test_binary_nul_in_first_8k(tmp_path: Path) -> None:
    err = error(mk(tmp_path, b"text\x00more\n"), "BINARY_FILE")
    assert err["message"] == "cannot read binary file"


def test_binary_decided_by_file_head_not_selection(tmp_path: Path) -> None:
    p = mk(tmp_path, b"\x00\n" + b"clean line\n" * 2000)
    error(p, "BINARY_FILE", start_line=1500, end_line=1500)
    error(p, "BINARY_FILE", offset=15000, limit=10)


def test_binary_nul_after_8k_is_not_binary(tmp_path: Path) -> None:
    p = mk(tmp_path, b"a" * 8192 + b"\x00tail")
    assert text(p, offset=8190, limit=3) == "aa\x00"


def test_binary_utf16_bom_says_otherwise(tmp_path: Path) -> None:
    data = codecs.BOM_UTF16_LE + "hello\nworld\n".encode("utf-16-le")
    assert text(mk(tmp_path, data)) == "hello\nworld\n"


# --- decoding and the encoding argument ---------------------------------------------------------


def test_decoding_utf8_bom_stripped(tmp_path: Path) -> None:
    p = mk(tmp_path, codecs.BOM_UTF8 + b"first\nsecond\n")
    assert text(p) == "first\nsecond\n"
    assert text(p, start_line=1, end_line=1) == "first\n"
    assert text(p, offset=0, limit=5) == "fi"
    assert text(p, offset=1) == "first\nsecond\n"


@pytest.mark.parametrize(("bom", "codec"), [(codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be")])
def test_decoding_utf16_bom(tmp_path: Path, bom: bytes, codec: str) -> None:
    body = "première\r\nĊ second 😀\nthird"  # U+010A encodes with a 0x0A byte
    p = mk(tmp_path, bom + body.encode(codec))
    assert text(p) == body
    assert text(p, start_line=2, end_line=2) == "Ċ second 😀\n"
    assert text(p, start_line=3) == "third"
    assert error(p, "RANGE_OUT_OF_BOUNDS", start_line=4)["details"]["totalLines"] == 3
    meta = call(p, include_metadata=True)["result"]["metadata"]
    assert (meta["encoding"], meta["lines"], meta["bom"]) == (codec, 3, True)


def test_decoding_utf16_byte_window_cut_characters_left_out(tmp_path: Path) -> None:
    p = mk(tmp_path, codecs.BOM_UTF16_LE + "ab😀c".encode("utf-16-le"))  # BOM, a, b, surrogate pair, c
    assert text(p, offset=3, limit=4) == "b"  # starts mid-'a', ends mid-pair
    assert text(p, offset=8) == "c"  # starts on the low surrogate


@pytest.mark.parametrize(("bom", "codec"), [(codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be")])
def test_decoding_utf32_bom(tmp_path: Path, bom: bytes, codec: str) -> None:
    p = mk(tmp_path, bom + "x\ny\n".encode(codec))
    assert text(p) == "x\ny\n"
    assert text(p, start_line=2) == "y\n"


def test_decoding_utf16_requested_without_bom(tmp_path: Path) -> None:
    p = mk(tmp_path, "plain\nutf16\n".encode("utf-16-le"))
    error(p, "BINARY_FILE")
    assert text(p, encoding="utf-16", start_line=2) == "utf16\n"


def test_decoding_invalid_utf8_names_detected_encoding(tmp_path: Path) -> None:
    p = mk(tmp_path, "Größe und Maße: café, naïve résumé.\n".encode("latin-1") * 20)
    err = error(p, "ENCODING_ERROR")
    assert err["details"]["requestedEncoding"] == "utf-8"
    detected = err["details"]["detectedEncoding"]
    assert detected not in ("utf-8", "unknown")
    assert text(p, encoding="auto").startswith("Größe")


def test_decoding_latin1(tmp_path: Path) -> None:
    p = mk(tmp_path, bytes(range(0x20, 0x100)) + b"\n")
    assert text(p, encoding="latin-1") == bytes(range(0x20, 0x100)).decode("latin-1") + "\n"


def test_decoding_cp1252_defined_and_undefined_bytes(tmp_path: Path) -> None:
    assert text(mk(tmp_path, b"price \x80 5\n"), encoding="cp1252") == "price € 5\n"
    for bad in (0x81, 0x8D, 0x8F, 0x90, 0x9D):
        err = error(mk(tmp_path, b"x " + bytes([bad]) + b"\n", f"b{bad}"), "ENCODING_ERROR", encoding="cp1252")
        assert err["details"]["requestedEncoding"] == "cp1252"


def test_decoding_ascii_rejects_high_bytes(tmp_path: Path) -> None:
    error(mk(tmp_path, "é\n".encode()), "ENCODING_ERROR", encoding="ascii")
    assert text(mk(tmp_path, b"plain\n", "a.txt"), encoding="ascii") == "plain\n"


def test_decoding_auto_prefers_bom_then_utf8(tmp_path: Path) -> None:
    assert text(mk(tmp_path, "ünïcode\n".encode()), encoding="auto") == "ünïcode\n"
    p = mk(tmp_path, codecs.BOM_UTF16_BE + "bom\n".encode("utf-16-be"), "b.txt")
    assert text(p, encoding="auto") == "bom\n"
    meta = call(mk(tmp_path, "ünïcode\n".encode(), "c.txt"), encoding="auto", include_metadata=True)
    assert meta["result"]["metadata"]["encoding"] == "utf-8"


def test_decoding_bom_wins_over_requested_encoding(tmp_path: Path) -> None:
    p = mk(tmp_path, codecs.BOM_UTF8 + "é\n".encode())
    assert text(p, encoding="latin-1") == "é\n"


# --- response cap and file size -----------------------------------------------------------------


SMALL_CAP = dataclasses.replace(LIMITS, response_cap=64 * 1024)


def test_response_cap_line_mode_file_too_large(tmp_path: Path) -> None:
    p = mk(tmp_path, b"0123456789abcde\n" * 10000)  # 160000 bytes
    err = error(p, "FILE_TOO_LARGE", SMALL_CAP, start_line=1)
    assert err["details"]["limit"] == 64 * 1024
    assert err["details"]["size"] > 64 * 1024
    assert err["details"]["suggestion"]
    assert len(text(p, SMALL_CAP, start_line=1, end_line=4096)) == 65536


def test_response_cap_byte_mode_file_too_large(tmp_path: Path) -> None:
    p = mk(tmp_path, b"a" * 100_000)
    err = error(p, "FILE_TOO_LARGE", SMALL_CAP, offset=0, limit=100_000)
    assert err["details"] == {"size": 100_000, "limit": 65536, "suggestion": err["details"]["suggestion"]}
    assert len(text(p, SMALL_CAP, offset=50_000, limit=10**9)) == 50_000  # the answer fits


def test_file_size_not_trusted_proc_file_read_to_eof() -> None:
    assert os.stat("/proc/self/status").st_size == 0
    answer = text("/proc/self/status")
    assert answer.startswith("Name:") and "\nPid:" in answer
    assert text("/proc/self/status", start_line=1, end_line=1).startswith("Name:")


@pytest.mark.skipif(not os.access("/proc/kallsyms", os.R_OK), reason="no /proc/kallsyms")
def test_file_size_not_trusted_zero_size_file_cut_at_cap() -> None:
    """``/proc/kallsyms`` reports size 0 but holds megabytes: default mode says the total is
    unknown, and a whole-file line read stops at the cap."""
    _, first, last, total, nxt = split_warning(text("/proc/kallsyms"))
    assert (first, last, nxt["offset"]) == (0, 10239, 10240)
    assert "unknown" in total
    error("/proc/kallsyms", "FILE_TOO_LARGE", SMALL_CAP, start_line=1)


def test_file_size_not_trusted_growing_file_cut_at_cap(tmp_path: Path) -> None:
    """A writer appends while the file is read to its end: the answer is never over the cap."""
    p = mk(tmp_path, b"start\n")
    writer = subprocess.Popen(
        [sys.executable, "-c", "import sys\nf=open(sys.argv[1],'ab',buffering=0)\nfor _ in range(4000): f.write(b'g'*99+b'\\n')", str(p)]
    )
    try:
        for _ in range(20):
            reply = call(p, SMALL_CAP, start_line=1)
            if reply["ok"]:
                assert len(reply["result"]["text"]) <= 64 * 1024
                assert reply["result"]["text"].startswith("start\n")
            else:
                assert reply["error"]["code"] == "FILE_TOO_LARGE"
    finally:
        writer.wait(timeout=60)
    error(p, "FILE_TOO_LARGE", SMALL_CAP, start_line=1)


def test_sparse_file_huge_size_range_deep_inside(tmp_path: Path) -> None:
    p = tmp_path / "sparse.log"
    with open(p, "wb") as f:
        f.write(b"".join(b"header %d\n" % i for i in range(1000)))
        f.seek(4 * 1024**3)  # a 4 GiB hole
        f.write(b"tail line\n")
    size = p.stat().st_size
    assert text(p, start_line=2, end_line=3) == "header 1\nheader 2\n"
    assert text(p, offset=size - 10) == "tail line\n"
    assert text(p, offset=size - 5, limit=3) == "lin"
    error(p, "FILE_TOO_LARGE", offset=0, limit=size)
    error(p, "FILE_TOO_LARGE", include_metadata=True)  # never hashes 4 GiB
    err = error(p, "LINE_TOO_LONG", start_line=1001, end_line=1001)  # the hole is one NUL line
    assert err["details"]["line"] == 1001


# --- non-regular files --------------------------------------------------------------------------


def refused_at_once(path: str) -> dict[str, Any]:
    box: list[dict[str, Any]] = []
    t = threading.Thread(target=lambda: box.append(call(path)), daemon=True)
    t.start()
    t.join(30)  # a bound against hanging the suite, not a timing assertion
    assert box, f"reading {path} hung"
    err: dict[str, Any] = box[0]["error"]
    assert err["code"] == "NOT_A_REGULAR_FILE"
    return err


def test_non_regular_fifo_without_writer_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert refused_at_once(str(fifo))["details"]["type"] == "fifo"


def test_non_regular_fifo_data_never_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    w = os.open(fifo, os.O_WRONLY)
    try:
        os.write(w, b"secret")
        refused_at_once(str(fifo))
        assert os.read(r, 100) == b"secret"
    finally:
        os.close(w)
        os.close(r)


def test_non_regular_dev_zero_refused_at_once() -> None:
    assert refused_at_once("/dev/zero")["details"]["type"] == "char device"


def test_non_regular_directory_and_socket(tmp_path: Path) -> None:
    assert refused_at_once(str(tmp_path))["details"]["type"] == "directory"
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "s.sock"))
        assert refused_at_once(str(tmp_path / "s.sock"))["details"]["type"] == "socket"
    finally:
        sock.close()


def test_file_not_found(tmp_path: Path) -> None:
    err = error(tmp_path / "missing", "FILE_NOT_FOUND")
    assert err["details"]["path"] == str(tmp_path / "missing")
    error(tmp_path / "missing" / "below", "FILE_NOT_FOUND")


def test_open_directory_returns_a_directory_descriptor(tmp_path: Path) -> None:
    fd = fileopen.open_directory(str(tmp_path))
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path))
    finally:
        os.close(fd)


# --- ops.run ------------------------------------------------------------------------------------


def test_ops_run_invalid_argument_is_a_reply(tmp_path: Path) -> None:
    assert error("relative/path", "INVALID_ARGUMENT")["message"] == "path must be absolute"
    reply = ops.run({"id": 1, "op": "files/delete", "args": {}}, CTX)
    assert reply == {"id": 1, "ok": False, "error": reply["error"]} and reply["error"]["code"] == "INVALID_ARGUMENT"
    assert ops.run("junk", CTX)["error"]["code"] == "INVALID_ARGUMENT"


def test_ops_run_unexpected_exception_is_generic_internal_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ctx = dataclasses.replace(CTX, open_file=lambda path: int("not a descriptor, " + path))
    reply = ops.run({"id": 3, "op": "files/read", "args": {"path": str(tmp_path / "x")}}, ctx)
    assert reply == {"id": 3, "ok": False, "error": {"code": "INTERNAL_ERROR", "message": "internal error", "details": {}}}
    assert "Traceback" in caplog.text or caplog.records[0].exc_info


def test_ops_run_grant_filter_refuses_before_opening(tmp_path: Path) -> None:
    p = mk(tmp_path, b"x")
    ctx = dataclasses.replace(CTX, allow=lambda path: path.startswith("/nowhere/"))
    reply = ops.run({"id": 1, "op": "files/read", "args": {"path": str(p)}}, ctx)
    assert reply["error"]["code"] == "PERMISSION_DENIED"
    assert reply["error"]["details"]["reason"] == "no grant covers this path"


def test_ops_run_closes_the_descriptor(tmp_path: Path) -> None:
    p = mk(tmp_path, b"\x00binary")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        call(p)
        call(mk(tmp_path, b"ok\n", "ok.txt"))
    assert len(os.listdir("/proc/self/fd")) == before


# --- include_metadata ---------------------------------------------------------------------------


def test_include_metadata_fields(tmp_path: Path) -> None:
    data = b"#!/usr/bin/env python3\nprint('hi')\nx = 1"
    p = mk(tmp_path, data, "tool")
    os.utime(p, (0, 1700000000))
    meta = call(p, include_metadata=True)["result"]["metadata"]
    st = os.stat(p)
    ident = {"fileId": meta.pop("fileId"), "version": meta.pop("version")}
    assert ident == {k: v for k, v in call(p, encoding="base64")["result"]["metadata"].items() if k in ident}
    os.utime(p, (0, 1700000001))  # a write's new mtime: a new version of the same file
    assert call(p, encoding="base64")["result"]["metadata"]["fileId"] == ident["fileId"]
    assert call(p, encoding="base64")["result"]["metadata"]["version"] != ident["version"]
    assert st.st_size == len(data)
    assert meta == {
        "path": str(p),
        "size": len(data),
        "lines": 3,
        "encoding": "utf-8",
        "bom": False,
        "language": "python",
        "lastModified": "2023-11-14T22:13:20Z",
        "sha256": hashlib.sha256(data).hexdigest(),
        "byteRange": {"start": 0, "end": len(data)},
    }


def test_include_metadata_selection(tmp_path: Path) -> None:
    p = mk(tmp_path, b"a\nb\nc\nd\n", "conf.yaml")
    meta = call(p, start_line=2, end_line=3, include_metadata=True)["result"]["metadata"]
    assert meta["linesReturned"] == 2 and meta["totalLines"] == 4 and meta["lines"] == 4
    assert meta["lineRange"] == {"start": 2, "end": 3}
    assert meta["language"] == "yaml"


def test_include_metadata_absent_by_default(tmp_path: Path) -> None:
    assert call(mk(tmp_path, b"x"))["result"] == {"text": "x"}


@pytest.mark.parametrize(
    ("name", "head", "language"),
    [
        ("m.py", b"", "python"),
        ("m.pyi", b"", "python-stub"),
        ("etc/nginx/sites-enabled/default", b"server {", "nginx"),
        ("etc/nginx/conf.d/site.conf", b"", "nginx"),
        ("run", b"#!/bin/bash\n", "shell"),
        ("run2", b"#!/usr/bin/env -S node --x\n", "javascript"),
        ("a.json", b"{}", "json"),
        ("README.md", b"", "markdown"),
        ("pyproject.toml", b"", "toml"),
        ("x.c", b"", "c"),
        ("app.js", b"", "javascript"),
        ("setup.cfg", b"", "ini"),
        ("notes", b"hello", "text"),
    ],
)
def test_include_metadata_language(tmp_path: Path, name: str, head: bytes, language: str) -> None:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(head)
    assert call(p, include_metadata=True)["result"]["metadata"]["language"] == language


# --- memory: a range deep inside a big file -----------------------------------------------------

_PEAK = r"""
import json, os, sys
from mcpd.core import fileopen
from mcpd.core import ops
from mcpd.common.config import ReadLimits
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
ctx = ops.OpContext(ReadLimits(), fileopen.open_regular, fileopen.open_directory)
base = hwm()
out = []
for args in json.loads(sys.argv[1]):
    out.append(ops.run({"id": 1, "op": "files/read", "args": args}, ctx))
print(json.dumps({"growth": hwm() - base, "replies": out}))
"""


def big_file(path: Path, size: int) -> int:
    """Write ``size`` bytes of numbered 64-byte lines fast (a repeated 1 MiB block); returns lines."""
    block = b"".join(b"%063d\n" % i for i in range(16384))  # 1 MiB
    with open(path, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
    return size // 64


def peak(argv: list[dict[str, Any]]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _PEAK, json.dumps(argv)], capture_output=True, text=True, timeout=600, check=True)
    res: dict[str, Any] = json.loads(done.stdout)
    return res


def test_memory_range_deep_in_generated_file(tmp_path: Path) -> None:
    p = tmp_path / "big.log"
    lines = big_file(p, 64 * 1024 * 1024)
    mid = lines // 2 + 5
    res = peak([{"path": str(p), "start_line": mid, "end_line": mid + 1}])
    assert res["replies"][0]["result"]["text"] == "%063d\n%063d\n" % ((mid - 1) % 16384, mid % 16384)
    print(f"peak RSS growth reading line {mid} of a 64 MiB file: {res['growth'] / 1e6:.1f} MB")


@pytest.mark.slow
def test_memory_proportional_to_answer_1gb(tmp_path: Path) -> None:
    p = tmp_path / "huge.log"
    lines = big_file(p, 1024**3)
    mid = lines // 2 + 3
    res = peak(
        [
            {"path": str(p), "start_line": mid, "end_line": mid},
            {"path": str(p), "offset": 512 * 1024**2, "limit": 1_000_000_000},
            {"path": str(p), "start_line": mid},
        ]
    )
    first, second, third = res["replies"]
    assert first["result"]["text"] == "%063d\n" % ((mid - 1) % 16384)
    assert second["error"]["code"] == "FILE_TOO_LARGE"
    assert third["error"]["code"] == "FILE_TOO_LARGE"
    print(f"peak RSS growth over 1 GiB reads: {res['growth'] / 1e6:.1f} MB")
    assert res["growth"] < 20 * 1024 * 1024


@pytest.mark.parametrize("offset", [2 ** 63 - 1, 2 ** 63, 2 ** 64, 10 ** 30])
def test_an_offset_past_any_file_reads_empty_however_large(tmp_path: Path, offset: int) -> None:
    """docs/REFERENCE.md §3: ``offset`` at or past the end answers ``""``, however large (2^64 included): the
    kernel's offset limit is not the client's problem."""
    p = tmp_path / "small.txt"
    p.write_text("hello\n")
    for extra in ({}, {"limit": 5}):
        reply = call(p, offset=offset, **extra)
        assert reply["ok"] is True and reply["result"]["text"] == "", reply


@pytest.mark.parametrize("size", [0, 1, 4096, textread.BINARY_PROBE - 1, textread.BINARY_PROBE,
                                  textread.BINARY_PROBE + 1, 3 * textread.BINARY_PROBE])
@pytest.mark.parametrize("window", [{}, {"offset": 0, "limit": 100}, {"offset": 4000, "limit": 5000},
                                    {"offset": 8000, "limit": 191}, {"offset": 8000, "limit": 192},
                                    {"offset": 8191, "limit": 1}, {"offset": 20000, "limit": 10}])
def test_a_byte_window_is_the_file_bytes_whether_or_not_the_head_read_holds_it(
        tmp_path: Path, size: int, window: dict[str, int]) -> None:
    """The head read for the binary check answers the window when it holds it (a small file is read
    once), and the window is read from the file otherwise: the same bytes either way."""
    data = bytes(48 + i % 61 for i in range(size))  # printable ASCII, no line ends
    p = mk(tmp_path, data)
    offset, limit = window.get("offset", 0), window.get("limit", LIMITS.default_bytes)
    got = text(p, **window)
    shown = WARNING.sub("", got)
    assert shown == data[offset:offset + limit].decode()
    assert (shown != got) == (not window and size > LIMITS.default_bytes)  # the default window says it cut


def test_a_file_smaller_than_the_head_read_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = mk(tmp_path, b"x" * 4096)
    reads: list[int] = []
    real = os.pread

    def counting(fd: int, n: int, pos: int) -> bytes:
        reads.append(pos)
        return real(fd, n, pos)

    monkeypatch.setattr(os, "pread", counting)
    assert text(p) == "x" * 4096
    assert reads == [0]  # the head read, short at the file's size: its end, and the window, with no more reads


def test_a_file_that_reports_no_size_is_read_to_its_end(tmp_path: Path) -> None:
    """``/proc`` files say 0 bytes and come in pieces: read on until a read returns nothing."""
    status = text("/proc/self/status", limit=100000)
    assert status.startswith("Name:") and "VmRSS" in status and status.endswith("\n")
    maps = text("/proc/self/maps", limit=1 << 20)  # over one page: more than one read
    assert len(maps) > 4096 and maps.endswith("\n")
