"""files/grep on the unprivileged route through the real daemon: every argument and limit, the
compressed and binary files, symlinks, FIFOs, files changing while searched, RE2's linear time,
the cursor, progress and cancellation, and ``linuxctl grep``."""

from __future__ import annotations

import asyncio
import bz2
import gzip
import hashlib
import json
import lzma
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zstandard

from mcpd.client.api import Client
from tests.conftest import Daemon, SseSession
from tests.support.linuxctl import flags, linuxctl
from tests.support.workers import messages_for, worker_pids

CALL_TIMEOUT = 60.0


def run(d: Any, fn: Callable[[Client], Any]) -> Any:
    async def go() -> Any:
        async with Client(d.url, d.token, d.cacert, timeout=CALL_TIMEOUT) as c:
            return await fn(c)

    return asyncio.run(go())


def grep(d: Any, **args: Any) -> dict[str, Any]:
    """The whole ``CallToolResult`` of one files/grep call."""
    return dict(run(d, lambda c: c.call_tool("files/grep", args, check=False)))


def found(res: dict[str, Any]) -> list[tuple[str, int, str]]:
    assert not res.get("isError"), res
    return [(m["path"], m["line"], m["text"]) for m in res["structuredContent"]["matches"]]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "a.txt").write_text("hello world\nfoo.bar\nHello again\nfooXbar\nfoobar baz\n")
    (tmp_path / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "sub" / "b.log").write_text("nothing here\nfoo at 2\n")
    (tmp_path / "sub" / "deep" / "c.conf").write_text("key = foo\n")
    (tmp_path / "bin.dat").write_bytes(b"foo\0foo\n")
    return tmp_path


def test_tree_answers_what_grep_rn_answers(daemon: Daemon, tree: Path) -> None:
    res = grep(daemon, pattern="fo+", path=str(tree))
    gnu = subprocess.run(["grep", "-rn", "--binary-files=without-match", "fo+", "-E", str(tree)],
                         capture_output=True, text=True, check=False).stdout.splitlines()
    lines = res["content"][0]["text"].split("\n")
    assert sorted(lines[:-1]) == sorted(gnu)
    data = res["structuredContent"]
    assert data["files_searched"] == 3 and data["files_matched"] == 3 and data["files_skipped"] == {"binary": 1}
    assert data["skipped"] == [{"path": str(tree / "bin.dat"), "reason": "binary"}]
    assert data["truncated"] is False and data["stopped"] is None and data["next_cursor"] is None
    first = data["matches"][0]
    assert first == {"path": str(tree / "a.txt"), "line": 2, "byte_offset": 12, "text": "foo.bar"}
    assert lines[-1].startswith("[5 matches in 3 of 3 files searched under ") and "binary: 1" in lines[-1]


def test_flags_case_word_invert_fixed(daemon: Daemon, tree: Path) -> None:
    a = str(tree / "a.txt")
    assert [m[1] for m in found(grep(daemon, pattern="hello", path=a))] == [1]
    assert [m[1] for m in found(grep(daemon, pattern="hello", path=a, ignore_case=True))] == [1, 3]
    assert [m[1] for m in found(grep(daemon, pattern="foo", path=a, word=True))] == [2]  # foo.bar, not fooXbar
    assert [m[1] for m in found(grep(daemon, pattern="foo.bar", path=a))] == [2, 4]
    assert [m[1] for m in found(grep(daemon, pattern="foo.bar", path=a, fixed_string=True))] == [2]
    assert [m[1] for m in found(grep(daemon, pattern="foo", path=a, invert=True))] == [1, 3]
    assert [m[1] for m in found(grep(daemon, pattern="world\nagain", path=a))] == [1, 3]  # as grep: two patterns


