"""files/grep's scanning core in-process, on the worker's real openers: context across reads,
inverted selection, very long lines, line numbers after reads nothing matched, resuming inside a
compressed file, the literal patterns told without RE2, the cursor's checks, the config keys, and
the pattern's compilation."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest

from mcpd.common.config import ConfigError, ReadLimits, from_dict
from mcpd.common.greplines import grep_lines
from mcpd.core import fileopen, grepscan
from mcpd.core.grepargs import encode_cursor, parse_grep_args
from mcpd.core.grepread import READ
from mcpd.core.grepscan import PIECE, SHOW_BYTES, compile_pattern, literal
from mcpd.core.ops import OpContext, run

CTX = OpContext(limits=ReadLimits(), open_file=fileopen.open_regular, open_dir=fileopen.open_directory)


def grep(**args: Any) -> dict[str, Any]:
    reply = run({"id": 1, "op": "files/grep", "args": args}, CTX)
    assert reply["ok"], reply
    return dict(reply["result"])


def test_context_across_read_boundaries(tmp_path: Path) -> None:
    f = tmp_path / "big.log"
    lines = [b"x" * 1000 + b" %d" % i for i in range(3000)]  # ~3 MB: three 1 MiB reads
    lines[1047] = b"HIT"  # near the end of the first 1 MiB
    lines[131] = b"HIT"  # near the end of the first read of a plain file (grepread.READ)
    f.write_bytes(b"\n".join(lines) + b"\n")
    assert sum(len(x) + 1 for x in lines[:132]) > READ > sum(len(x) + 1 for x in lines[:129])
    found = grep(pattern="^HIT$", path=str(f), context=3)["matches"]
    assert [m["line"] for m in found] == [132, 1048]
    for m, i in zip(found, (131, 1047), strict=True):
        assert m["before"] == [x.decode() for x in lines[i - 3:i]] and m["after"] == [x.decode() for x in lines[i + 1:i + 4]]


def test_invert_with_context_and_text(tmp_path: Path) -> None:
    f = tmp_path / "v.txt"
    f.write_text("a\nkeep\na\na\nkeep2\n")
    out = grep(pattern="^a$", path=str(f), invert=True, context=1)
    assert [(m["line"], m["text"], m["before"], m["after"]) for m in out["matches"]] == [
        (2, "keep", ["a"], ["a"]), (5, "keep2", ["a"], [])]
    p = str(f)
    assert grep_lines(out["matches"]) == [f"{p}-1-a", f"{p}:2:keep", f"{p}-3-a", f"{p}-4-a", f"{p}:5:keep2"]


def test_empty_lines_and_empty_pattern(tmp_path: Path) -> None:
    f = tmp_path / "e.txt"
    f.write_text("one\n\nthree\n\n")
    assert [m["line"] for m in grep(pattern="^$", path=str(f))["matches"]] == [2, 4]
    assert [m["line"] for m in grep(pattern="", path=str(f))["matches"]] == [1, 2, 3, 4]  # as grep ''


def test_no_empty_line_after_the_last_newline_of_a_file_or_a_read(tmp_path: Path) -> None:
    """``^$`` selects only lines that are empty, as ``grep -n '^$'`` does: the empty text after a
    file's (or a read's) last newline is no line, however many reads the file takes."""
    f = tmp_path / "n.txt"
    f.write_bytes(b"a\n")
    assert grep(pattern="^$", path=str(f))["matches"] == []
    f.write_bytes(b"a\n" * (3 * READ // 2) + b"\n")  # reads end after a newline, none of them empty
    assert [m["line"] for m in grep(pattern="^$", path=str(f))["matches"]] == [3 * READ // 2 + 1]
    f.write_bytes(b"a\nb\n")
    assert [m["line"] for m in grep(pattern="^$", path=str(f), invert=True)["matches"]] == [1, 2]


def test_a_line_longer_than_a_piece_is_searched_in_pieces(tmp_path: Path) -> None:
    f = tmp_path / "one-line.txt"
    f.write_bytes(b"a" * (PIECE + 10) + b"NEEDLE" + b"a" * 100 + b"\nnext NEEDLE\n")
    out = grep(pattern="NEEDLE", path=str(f))["matches"]
    assert [(m["line"], m["byte_offset"]) for m in out] == [(1, PIECE), (2, PIECE + 117)]
    assert "NEEDLE" in out[0]["text"] and len(out[0]["text"].encode()) < SHOW_BYTES + 64


def test_resume_inside_a_compressed_file(tmp_path: Path) -> None:
    f = tmp_path / "r.log.gz"
    f.write_bytes(gzip.compress(b"".join(b"line %d foo\n" % i for i in range(1, 101))))
    first = grep(pattern="foo", path=str(f), max_matches=30)
    assert first["stopped"] == "max_matches" and first["matches"][-1]["line"] == 30
    rest = grep(pattern="foo", path=str(f), max_matches=1000, cursor=first["next_cursor"])
    assert [m["line"] for m in rest["matches"]] == list(range(31, 101)) and rest["next_cursor"] is None
    assert rest["matches"][0]["byte_offset"] == sum(len(b"line %d foo\n" % i) for i in range(1, 31))


def test_line_numbers_after_reads_without_a_match_and_across_a_byte_limit(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [b"filler line %d" % i for i in range(400_000)]  # ~7 MB: several 1 MiB reads, most without a match
    for i in (5, 150_000, 399_990):
        lines[i] = b"HIT %d" % i
    data = b"\n".join(lines) + b"\n"
    want = [(i + 1, len(b"\n".join(lines[:i])) + 1) for i in (5, 150_000, 399_990)]
    (tmp_path / "plain.log").write_bytes(data)
    (tmp_path / "packed.log.gz").write_bytes(gzip.compress(data, 1))
    for name in ("plain.log", "packed.log.gz"):
        out = grep(pattern="HIT", path=str(tmp_path / name))
        assert [(m["line"], m["byte_offset"]) for m in out["matches"]] == want, name
        assert out["bytes_searched"] == len(data)
    monkeypatch.setattr(grepscan, "LAZY_BYTES", 300_000)  # (64 MiB: a long file is counted as it passes)
    out = grep(pattern="HIT", path=str(tmp_path / "plain.log"))
    assert [(m["line"], m["byte_offset"]) for m in out["matches"]] == want
    monkeypatch.undo()
    cut = grep(pattern="HIT", path=str(tmp_path / "plain.log"), max_total_bytes=1536 * 1024)  # stops after a read without a match
    assert cut["stopped"] == "byte_limit" and [m["line"] for m in cut["matches"]] == [6]
    rest = grep(pattern="HIT", path=str(tmp_path / "plain.log"), cursor=cut["next_cursor"])
    assert [(m["line"], m["byte_offset"]) for m in rest["matches"]] == want[1:] and rest["next_cursor"] is None


def test_a_literal_pattern_is_told_by_find_as_re2_tells_it() -> None:
    texts = [b"listen = 0.0.0.0\n", b"listen= x\n", b"a.b\r\n", b"axb\n", b"\xff\xfelisten = \x80\n", b"A.B\n", b""]
    cases = [("listen = ", {}, b"listen = "), ("a.b", {}, None), ("a.b", {"fixed_string": True}, b"a.b"),
             ("a+b", {}, None), ("x", {"ignore_case": True}, None), ("listen", {"word": True}, None),
             ("caf\u00e9", {}, None), ("a\nb", {}, None), ("", {}, None), ("\t= ", {}, b"\t= ")]
    for pattern, flags, want in cases:
        args = parse_grep_args({"pattern": pattern, "path": "/x", **flags})
        assert literal(args) == want, (pattern, flags)
        if want is not None:
            regex = compile_pattern(args)
            for text in texts:
                assert (want in text) == (regex.search(text) is not None), (pattern, flags, text)


def test_small_files_answer_alike_whatever_the_pattern_kind(tmp_path: Path) -> None:
    for i in range(30):
        (tmp_path / f"c{i:02}.conf").write_bytes(b"x = 1\n" * (i % 4) + (b"listen = a.b\n" if i % 7 == 0 else b"") +
                                                  (b"tail" if i % 5 == 0 else b""))
    literal_hits = grep(pattern="listen = a.b", path=str(tmp_path), fixed_string=True)["matches"]
    regex_hits = grep(pattern="listen = a[.]b", path=str(tmp_path))["matches"]
    assert [(m["path"], m["line"], m["byte_offset"]) for m in literal_hits] == \
        [(m["path"], m["line"], m["byte_offset"]) for m in regex_hits] and len(literal_hits) == 5


def test_cursor_checks() -> None:
    parsed = parse_grep_args({"pattern": "x", "path": "/srv"})
    good = encode_cursor(parsed, "/srv/a", 10, 2)
    assert parse_grep_args({"pattern": "x", "path": "/srv", "cursor": good, "max_matches": 5, "context": 2})
    for args in ({"pattern": "y", "path": "/srv"}, {"pattern": "x", "path": "/srv", "ignore_case": True},
                 {"pattern": "x", "path": "/srv", "include": "*.log"}):
        with pytest.raises(Exception, match="cursor belongs to another search"):
            parse_grep_args({**args, "cursor": good})
    for bad in ("", "!!!", "e30", encode_cursor(parsed, "relative", 0, 1), "x" * 9000):
        with pytest.raises(Exception, match="cursor"):
            parse_grep_args({"pattern": "x", "path": "/srv", "cursor": bad})


def test_a_cursor_outside_the_path_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    parsed = parse_grep_args({"pattern": "x", "path": str(tmp_path / "a")})
    reply = run({"id": 1, "op": "files/grep", "args": {"pattern": "x", "path": str(tmp_path / "a"),
                                                       "cursor": encode_cursor(parsed, "/etc/passwd", 0, 1)}}, CTX)
    assert reply["error"]["code"] == "INVALID_ARGUMENT" and reply["error"]["details"]["argument"] == "cursor"


def test_argument_checks() -> None:
    for args, name in (({"path": "/x"}, "pattern"), ({"pattern": "x" * 4097, "path": "/x"}, "pattern"),
                       ({"pattern": "x", "path": "/x", "max_matches": 1001}, "max_matches"),
                       ({"pattern": "x", "path": "/x", "time_budget_seconds": 61}, "time_budget_seconds"),
                       ({"pattern": "x", "path": "/x", "exclude": ["*"] * 33}, "exclude"),
                       ({"pattern": "x", "path": "/x", "privileged": True, "follow_symlinks": True}, "follow_symlinks"),
                       ({"pattern": "x", "path": "/x", "max_file_bytes": 0}, "max_file_bytes")):
        with pytest.raises(Exception) as err:
            parse_grep_args(args)
        assert getattr(err.value, "details", {}).get("argument") == name, (args, err.value)


def test_config_keys_are_checked() -> None:
    cfg = from_dict({"read": {"grep_file_bytes": 10, "grep_total_bytes": 20, "grep_max_ratio": 5}})
    assert (cfg.read.grep_file_bytes, cfg.read.grep_total_bytes, cfg.read.grep_max_ratio) == (10, 20, 5)
    for key in ("grep_file_bytes", "grep_total_bytes", "grep_max_ratio"):
        with pytest.raises(ConfigError, match=f"read.{key}"):
            from_dict({"read": {key: 0}})
        with pytest.raises(ConfigError):
            from_dict({"read": {key: "big"}})


def test_the_configured_ratio_decides_a_bomb(tmp_path: Path) -> None:
    f = tmp_path / "z.gz"
    f.write_bytes(gzip.compress(b"abc\n" * 1_000_000))  # ~4 MB of text, ratio about 300
    strict = OpContext(limits=ReadLimits(grep_max_ratio=50), open_file=fileopen.open_regular,
                       open_dir=fileopen.open_directory)
    err = run({"id": 1, "op": "files/grep", "args": {"pattern": "zzz", "path": str(f)}}, strict)["error"]
    assert err["code"] == "FILE_TOO_LARGE" and err["details"]["reason"] == "compression_ratio"
    lax = OpContext(limits=ReadLimits(grep_max_ratio=100_000), open_file=fileopen.open_regular,
                    open_dir=fileopen.open_directory)
    assert run({"id": 1, "op": "files/grep", "args": {"pattern": "zzz", "path": str(f)}}, lax)["ok"]
