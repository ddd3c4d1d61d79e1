"""linuxctl's readable output escapes what a file's owner controls (names holding a newline, a
terminal escape or a bidirectional override cannot forge lines), `--json` stays JSON, and
`find files -0` writes each path's raw bytes NUL-terminated, against the real daemon."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import Daemon
from tests.support.linuxctl import flags, linuxctl
from tests.support.privsep_fixture import PrivsepDaemon, privsep_daemon  # noqa: F401

FORGED = "x\nallowed: granted etc-shadow\x1b[2J\u202etxt.exe"  # a newline, ESC, a right-to-left override
SHOWN = "x\\x0aallowed: granted etc-shadow\\x1b[2J\\u202etxt.exe"  # printable()'s rendering


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    """A folder holding a plain file, a file whose name forges a line, a folder of such a name
    with a file inside, a symlink whose target does, and a name that is not UTF-8."""
    os.chmod(tmp_path, 0o755)
    (tmp_path / "plain.txt").write_text("p\n")
    (tmp_path / FORGED).write_text("f\n")
    (tmp_path / f"dir{FORGED}").mkdir()
    (tmp_path / f"dir{FORGED}" / "inner.txt").write_text("i\n")
    (tmp_path / "link").symlink_to(f"/tmp/{FORGED}")
    with open(os.fsencode(tmp_path) + b"/raw-\xff-name", "wb") as f:
        f.write(b"r\n")
    for p in tmp_path.rglob("*"):
        if not p.is_symlink():
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return tmp_path


def test_list_files_escapes_names_and_link_targets(daemon: Daemon, hostile: Path) -> None:
    res = linuxctl(*flags(daemon), "list", "files", str(hostile))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.decode().splitlines()
    assert len(lines) == 5  # one line per entry: no name split a line
    assert any(line.endswith(f" {SHOWN}") for line in lines), lines
    assert any(line.endswith(f" dir{SHOWN}") for line in lines), lines
    assert any(line.endswith(f" link -> /tmp/{SHOWN}") for line in lines), lines
    # the server writes a byte that is not UTF-8 as the text \xff (like ls -b); shown, its backslash is doubled
    assert any(line.endswith(" raw-\\\\xff-name") for line in lines), lines
    assert b"\x1b" not in res.stdout and "\u202e" not in res.stdout.decode()
    assert not any(line.startswith("allowed: ") for line in lines)
    as_json = linuxctl(*flags(daemon), "list", "files", str(hostile), "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert FORGED in [e["name"] for e in json.loads(as_json.stdout)["entries"]]  # JSON carries the name as it is


def test_find_files_escapes_paths_and_prints_raw_bytes_with_print0(daemon: Daemon, hostile: Path) -> None:
    res = linuxctl(*flags(daemon), "find", "files", str(hostile))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.decode().splitlines()
    assert sorted(lines) == sorted([f"{hostile}/plain.txt", f"{hostile}/{SHOWN}", f"{hostile}/dir{SHOWN}/",
                                    f"{hostile}/dir{SHOWN}/inner.txt", f"{hostile}/link",
                                    f"{hostile}/raw-\\\\xff-name"])
    assert b"\x1b" not in res.stdout + res.stderr
    raw = linuxctl(*flags(daemon), "find", "files", str(hostile), "-0")
    assert raw.returncode == 0, raw.stderr
    assert raw.stdout.endswith(b"\0")
    got = sorted(raw.stdout[:-1].split(b"\0"))
    base = os.fsencode(hostile)
    want = sorted(base + b"/" + n for n in (b"plain.txt", os.fsencode(FORGED), b"dir" + os.fsencode(FORGED),
                                          b"dir" + os.fsencode(FORGED) + b"/inner.txt", b"link", b"raw-\\xff-name"))
    assert got == want  # the bytes of every name as the server sends it, folders without the trailing /
    assert b"1 match" not in raw.stdout and b"matches" in raw.stderr  # the summary stays on stderr
    long = linuxctl(*flags(daemon), "find", "files", str(hostile), "--print0", "--name", "inner.txt")
    assert long.stdout == base + b"/dir" + os.fsencode(FORGED) + b"/inner.txt\0"
    both = linuxctl(*flags(daemon), "find", "files", str(hostile), "-0", "--json")
    assert both.returncode == 2


def test_find_files_errors_on_stderr_are_escaped(privsep_daemon: PrivsepDaemon, hostile: Path) -> None:  # noqa: F811
    """A folder the caller's account cannot enter is an [ERROR: path: reason] note on stderr: its
    name is escaped and stays on its one line (alice's worker runs as her own account)."""
    shut = hostile / f"shut{FORGED}"
    shut.mkdir(mode=0o700)  # root's: alice cannot enter it
    for p in hostile.parents:  # let alice's worker reach the folder
        if p in (Path("/tmp"), Path("/")):
            break
        os.chmod(p, 0o755)
    d = privsep_daemon
    res = linuxctl("--url", d.url, "--token", d.tokens["alice"], "--cacert", d.cacert, "--timeout", "60",
                   "find", "files", str(hostile), "--name", "nothing-matches")
    assert res.returncode == 0, res.stderr
    err = res.stderr.decode().splitlines()
    assert f"[ERROR: {hostile}/shut{SHOWN}: permission denied]" in err, err
    assert not any(line.startswith("allowed: ") for line in err) and b"\x1b" not in res.stderr


def test_error_messages_are_escaped(daemon: Daemon, hostile: Path) -> None:
    """CODE: message on stderr names the path the server was asked about: escaped, one line."""
    res = linuxctl(*flags(daemon), "get", "files", f"{hostile}/missing{FORGED}")
    assert res.returncode == 1
    err = res.stderr.decode().splitlines()
    assert len(err) == 1 and err[0].startswith("FILE_NOT_FOUND: ") and err[0].endswith(f"{hostile}/missing{SHOWN}"), err