def test_include_exclude_and_max_depth(daemon: Daemon, tree: Path) -> None:
    paths = {m[0] for m in found(grep(daemon, pattern="foo", path=str(tree), include="*.log"))}
    assert paths == {str(tree / "sub" / "b.log")}
    paths = {m[0] for m in found(grep(daemon, pattern="foo", path=str(tree), include=["*.log", "*.conf"],
                                      exclude="c.*"))}
    assert paths == {str(tree / "sub" / "b.log")}
    paths = {m[0] for m in found(grep(daemon, pattern="foo", path=str(tree), max_depth=2))}
    assert paths == {str(tree / "a.txt"), str(tree / "sub" / "b.log")}
    bad = grep(daemon, pattern="foo", path=str(tree), include="a/b")
    assert bad["structuredContent"]["error"]["details"]["argument"] == "include"


def test_context_lines_in_structure_and_text(daemon: Daemon, tmp_path: Path) -> None:
    f = tmp_path / "ctx.txt"
    f.write_text("".join(f"line {i}\n" for i in range(1, 21)).replace("line 5\n", "hit 5\n").replace(
        "line 7\n", "hit 7\n").replace("line 15\n", "hit 15\n"))
    res = grep(daemon, pattern="hit", path=str(f), context=2)
    m = res["structuredContent"]["matches"]
    assert m[0]["before"] == ["line 3", "line 4"] and m[0]["after"] == ["line 6", "hit 7"]
    text = res["content"][0]["text"].split("\n")
    p = str(f)
    assert text[:10] == [f"{p}-3-line 3", f"{p}-4-line 4", f"{p}:5:hit 5", f"{p}-6-line 6", f"{p}:7:hit 7",
                         f"{p}-8-line 8", f"{p}-9-line 9", "--", f"{p}-13-line 13", f"{p}-14-line 14"]
    assert grep(daemon, pattern="x", path=p, context=11)["structuredContent"]["error"]["code"] == "INVALID_ARGUMENT"


def test_invalid_pattern_and_a_pathological_one(daemon: Daemon, tmp_path: Path) -> None:
    bad = grep(daemon, pattern="(unclosed", path=str(tmp_path))
    err = bad["structuredContent"]["error"]
    assert err["code"] == "INVALID_ARGUMENT" and err["details"]["argument"] == "pattern"
    assert "invalid pattern: missing )" in err["message"]
    assert grep(daemon, pattern="(a)\\1", path=str(tmp_path))["structuredContent"]["error"]["code"] == \
        "INVALID_ARGUMENT"  # a backreference is not RE2
    long = tmp_path / "long.txt"
    long.write_bytes(b"a" * 200_000 + b"\n" + b"a" * 50 + b"b\n")
    res = grep(daemon, pattern="(a*)*b", path=str(long))  # exponential for a backtracking engine
    assert [(m[1], len(m[2])) for m in found(res)] == [(2, 51)]


def test_long_lines_are_cut_around_the_match(daemon: Daemon, tmp_path: Path) -> None:
    f = tmp_path / "wide.txt"
    f.write_bytes(b"x" * 10_000 + b"NEEDLE" + b"y" * 10_000 + b"\n")
    (m,) = grep(daemon, pattern="NEEDLE", path=str(f))["structuredContent"]["matches"]
    assert "NEEDLE" in m["text"] and m["text"].startswith("[... ") and m["text"].endswith(" more bytes]")
    assert len(m["text"]) < 2200


def test_undecodable_bytes_are_escaped_and_do_not_stop_the_search(daemon: Daemon, tmp_path: Path) -> None:
    f = tmp_path / "latin.txt"
    f.write_bytes(b"caf\xe9 foo\nna\xefve\n")
    assert found(grep(daemon, pattern="foo", path=str(f))) == [(str(f), 1, "caf\\xe9 foo")]
    assert found(grep(daemon, pattern="na.ve", path=str(f))) == []  # an undecodable byte is no character


