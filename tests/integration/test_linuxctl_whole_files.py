"""`linuxctl get files` prints whole files byte for byte, against the real daemon.

The file is paged through files/read (1 MiB pages under the 10 MiB response cap), so these files
are chosen to cross the 10 KiB default window, page edges inside multi-byte characters, the
response cap itself (the no-metadata path), a byte-order mark, a file growing and one shrinking
while it is read, and --max-bytes.
"""

from __future__ import annotations

import fcntl
import os
import pty
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mcpd.client import pager
from tests.support.linuxctl import LINUXCTL, flags, linuxctl, make_file

MiB = 1024 * 1024


def env_for(daemon: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MCPD_URL", "MCP_TOKEN", "MCPD_CACERT")}
    env["XDG_CONFIG_HOME"] = "/nonexistent-linuxctl-config"
    return env


def assert_cmp_same(out: bytes, path: Path, tmp_path: Path) -> None:
    """Compare with cmp(1), as the issue asks, and with == for a readable diff."""
    copy = tmp_path / (path.name + ".copy")
    copy.write_bytes(out)
    assert subprocess.run(["cmp", str(copy), str(path)], capture_output=True).returncode == 0
    assert out == path.read_bytes()


def log_bytes(size: int) -> bytes:
    """A log of about ``size`` bytes: multi-byte characters everywhere, some CRLF, no final newline."""
    parts, n, i = [], 0, 0
    while n < size:
        line = f"{i:08d} caf\u00e9 cr\u00e8me \u2028 \U0001f600 {'x' * (i % 97)}{chr(13) if i % 7 == 0 else ''}\n"
        b = line.encode()
        parts.append(b)
        n, i = n + len(b), i + 1
    return b"".join(parts) + b"last line, no newline"



def read_while_page_one_is_written(proc: subprocess.Popen[bytes]) -> bytes:
    """Read from ``linuxctl get files``'s stdout all of page 1 but more than its pipe holds.

    linuxctl asks for page 2 only once page 1 is all in the pipe, so when this returns linuxctl
    is still writing page 1 and the test may change the file before page 2 is read (reading all
    but one byte would not do: linuxctl's write ends as soon as the rest fits in the pipe).
    """
    assert proc.stdout is not None and proc.stderr is not None
    short = pager.PAGE_BYTES - 2 * fcntl.fcntl(proc.stdout.fileno(), fcntl.F_GETPIPE_SZ)
    got = b""
    while len(got) < short:
        chunk = proc.stdout.read(short - len(got))
        assert chunk, proc.stderr.read()
        got += chunk
    return got

def test_five_mib_log_byte_exact(daemon: Any, tmp_path: Path) -> None:
    path = make_file(tmp_path, "big.log", log_bytes(5 * MiB))
    res = linuxctl(*flags(daemon), "get", "files", str(path))
    assert res.returncode == 0, res.stderr
    assert res.stderr == b""  # no terminal: no progress
    assert_cmp_same(res.stdout, path, tmp_path)


@pytest.mark.parametrize("data", [
    b"abc",
    b"one\r\ntwo\r\nthree without newline",
    b"",
    "\ufeffwith a UTF-8 byte-order mark\r\n".encode(),
    "\ufeffUTF-16 with its mark\n".encode("utf-16"),
    bytes(range(1, 128)) + "\u2028\u0085\x0c\x0b\r".encode(),  # every control byte but NUL, NEL, LS
], ids=["3-bytes", "crlf-no-final-newline", "empty", "utf8-bom", "utf16-bom", "controls"])
def test_small_files_byte_exact(daemon: Any, tmp_path: Path, data: bytes) -> None:
    path = make_file(tmp_path, "small.txt", data)
    res = linuxctl(*flags(daemon), "get", "files", str(path))
    assert res.returncode == 0, res.stderr
    assert_cmp_same(res.stdout, path, tmp_path)


def test_page_edges_inside_characters(daemon: Any, tmp_path: Path) -> None:
    # 4-byte characters after a 1-, 2- and 3-byte shift: every page edge falls inside one
    for shift in (1, 2, 3):
        data = b"a" * shift + "\U0001f600".encode() * (pager.PAGE_BYTES // 4 + 10) + b"end"
        path = make_file(tmp_path, f"emoji{shift}.txt", data)
        res = linuxctl(*flags(daemon), "get", "files", str(path))
        assert res.returncode == 0, res.stderr
        assert res.stdout == data


def test_file_over_the_response_cap_with_bom(daemon: Any, tmp_path: Path) -> None:
    """Over 10 MiB the server gives no metadata: the size comes from its refusal, the BOM from the notice."""
    data = b"\xef\xbb\xbf" + ("r\u00e9sum\u00e9 \u20ac\r\n" * (12 * MiB // 16)).encode()
    path = make_file(tmp_path, "huge.txt", data)
    res = linuxctl(*flags(daemon), "get", "files", str(path))
    assert res.returncode == 0, res.stderr
    assert_cmp_same(res.stdout, path, tmp_path)


def test_latin1_file_with_encoding_is_its_own_bytes(daemon: Any, tmp_path: Path) -> None:
    data = "caf\u00e9 cr\u00e8me\n".encode("latin-1") * 2000  # over the 10 KiB window, not UTF-8
    path = make_file(tmp_path, "latin1.txt", data)
    as_bytes = linuxctl(*flags(daemon), "get", "files", str(path))  # not UTF-8: read on as bytes
    assert as_bytes.returncode == 0 and as_bytes.stderr == b"" and as_bytes.stdout == data
    res = linuxctl(*flags(daemon), "get", "files", str(path), "--encoding", "latin-1")
    assert res.returncode == 0, res.stderr
    assert res.stdout == data


def test_offset_alone_prints_the_rest_never_a_notice(daemon: Any, tmp_path: Path) -> None:
    data = log_bytes(50_000)
    path = make_file(tmp_path, "rest.txt", data)
    res = linuxctl(*flags(daemon), "get", "files", str(path), "--offset", "100")
    assert res.returncode == 0, res.stderr
    assert res.stdout == data[100:]
    assert b"[WARNING" not in res.stdout
    ranged = linuxctl(*flags(daemon), "get", "files", str(path), "--offset", "100", "--limit", "20000")
    assert ranged.stdout == data[100:20100]


def test_max_bytes_refuses_bigger_files(daemon: Any, tmp_path: Path) -> None:
    path = make_file(tmp_path, "twenty-k.txt", b"z" * 20_000)
    res = linuxctl(*flags(daemon), "get", "files", str(path), "--max-bytes", "10000")
    assert res.returncode == 1
    assert res.stdout == b""
    assert res.stderr.startswith(b"FILE_TOO_BIG: ") and b"--max-bytes" in res.stderr
    ok = linuxctl(*flags(daemon), "get", "files", str(path), "--max-bytes", "20000")
    assert (ok.returncode, ok.stdout) == (0, b"z" * 20_000)
    big = make_file(tmp_path, "over-cap.txt", b"q" * (11 * MiB))  # refused before any page of content
    res = linuxctl(*flags(daemon), "get", "files", str(big), "--max-bytes", str(10 * MiB))
    assert (res.returncode, res.stdout) == (1, b"")


def test_growing_file_ends_at_the_size_seen_first(daemon: Any, tmp_path: Path) -> None:
    initial = log_bytes(24 * MiB)
    path = make_file(tmp_path, "growing.log", initial)
    stop = threading.Event()

    def grow() -> None:
        deadline = time.monotonic() + 60
        with open(path, "ab") as f:
            while not stop.is_set() and time.monotonic() < deadline:
                f.write(b"appended line\n" * 4096)
                f.flush()
                time.sleep(0.01)

    writer = threading.Thread(target=grow)
    writer.start()
    try:
        res = linuxctl(*flags(daemon), "get", "files", str(path))
    finally:
        stop.set()
        writer.join()
    assert res.returncode == 0, res.stderr
    final = path.read_bytes()
    assert len(final) > len(res.stdout) >= len(initial)  # ended although the file kept growing
    assert res.stdout == final[: len(res.stdout)]


def test_file_shrinking_while_read_is_an_error(daemon: Any, tmp_path: Path) -> None:
    path = make_file(tmp_path, "shrinks.txt", b"s" * (3 * pager.PAGE_BYTES))
    with subprocess.Popen([LINUXCTL, *flags(daemon), "get", "files", str(path)], env=env_for(daemon),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            got = read_while_page_one_is_written(proc)
            os.truncate(path, 1000)
            got += proc.stdout.read()
            err = proc.stderr.read()
            assert proc.wait(timeout=60) == 1
        finally:
            if proc.poll() is None:
                proc.kill()
    assert len(got) == pager.PAGE_BYTES
    assert err.startswith(b"FILE_CHANGED: ")



@pytest.mark.parametrize("kind", ["text", "binary"])
@pytest.mark.parametrize("grown", [0, 5000, "in place"])
def test_file_replaced_while_read_is_an_error_not_a_splice(daemon: Any, tmp_path: Path, kind: str,
                                                            grown: Any) -> None:
    """mv B PATH between two pages (B the same size or larger), or the same file rewritten in
    place at its size: FILE_CHANGED and exit 1, never the first page of one file and the rest of
    another with exit 0."""
    fill = b"\0" if kind == "binary" else b""
    path = make_file(tmp_path, "replaced.dat", fill + b"a" * (3 * pager.PAGE_BYTES - len(fill)))
    extra = grown if isinstance(grown, int) else 0
    other = make_file(tmp_path, "other.dat", fill + b"b" * (3 * pager.PAGE_BYTES + extra - len(fill)))
    with subprocess.Popen([LINUXCTL, *flags(daemon), "get", "files", str(path)], env=env_for(daemon),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            got = read_while_page_one_is_written(proc)
            if grown == "in place":
                time.sleep(0.01)  # a later mtime, whatever the file system's clock grain
                with open(path, "r+b") as f:
                    f.write(other.read_bytes())
            else:
                os.rename(other, path)
            got += proc.stdout.read()
            err = proc.stderr.read()
            assert proc.wait(timeout=60) == 1, err
        finally:
            if proc.poll() is None:
                proc.kill()
    assert err.startswith(b"FILE_CHANGED: ") and (b"rewritten" if grown == "in place" else b"replaced") in err
    assert b"a" * 10 in got
    unchanged = linuxctl(*flags(daemon), "get", "files", str(path))  # the new file, left alone: copied whole
    assert unchanged.returncode == 0, unchanged.stderr
    assert unchanged.stdout == path.read_bytes()

def test_progress_on_a_terminal_only_for_large_files(daemon: Any, tmp_path: Path) -> None:
    path = make_file(tmp_path, "progress.log", log_bytes(9 * MiB))
    small = make_file(tmp_path, "small.log", b"tiny\n")
    for target, expect in ((path, True), (small, False)):
        master, slave = pty.openpty()
        try:
            proc = subprocess.run([LINUXCTL, *flags(daemon), "get", "files", str(target)], env=env_for(daemon),
                                  stdout=subprocess.PIPE, stderr=slave, timeout=60)
            os.close(slave)
            err = b""
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO once the terminal has no writer
                    break
                if not chunk:
                    break
                err += chunk
        finally:
            os.close(master)
        assert proc.returncode == 0
        assert proc.stdout == target.read_bytes()  # progress never touches stdout
        if expect:
            assert b"100%" in err and str(target.stat().st_size).encode() in err
        else:
            assert err == b""


def test_auto_encoding_pages_with_the_first_guess_or_refuses_before_printing(daemon: Any, tmp_path: Path) -> None:
    latin = b"".join(f"Gr\u00f6\u00dfe caf\u00e9 {i}\n".encode("latin-1") for i in range(400_000))  # ~6 MiB
    path = make_file(tmp_path, "latin.txt", latin)
    res = linuxctl(*flags(daemon), "get", "files", str(path), "--encoding", "auto")
    assert res.returncode == 0, res.stderr
    assert res.stdout == latin
    russian = "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u042d\u0442\u043e \u0444\u0430\u0439\u043b.\n"
    data = russian.encode("cp1251") * (pager.PAGE_BYTES // 20)  # cp1251 cannot be requested again
    path = make_file(tmp_path, "cyrillic.txt", data)
    res = linuxctl(*flags(daemon), "get", "files", str(path), "--encoding", "auto")
    assert (res.returncode, res.stdout) == (1, b"")
    assert res.stderr.startswith(b"UNSUPPORTED: ") and b"--encoding" in res.stderr


def test_character_cut_by_the_first_size_is_completed(daemon: Any, tmp_path: Path) -> None:
    """The file's size, when reading began, ended inside a character that a writer then finished."""
    head = b"x" * pager.PAGE_BYTES + b"caf\xc3"  # the first byte of the two-byte \u00e9
    path = make_file(tmp_path, "cut.txt", head)
    with subprocess.Popen([LINUXCTL, *flags(daemon), "get", "files", str(path)], env=env_for(daemon),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            got = read_while_page_one_is_written(proc)
            with open(path, "ab") as f:
                f.write(b"\xa9 and more text that is not printed\n")
            got += proc.stdout.read()
            err = proc.stderr.read()
            assert proc.wait(timeout=60) == 0, err
        finally:
            if proc.poll() is None:
                proc.kill()
    assert got == head + b"\xa9"
