"""docs/REFERENCE.md §5.1 through the real `mcpd users` command: tokens shown once, stored hashed, file mode 0600."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mcpd.common import identity

MCPD = str(Path(sys.executable).parent / "mcpd")
# an unprivileged account: a principal is never mapped to root (uid 0)
ME = pwd.getpwuid(os.geteuid()).pw_name if os.geteuid() != 0 else "nobody"


def mcpd(*args: str, users_file: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MCPD_USERS_FILE"}
    return subprocess.run([MCPD, *args, "--file", str(users_file)], capture_output=True, text=True,
                          timeout=60, env=env)


@pytest.fixture
def users_file(tmp_path: Path) -> Path:
    return tmp_path / "etc" / "users.yaml"


def test_users_add_prints_token_once_and_stores_only_a_hash(users_file: Path) -> None:
    res = mcpd("users", "add", "alice", "--os-user", ME, users_file=users_file)
    assert res.returncode == 0, res.stderr
    token = res.stdout.strip()
    assert identity.TOKEN_RE.match(token)
    assert stat.S_IMODE(users_file.stat().st_mode) == 0o600
    text = users_file.read_text()
    assert token not in text and token.split("_", 2)[2] not in text
    principal = identity.verify(identity.load_users(users_file), token)
    assert principal is not None and (principal.name, principal.os_user) == ("alice", ME)


def test_users_rotate_revokes_the_old_token(users_file: Path) -> None:
    old = mcpd("users", "add", "alice", "--os-user", ME, users_file=users_file).stdout.strip()
    res = mcpd("users", "rotate", "alice", users_file=users_file)
    assert res.returncode == 0, res.stderr
    new = res.stdout.strip()
    users = identity.load_users(users_file)
    assert identity.verify(users, old) is None
    assert identity.verify(users, new) is not None
    assert stat.S_IMODE(users_file.stat().st_mode) == 0o600


def test_users_list_never_prints_digests(users_file: Path) -> None:
    token = mcpd("users", "add", "alice", "--os-user", ME, users_file=users_file).stdout.strip()
    mcpd("users", "add", "bob", "--os-user", ME, users_file=users_file)
    res = mcpd("users", "list", users_file=users_file)
    assert res.returncode == 0, res.stderr
    record = identity.load_users(users_file)["alice"].tokens[0]
    assert "alice" in res.stdout and "bob" in res.stdout and record.id in res.stdout
    for secret in (record.sha256, record.salt, token):
        assert secret not in res.stdout


def test_users_remove_drops_the_principal(users_file: Path) -> None:
    token = mcpd("users", "add", "alice", "--os-user", ME, users_file=users_file).stdout.strip()
    res = mcpd("users", "remove", "alice", users_file=users_file)
    assert res.returncode == 0, res.stderr
    users = identity.load_users(users_file)
    assert "alice" not in users and identity.verify(users, token) is None
    assert mcpd("users", "remove", "alice", users_file=users_file).returncode == 1


def test_users_add_refuses_unknown_os_account_and_duplicates(users_file: Path) -> None:
    res = mcpd("users", "add", "ghost", "--os-user", "no_such_account_x", users_file=users_file)
    assert res.returncode == 2 and "no such OS account" in res.stderr
    assert not users_file.exists()
    assert mcpd("users", "add", "alice", "--os-user", ME, users_file=users_file).returncode == 0
    dup = mcpd("users", "add", "alice", "--os-user", ME, users_file=users_file)
    assert dup.returncode == 1 and "exists" in dup.stderr


def test_users_add_defaults_os_user_to_name(users_file: Path) -> None:
    res = mcpd("users", "add", ME, users_file=users_file)
    assert res.returncode == 0, res.stderr
    assert identity.load_users(users_file)[ME].os_user == ME


def test_users_commands_find_the_users_file_through_config(tmp_path: Path) -> None:
    (tmp_path / "mcpd.yaml").write_text("users_file: state/users.yaml\n")
    env = {k: v for k, v in os.environ.items() if k != "MCPD_USERS_FILE"}
    add = subprocess.run([MCPD, "users", "add", "carol", "--os-user", ME, "--config", str(tmp_path / "mcpd.yaml")],
                         capture_output=True, text=True, timeout=60, env=env)
    assert add.returncode == 0, add.stderr
    assert "carol" in identity.load_users(tmp_path / "state" / "users.yaml")
    listed = subprocess.run([MCPD, "users", "list", "--config", str(tmp_path / "mcpd.yaml")],
                            capture_output=True, text=True, timeout=60, env=env)
    assert listed.returncode == 0 and listed.stdout.startswith("carol\t"), listed.stdout + listed.stderr