def test_compressed_files_are_searched_decompressed(daemon: Daemon, tmp_path: Path) -> None:
    text = b"one\nfoo two\nthree\n"
    (tmp_path / "r.log.gz").write_bytes(gzip.compress(text) + gzip.compress(b"foo again\n"))  # two members
    (tmp_path / "r.log.xz").write_bytes(lzma.compress(text))
    (tmp_path / "r.log.bz2").write_bytes(bz2.compress(text))
    (tmp_path / "r.log.zst").write_bytes(zstandard.ZstdCompressor().compress(text))
    (tmp_path / "broken.gz").write_bytes(gzip.compress(text)[:12])
    res = found(grep(daemon, pattern="foo", path=str(tmp_path)))
    assert [(os.path.basename(p), n) for p, n, _ in res] == [
        ("r.log.bz2", 2), ("r.log.gz", 2), ("r.log.gz", 4), ("r.log.xz", 2), ("r.log.zst", 2)]
    skipped = grep(daemon, pattern="foo", path=str(tmp_path))["structuredContent"]["files_skipped"]
    assert skipped == {"corrupt": 1}


def test_a_decompression_bomb_is_skipped_in_a_tree_and_an_error_alone(daemon: Daemon, tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.log.gz"
    bomb.write_bytes(gzip.compress(b"a\n" * 5_000_000, 9))  # 10 MB of text in ~10 KB: ratio ~1000
    (tmp_path / "ok.log").write_text("needle\n")
    data = grep(daemon, pattern="needle", path=str(tmp_path))["structuredContent"]
    assert data["files_skipped"] == {"compression_ratio": 1} and len(data["matches"]) == 1
    assert {"path": str(bomb), "reason": "compression_ratio"} in data["skipped"]
    err = grep(daemon, pattern="needle", path=str(bomb))["structuredContent"]["error"]
    assert err["code"] == "FILE_TOO_LARGE" and err["details"]["reason"] == "compression_ratio"


def test_binary_file_alone_is_an_error(daemon: Daemon, tree: Path) -> None:
    err = grep(daemon, pattern="foo", path=str(tree / "bin.dat"))["structuredContent"]["error"]
    assert err["code"] == "BINARY_FILE"


def test_symlinks_skipped_or_followed_with_loops_detected(daemon: Daemon, tree: Path) -> None:
    (tree / "sub" / "loop").symlink_to("..")
    (tree / "link.txt").symlink_to("a.txt")
    plain = grep(daemon, pattern="foo", path=str(tree))["structuredContent"]
    assert plain["files_skipped"] == {"binary": 1, "symlink": 2}
    followed = grep(daemon, pattern="foo", path=str(tree), follow_symlinks=True)["structuredContent"]
    assert followed["files_skipped"] == {"binary": 1, "loop": 1}
    assert str(tree / "link.txt") in {m["path"] for m in followed["matches"]}


def test_a_fifo_in_the_tree_is_never_opened(daemon: Daemon, tree: Path) -> None:
    fifo = tree / "pipe"
    os.mkfifo(fifo)
    opened = threading.Event()

    def writer() -> None:  # blocks until someone opens the FIFO for reading
        fd = os.open(fifo, os.O_WRONLY)
        opened.set()
        os.close(fd)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    data = grep(daemon, pattern="foo", path=str(tree))["structuredContent"]
    assert data["files_skipped"]["not_regular"] == 1
    assert not opened.is_set()
    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # release the writer
    t.join(5)


def test_a_file_changing_while_searched_gives_a_defined_answer(daemon: Daemon, tmp_path: Path) -> None:
    f = tmp_path / "moving.log"
    block = b"".join(b"line %d foo\n" % i for i in range(200_000))
    f.write_bytes(block * 4)
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            with open(f, "r+b") as h:
                h.truncate(len(block))
                h.seek(0, os.SEEK_END)
                h.write(block * 3)

    t = threading.Thread(target=churn, daemon=True)
    t.start()
    try:
        for _ in range(3):
            res = grep(daemon, pattern="foo$", path=str(f), max_matches=1000)
            assert not res.get("isError")
            assert all(m["text"].startswith("line ") for m in res["structuredContent"]["matches"])
    finally:
        stop.set()
        t.join(10)


def test_cursor_resumes_without_duplicates_and_is_bound_to_its_search(daemon: Daemon, tree: Path) -> None:
    for i in range(5):
        (tree / "sub" / f"n{i}.txt").write_text("foo\n" * 3)
    whole = found(grep(daemon, pattern="foo", path=str(tree)))
    pages: list[tuple[str, int, str]] = []
    cursor = None
    for _ in range(30):
        args: dict[str, Any] = {"pattern": "foo", "path": str(tree), "max_matches": 4}
        if cursor:
            args["cursor"] = cursor
        res = grep(daemon, **args)
        pages += found(res)
        cursor = res["structuredContent"]["next_cursor"]
        if cursor is None:
            break
        assert res["structuredContent"]["stopped"] == "max_matches" and '"cursor":' in res["content"][0]["text"]
    assert pages == whole and len(whole) == 20
    other = grep(daemon, pattern="bar", path=str(tree), cursor=grep(
        daemon, pattern="foo", path=str(tree), max_matches=1)["structuredContent"]["next_cursor"])
    assert other["structuredContent"]["error"]["details"]["argument"] == "cursor"
    assert grep(daemon, pattern="foo", path=str(tree), cursor="garbage!")["structuredContent"]["error"][
        "code"] == "INVALID_ARGUMENT"


def test_byte_limits_per_file_and_in_all(daemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "big.log").write_bytes(b"foo\n" * 1000)
    (tmp_path / "small.log").write_bytes(b"foo\n")
    per_file = grep(daemon, pattern="foo", path=str(tmp_path), max_file_bytes=100)["structuredContent"]
    assert per_file["files_skipped"] == {"too_large": 1} and len(per_file["matches"]) == 1
    alone = grep(daemon, pattern="foo", path=str(tmp_path / "big.log"), max_file_bytes=100)
    assert alone["structuredContent"]["error"]["code"] == "FILE_TOO_LARGE"
    many = tmp_path / "many"
    many.mkdir()
    for i in range(6):
        (many / f"f{i}.log").write_bytes(b"foo\n" * 300)  # 1200 bytes each
    part = grep(daemon, pattern="foo", path=str(many), max_total_bytes=2000, max_matches=1000)["structuredContent"]
    assert part["stopped"] == "byte_limit" and part["truncated"] and part["bytes_searched"] <= 2400
    got, cursor = len(part["matches"]), part["next_cursor"]
    while cursor:
        page = grep(daemon, pattern="foo", path=str(many), max_matches=1000, cursor=cursor)
        got, cursor = got + len(found(page)), page["structuredContent"]["next_cursor"]
    assert got == 1800


def test_time_budget_stops_and_the_cursor_goes_on(daemon: Daemon, tmp_path: Path) -> None:
    for d in range(10):
        sub = tmp_path / f"d{d}"
        sub.mkdir()
        for i in range(300):
            (sub / f"f{i:03}.txt").write_text("needle\n" if i == 299 else "hay\n")
    cut = grep(daemon, pattern="needle", path=str(tmp_path), time_budget_seconds=0.001)["structuredContent"]
    assert cut["stopped"] == "time_budget" and cut["next_cursor"]
    rest = grep(daemon, pattern="needle", path=str(tmp_path), cursor=cut["next_cursor"])["structuredContent"]
    assert len(cut["matches"]) + len(rest["matches"]) == 10 and rest["stopped"] is None


def test_progress_notifications(daemon: Daemon, tmp_path: Path) -> None:
    for i in range(2500):
        (tmp_path / f"f{i:04}.txt").write_text("x\n")
    seen: list[str | None] = []
    res = run(daemon, lambda c: c.call_tool("files/grep", {"pattern": "nomatch", "path": str(tmp_path)},
                                            on_progress=lambda done, total, message: seen.append(message)))
    assert res["structuredContent"]["files_searched"] == 2500
    assert seen[:2] == ["1000 files searched, 0 matches", "2000 files searched, 0 matches"]


@pytest.mark.anyio
async def test_cancelled_grep_gets_no_reply_and_its_worker_ends(daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory(workers={"timeout_seconds": 3, "cancel_grace_seconds": 0.1},
                       read={"grep_file_bytes": 64 * 1024 ** 3})
    huge = tmp_path / "hole.log"
    with open(huge, "wb") as f:  # 16 GiB, nearly all of it a hole: a search of many seconds
        f.write(b"a\n" * 8192)
        f.truncate(16 * 1024 ** 3)
    async with SseSession(d) as s:
        await s.initialize()
        before = worker_pids(d.pid)
        r = await s.post({"jsonrpc": "2.0", "id": "g", "method": "tools/call", "params": {
            "name": "files/grep", "arguments": {"pattern": "zzz", "path": str(huge), "time_budget_seconds": 30}}})
        assert r.status_code == 202
        busy: set[int] = set()
        for _ in range(200):
            if busy := worker_pids(d.pid) - before:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(1)  # the worker has its request and searches
        assert "g" not in s.pending
        r = await s.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "g"}})
        assert r.status_code == 202
        seen = await messages_for(s, 3)
        assert all(m.get("id") != "g" for m in seen if isinstance(m, dict))
        assert busy and not (busy & worker_pids(d.pid))
        assert (await s.request("ping"))["result"] == {}


