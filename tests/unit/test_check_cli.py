"""``mcpd config check FILE`` and ``mcpd users check FILE`` (beside ``mcpd grants check FILE``): one
file checked alone, as configuration management runs them (Ansible's ``validate: ... %s``, like
``visudo -cf``): exit 0 and ``FILE: parsed OK`` for a good file; exit 1 and ``FILE:LINE: reason`` for
a broken one; nothing written, the file's values (users' salts and digests) never printed.

The real ``mcpd`` command of this installation runs in a subprocess, on copies of the shipped files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MCPD = str(Path(sys.executable).parent / "mcpd")
SHIPPED_CONFIG = (REPO / "etc" / "mcpd" / "mcpd.yaml").read_text(encoding="utf-8")
SHIPPED_USERS = (REPO / "etc" / "mcpd" / "users.yaml.example").read_text(encoding="utf-8")
SHIPPED_GRANTS = (REPO / "etc" / "mcpd" / "mcp-sudo.yaml").read_text(encoding="utf-8")


def check(kind: str, path: Path) -> subprocess.CompletedProcess[str]:
    """``mcpd KIND check PATH`` (``--any-owner`` when not root: the file is the caller's)."""
    owner = [] if os.geteuid() == 0 else ["--any-owner"]
    return subprocess.run([MCPD, kind, "check", *owner, str(path)], capture_output=True, text=True, timeout=60,
                          check=False, stdin=subprocess.DEVNULL, env={**os.environ, "NO_COLOR": "1"})


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    path.chmod(0o600)
    return path


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line of ``text`` that contains ``needle``."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_config_check_passes_the_shipped_config(tmp_path: Path) -> None:
    path = write(tmp_path, "mcpd.yaml", SHIPPED_CONFIG)
    res = check("config", path)
    assert (res.returncode, res.stdout, res.stderr) == (0, f"{path}: parsed OK\n", "")


@pytest.mark.parametrize(("old", "new", "reason"), [
    ("  port: 9091\n", "  port: 99999\n", "listen.port: must be 1..65535"),
    ("  per_account: 4 ", "  per_acount: 4 ", "workers: unknown key 'per_acount'"),
    ("max_batch: 256\n", "max_batch: lots\n", "max_batch: expected an integer"),
    ("tool_names: slash\n", "tool_names: slash\ntool_names: portable\n", "duplicate key 'tool_names'"),
    ("max_sessions: 1000\n", "max_sessions: [1000\n", "invalid YAML"),
])
def test_config_check_refuses_a_broken_file_with_its_line_and_reason(
        tmp_path: Path, old: str, new: str, reason: str) -> None:
    assert SHIPPED_CONFIG.count(old) == 1
    text = SHIPPED_CONFIG.replace(old, new)
    path = write(tmp_path, "mcpd.yaml", text)
    res = check("config", path)
    assert res.returncode == 1 and res.stdout == ""
    at = line_of(text, new.strip().splitlines()[-1]) if "YAML" not in reason else None
    (message,) = res.stderr.splitlines()
    if at is not None:
        assert message.startswith(f"{path}:{at}: "), message
    else:
        assert message.startswith(f"{path}:") and message.split(":")[1].isdigit(), message
    assert reason in message


def test_users_check_passes_the_example_and_names_a_bad_value_by_line_never_printing_it(tmp_path: Path) -> None:
    good = write(tmp_path, "users.yaml", SHIPPED_USERS)
    res = check("users", good)
    assert (res.returncode, res.stdout, res.stderr) == (0, f"{good}: parsed OK\n", "")
    bad_salt = "0123456789abcdef0123456789abcdeX"
    text = SHIPPED_USERS.replace('salt: "00000000000000000000000000000000"', f'salt: "{bad_salt}"', 1)
    bad = write(tmp_path, "bad.yaml", text)
    res = check("users", bad)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr == (f"{bad}:{line_of(text, bad_salt)}: users.alice.tokens[0].salt: invalid value "
                          "(expected 32 lowercase hex digits, quoted)\n")
    assert bad_salt not in res.stderr and "0000000000000000" not in res.stderr


def test_users_check_says_what_an_os_user_must_be(tmp_path: Path) -> None:
    text = SHIPPED_USERS.replace("    os_user: ci\n", "    os_user: CI-Bot\n", 1)
    res = check("users", write(tmp_path, "users.yaml", text))
    assert res.returncode == 1
    assert f":{line_of(text, 'CI-Bot')}: users.ci-bot.os_user: invalid value (expected an OS account: a name of " \
           "lowercase letters" in res.stderr, res.stderr


def test_users_check_refuses_a_missing_file_and_an_unknown_key(tmp_path: Path) -> None:
    res = check("users", tmp_path / "absent.yaml")  # the daemon reads a missing file as "no users"; a check fails
    assert (res.returncode, res.stderr) == (
        1, f"{tmp_path / 'absent.yaml'}: missing (no principals yet: mcpd users add NAME --os-user ACCOUNT)\n")
    text = SHIPPED_USERS.replace("    os_user: alice ", "    os_user: alice\n    shell: /bin/sh ", 1)
    res = check("users", write(tmp_path, "extra.yaml", text))
    assert res.returncode == 1
    assert res.stderr.startswith(f"{tmp_path / 'extra.yaml'}:{line_of(text, 'users:') + 1}: users.alice: expected keys")


@pytest.mark.parametrize("kind", ["config", "users", "grants"])
def test_checks_refuse_unsafe_files_as_the_daemon_does(tmp_path: Path, kind: str) -> None:
    text = {"config": SHIPPED_CONFIG, "users": SHIPPED_USERS, "grants": SHIPPED_GRANTS}[kind]
    path = write(tmp_path, "f.yaml", text)
    path.chmod(0o666)
    res = check(kind, path)
    assert res.returncode == 1 and "group- or world-writable" in res.stderr
    path.chmod(0o600)
    link = tmp_path / "link.yaml"
    link.symlink_to(path)
    res = check(kind, link)
    assert res.returncode == 1 and f"{link}: is a symlink; name the real file ({path})" in res.stderr, res.stderr


@pytest.mark.parametrize("kind", ["users", "grants"])
def test_a_users_or_grants_file_every_account_may_read_is_a_warning(tmp_path: Path, kind: str) -> None:
    """Who may read what, and the token digests, are root's alone: a 0644 file passes its check
    (the daemon reads it) with a warning naming the mode; 0600 passes without one."""
    path = write(tmp_path, "f.yaml", SHIPPED_USERS if kind == "users" else SHIPPED_GRANTS)
    res = check(kind, path)
    assert (res.returncode, res.stderr) == (0, ""), res.stderr
    path.chmod(0o644)
    res = check(kind, path)
    assert res.returncode == 0 and res.stdout == f"{path}: parsed OK\n"
    assert f"warning: {path}: readable by every account (mode 0644): make it 0600 root:root" in res.stderr


@pytest.mark.parametrize(("kind", "text", "broken"), [
    ("config", SHIPPED_CONFIG, "listen: [\n"),
    ("users", SHIPPED_USERS, "users: 3\n"),
    ("grants", SHIPPED_GRANTS, "users: {alice: {files/read: {paths: 7}}}\n"),
])
def test_checks_write_nothing_good_or_broken(tmp_path: Path, kind: str, text: str, broken: str) -> None:
    folder = tmp_path / "etc"
    folder.mkdir()
    good, bad = write(folder, "good.yaml", text), write(folder, "bad.yaml", broken)
    os.utime(folder, (1_000_000, 1_000_000))
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_mode, p.read_bytes()) for p in folder.iterdir()}
    assert check(kind, good).returncode == 0
    assert check(kind, bad).returncode == 1
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_mode, p.read_bytes()) for p in folder.iterdir()} == before
    assert folder.stat().st_mtime == 1_000_000  # no file made and removed again (a lock, a temporary copy)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a file of another owner")
