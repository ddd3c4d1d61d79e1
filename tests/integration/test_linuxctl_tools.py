"""docs/REFERENCE.md §6 for the file commands against the real daemon: `linuxctl list files`, `find files`,
`get filetype`, `read URI` — output, exit codes, and `--privileged` on both routes."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Daemon
from tests.support.linuxctl import flags, linuxctl
from tests.support.privsep_fixture import LOG_TEXT, PrivsepDaemon, privsep_daemon  # noqa: F401


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "a.txt").write_bytes("first\r\nsecond\n\u00e9\n".encode("latin-1"))
    (tmp_path / ".hidden").write_text("h\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.conf").write_text("k = v\n")
    return tmp_path


def test_list_files_prints_entries_and_limit_note(daemon: Daemon, tree: Path) -> None:
    res = linuxctl(*flags(daemon), "list", "files", str(tree))
    assert res.returncode == 0, res.stderr
    out = res.stdout.decode()
    for name in (".hidden", "a.txt", "sub"):
        assert name in out
    assert out.index(".hidden") < out.index("a.txt") < out.index("sub")
    limited = linuxctl(*flags(daemon), "list", "files", str(tree), "--limit", "1")
    assert limited.returncode == 0 and "a.txt" not in limited.stdout.decode()


def test_list_files_missing_dir_exits_1_with_code(daemon: Daemon, tree: Path) -> None:
    res = linuxctl(*flags(daemon), "list", "files", str(tree / "nope"))
    assert res.returncode == 1
    assert res.stderr.decode().startswith("FILE_NOT_FOUND: ")


def test_find_files_by_name_type_depth(daemon: Daemon, tree: Path) -> None:
    res = linuxctl(*flags(daemon), "find", "files", str(tree), "--name", "*.conf", "--type", "file",
                   "--max-depth", "2", "--max-results", "10")
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().splitlines() == [str(tree / "sub" / "b.conf")]
    assert "1 match" in res.stderr.decode()
    shallow = linuxctl(*flags(daemon), "find", "files", str(tree), "--name", "*.conf", "--max-depth", "1")
    assert str(tree / "sub" / "b.conf") not in shallow.stdout.decode()


def test_find_files_progress_on_stderr(daemon: Daemon, tmp_path: Path) -> None:
    for i in range(6000):
        (tmp_path / f"f{i}").touch()
    res = linuxctl(*flags(daemon), "find", "files", str(tmp_path), "--name", "f5999", "--progress")
    assert res.returncode == 0, res.stderr
    assert b"progress: 5000 entries scanned" in res.stderr
    assert res.stdout.decode().splitlines()[0] == str(tmp_path / "f5999")


def test_list_and_find_print_only_data_on_stdout(daemon: Daemon, tree: Path) -> None:
    """Summaries and notes go to stderr, so `| xargs` sees nothing but entries and paths."""
    res = linuxctl(*flags(daemon), "list", "files", str(tree), "--limit", "2")
    assert res.returncode == 0, res.stderr
    out = res.stdout.decode().splitlines()
    assert [line.split()[-1] for line in out] == [".hidden", "a.txt"]
    err = res.stderr.decode().splitlines()
    assert err[0] == f"{tree}: 3 entries, 2 shown" and err[1].startswith("[NOTE: showing the first 2 of 3")
    empty = tree / "empty"
    empty.mkdir()
    res = linuxctl(*flags(daemon), "list", "files", str(empty))
    assert (res.returncode, res.stdout, res.stderr) == (0, b"", f"{empty}: 0 entries\n".encode())
    res = linuxctl(*flags(daemon), "find", "files", str(tree), "--max-results", "1")
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.decode().splitlines()) == 1 and not res.stdout.startswith(b"[")
    assert "[NOTE: stopped at max_results" in res.stderr.decode()


def test_json_output_of_list_find_filetype(daemon: Daemon, tree: Path) -> None:
    res = linuxctl(*flags(daemon), "list", "files", str(tree), "--json", "--limit", "1")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["total"] == 3 and doc["truncated"] and [e["name"] for e in doc["entries"]] == [".hidden"]
    assert b"[NOTE: showing the first 1 of 3" in res.stderr
    res = linuxctl(*flags(daemon), "find", "files", str(tree), "--name", "*.conf", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["matches"] == [{"path": str(tree / "sub" / "b.conf"), "type": "file"}] and doc["scanned"] >= 4
    res = linuxctl(*flags(daemon), "get", "filetype", str(tree / "sub" / "b.conf"), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert (doc["type"], doc["mime"], doc["encoding"], doc["line_endings"]) == ("file", "text/plain", "utf-8", "LF")


def test_read_uri_truncation_is_never_silent(daemon: Daemon, tmp_path: Path) -> None:
    data = b"".join(b"line %05d\n" % i for i in range(3000))  # 33 KB: over the 10 KiB window
    path = tmp_path / "long.txt"
    path.write_bytes(data)
    for p in (tmp_path, path):
        os.chmod(p, 0o755)
    res = linuxctl(*flags(daemon), "read", f"file://{path}")
    assert res.returncode == 1
    assert res.stdout == data[:10240] and b"[WARNING" not in res.stdout
    assert res.stderr.startswith(b"TRUNCATED: ") and b"linuxctl get files" in res.stderr
    whole = linuxctl(*flags(daemon), "read", f"file://{path}", "--start-line", "1")
    assert (whole.returncode, whole.stdout) == (0, data)


def test_find_files_usage_error_exits_2(daemon: Daemon, tree: Path) -> None:
    res = linuxctl(*flags(daemon), "find", "files", str(tree), "--type", "nonsense")
    assert res.returncode == 2


def test_get_filetype(daemon: Daemon, tree: Path) -> None:
    res = linuxctl(*flags(daemon), "get", "filetype", str(tree / "sub" / "b.conf"))
    assert res.returncode == 0, res.stderr
    assert b"text/plain" in res.stdout


def test_read_uri_prints_text_exactly_with_range_and_encoding(daemon: Daemon, tree: Path) -> None:
    uri = f"file://{tree / 'a.txt'}"
    res = linuxctl(*flags(daemon), "read", uri, "--start-line", "2", "--end-line", "3", "--encoding", "latin-1")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "second\n\u00e9\n".encode()
    query = linuxctl(*flags(daemon), "read", uri + "?end_line=1&encoding=latin-1")
    assert query.stdout == b"first\r\n"


def test_read_uri_metadata_prints_json(daemon: Daemon, tree: Path) -> None:
    uri = f"file://{tree / 'sub' / 'b.conf'}"
    res = linuxctl(*flags(daemon), "read", uri, "--metadata")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["text"] == "k = v\n" and doc["mimeType"] == "text/plain"
    assert doc["metadata"]["lines"] == 1 and len(doc["metadata"]["sha256"]) == 64


@pytest.mark.parametrize(
    ("target", "code"),
    [("missing", "FILE_NOT_FOUND"), ("latin", "ENCODING_ERROR"), ("http", "INVALID_ARGUMENT")],
)
def test_read_uri_errors_exit_1_with_code(daemon: Daemon, tree: Path, target: str, code: str) -> None:
    uri = {"missing": f"file://{tree / 'nope'}", "latin": f"file://{tree / 'a.txt'}",
           "http": "http://example.com/x"}[target]
    res = linuxctl(*flags(daemon), "read", uri)
    assert res.returncode == 1
    assert res.stderr.decode().startswith(f"{code}: ")


def test_read_uri_bad_token_exits_3(daemon: Daemon, tree: Path) -> None:
    res = linuxctl("--url", daemon.url, "--token", "wrong", "--cacert", daemon.cacert, "read",
                   f"file://{tree / 'a.txt'}")
    assert res.returncode == 3


def test_privileged_without_helper_exits_1_helper_unavailable(daemon: Daemon, tree: Path) -> None:
    for args in (["list", "files", str(tree)], ["find", "files", str(tree)], ["get", "filetype", str(tree)],
                 ["read", f"file://{tree / 'a.txt'}"]):
        res = linuxctl(*flags(daemon), *args, "--privileged")
        assert res.returncode == 1, args
        assert res.stderr.decode().startswith("HELPER_UNAVAILABLE: "), args


# -- privileged route ---------------------------------------------------------------------------


def pflags(d: PrivsepDaemon, principal: str = "alice") -> list[str]:
    return ["--url", d.url, "--token", d.tokens[principal], "--cacert", d.cacert, "--timeout", "60"]


@pytest.fixture(scope="module")
def granted(privsep_daemon: PrivsepDaemon) -> Iterator[PrivsepDaemon]:  # noqa: F811
    d = privsep_daemon
    (d.app / "private").mkdir(exist_ok=True)
    (d.app / "private" / "x.txt").write_text("no\n")
    os.chmod(d.app / "private", 0o700)
    rule: dict[str, Any] = {"allowed": True, "paths": [str(d.app)], "deny": [str(d.app / "private")]}
    tools = {t: dict(rule) for t in ("files/read", "files/list", "files/find", "files/filetype")}
    d.write_grants({"users": {d.accounts["alice"].name: {"privileged": {"tools": tools}}}})
    deadline = time.monotonic() + 15
    while linuxctl(*pflags(d), "find", "files", str(d.app), "--privileged").returncode != 0:
        if time.monotonic() > deadline:
            raise AssertionError("grant not loaded in time")
        time.sleep(0.2)
    yield d


def test_privileged_commands_under_grant(granted: PrivsepDaemon) -> None:
    d = granted
    listed = linuxctl(*pflags(d), "list", "files", str(d.app), "--privileged")
    assert listed.returncode == 0, listed.stderr
    assert b"log.txt" in listed.stdout and b"private" not in listed.stdout
    found = linuxctl(*pflags(d), "find", "files", str(d.app), "--name", "*.txt", "--privileged")
    assert found.returncode == 0 and found.stdout.decode().splitlines()[0] == str(d.log_file)
    assert b"private" not in found.stdout
    kind = linuxctl(*pflags(d), "get", "filetype", str(d.log_file), "--privileged")
    assert kind.returncode == 0 and b"text/plain" in kind.stdout
    read = linuxctl(*pflags(d), "read", f"file://{d.log_file}", "--privileged")
    assert read.returncode == 0 and read.stdout == LOG_TEXT.encode()


def test_privileged_get_files_pages_a_large_root_only_file(granted: PrivsepDaemon) -> None:
    """Every page of a whole-file copy is a privileged call under the grant (metadata page included)."""
    d = granted
    big = d.app / "big.log"
    data = "".join(f"{i:07d} root-only caf\u00e9 \U0001f600 line\r\n" for i in range(200_000)).encode()  # ~6.6 MB
    big.write_bytes(data)
    os.chmod(big, 0o600)
    try:
        res = linuxctl(*pflags(d), "get", "files", str(big), "--privileged")
        assert res.returncode == 0, res.stderr
        assert res.stdout == data
        plain = linuxctl(*pflags(d), "get", "files", str(big))
        assert plain.returncode == 1 and plain.stderr.startswith(b"PERMISSION_DENIED: ") and plain.stdout == b""
    finally:
        big.unlink()


def test_privileged_commands_outside_grant_exit_1_permission_denied(granted: PrivsepDaemon) -> None:
    d = granted
    for args in (["list", "files", str(d.app / "private")], ["find", "files", str(d.srv)],
                 ["get", "filetype", str(d.secret)], ["read", f"file://{d.secret}"]):
        res = linuxctl(*pflags(d), *args, "--privileged")
        assert res.returncode == 1, args
        assert res.stderr.decode().startswith("PERMISSION_DENIED: "), args
        assert b"do not leak" not in res.stdout + res.stderr


@pytest.mark.parametrize(("text", "encoding"), [("café crème\n", "latin-1"), ("naïve “façade” 5 €\n", "cp1252"),
                                                ("café crème ☃\n", "utf-8")])
def test_encodings_reported_and_auto_decoded_through_the_daemon(daemon: Daemon, tmp_path: Path, text: str,
                                                                encoding: str) -> None:
    path = tmp_path / f"{encoding}.txt"
    path.write_bytes(text.encode(encoding))
    os.chmod(tmp_path, 0o755)
    os.chmod(path, 0o644)
    kind = linuxctl(*flags(daemon), "get", "filetype", str(path), "--json")
    assert kind.returncode == 0, kind.stderr
    assert json.loads(kind.stdout)["encoding"] == encoding
    auto = linuxctl(*flags(daemon), "read", f"file://{path}", "--encoding", "auto", "--metadata")
    assert auto.returncode == 0, auto.stderr
    doc = json.loads(auto.stdout)
    assert (doc["text"], doc["metadata"]["encoding"]) == (text, encoding)