def test_linuxctl_grep_prints_like_grep_and_exits_like_it(daemon: Daemon, tree: Path) -> None:
    out = linuxctl(*flags(daemon), "grep", "-r", "-i", "HELLO", str(tree))
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().splitlines() == [f"{tree}/a.txt:1:hello world", f"{tree}/a.txt:3:Hello again"]
    assert "1 binary" in out.stderr.decode()
    none = linuxctl(*flags(daemon), "grep", "-r", "absent-word", str(tree))
    assert none.returncode == 1 and none.stdout == b""
    err = linuxctl(*flags(daemon), "grep", "(", str(tree))
    assert err.returncode == 2 and b"INVALID_ARGUMENT" in err.stderr
    shallow = linuxctl(*flags(daemon), "grep", "foo", str(tree))  # without -r: the folder's own files
    assert {line.split(":")[0] for line in shallow.stdout.decode().splitlines()} == {f"{tree}/a.txt"}
    ctx = linuxctl(*flags(daemon), "grep", "-r", "-F", "-w", "-C", "1", "--include", "*.log", "-m", "1", "foo",
                   str(tree))
    assert ctx.stdout.decode().splitlines() == [f"{tree}/sub/b.log-1-nothing here", f"{tree}/sub/b.log:2:foo at 2"]
    inverted = linuxctl(*flags(daemon), "grep", "-r", "-v", "--exclude", "*.txt", "--exclude", "*.dat", "foo",
                        str(tree))
    assert inverted.stdout.decode().splitlines() == [f"{tree}/sub/b.log:1:nothing here"]