def test_checks_refuse_a_file_root_does_not_own(tmp_path: Path) -> None:
    path = write(tmp_path, "mcpd.yaml", SHIPPED_CONFIG)
    os.chown(path, 65534, 65534)
    res = check("config", path)
    assert res.returncode == 1 and "not owned by root" in res.stderr


@pytest.mark.parametrize("kind", ["config", "users", "grants"])
@pytest.mark.parametrize(("name", "text", "reason"), [
    ("deep.yaml", "[" * 100000 + "\n", "deep.yaml: invalid YAML: nested too deeply"),
    ("ctl.yaml", "\x1b[31mevil: [\n", "ctl.yaml:1: invalid YAML: special characters are not allowed (U+001B)"),
    ("ctl2.yaml", "a: 1\nb: \x07\n", "ctl2.yaml:2: invalid YAML: special characters are not allowed (U+0007)"),
])
def test_a_hostile_file_is_one_clear_line_never_a_traceback(
        tmp_path: Path, kind: str, name: str, text: str, reason: str) -> None:
    """Nesting deeper than the parser's recursion (``[`` a hundred thousand times) and a control
    character YAML refuses before parsing (an ESC opening the file): exit 1, the file's name and
    why, no traceback, nothing of the file's text echoed."""
    res = check(kind, write(tmp_path, name, text))
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and "\x1b" not in res.stdout + res.stderr
    assert reason in res.stdout + res.stderr, (res.stdout, res.stderr)