def test_linuxctl_grep_keeps_tabs_and_backslashes_but_not_terminal_controls(daemon: Daemon, tmp_path: Path) -> None:
    """A line's tab and backslash print as grep -rn prints them; CR, ESC, other C0, C1 and bidi
    controls, which could forge or recolour a line, are escaped."""
    p = tmp_path / "odd.conf"
    p.write_bytes("key\tvalue a\tb\\c\nforged\r fake:1:line \x1b[31mred\x1b[0m \u0085 \u202e evil\n".encode())
    out = linuxctl(*flags(daemon), "grep", "a", str(p))
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().splitlines() == [
        f"{p}:1:key\tvalue a\tb\\c",
        f"{p}:2:forged\\x0d fake:1:line \\x1b[31mred\\x1b[0m \\x85 \\u202e evil",
    ]

def test_access_record_keeps_the_patterns_hash_not_the_pattern(daemon: Daemon, tree: Path) -> None:
    grep(daemon, pattern="s3cr3t-needle", path=str(tree), max_depth=2)
    records = [json.loads(line) for line in (daemon.state_dir / "access.jsonl").read_text().splitlines()]
    rec = [r for r in records if r.get("tool") == "files/grep"][-1]
    assert rec["pattern_sha256"] == hashlib.sha256(b"s3cr3t-needle").hexdigest() and rec["pattern_length"] == 13
    assert rec["max_depth"] == 2 and rec["requested_path"] == str(tree)
    assert "s3cr3t-needle" not in (daemon.state_dir / "access.jsonl").read_text()
