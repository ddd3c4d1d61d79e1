"""One strict YAML loader (mcpd.common.strictyaml) behind mcpd.yaml, users.yaml, grants and the
linuxctl config; secure-file checks where the file is root's; one reload holder for users."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from mcpd.client.api import UsageError
from mcpd.client.config import load_config_file
from mcpd.common import config, identity
from mcpd.front.auth import FileAuthenticator

DUP = "a: 1\na: 2\n"


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_every_loader_refuses_duplicate_keys_with_the_line(tmp_path: Path) -> None:
    cfg = write(tmp_path / "mcpd.yaml", "max_sessions: 5\nmax_sessions: 6\n")
    with pytest.raises(config.ConfigError, match=r"mcpd\.yaml:2: duplicate key 'max_sessions'"):
        config.load(cfg)
    users = write(tmp_path / "users.yaml", "users: {}\nusers: {}\n")
    with pytest.raises(identity.UsersFileError, match=r"users\.yaml:2: duplicate key 'users'"):
        identity.load_users(users)
    client = write(tmp_path / "config.yaml", "url: https://a\nurl: https://b\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_config_file(client)


def test_yaml_errors_never_quote_the_file(tmp_path: Path) -> None:
    users = write(tmp_path / "users.yaml", "users:\n  alice: [s3cr3tdigest\n")
    with pytest.raises(identity.UsersFileError) as info:
        identity.load_users(users)
    assert "s3cr3tdigest" not in str(info.value) and "users.yaml:3: invalid YAML" in str(info.value)
    cfg = write(tmp_path / "mcpd.yaml", "listen: {host: [hunter2\n")
    with pytest.raises(config.ConfigError) as cinfo:
        config.load(cfg)
    assert "hunter2" not in str(cinfo.value)


@pytest.mark.parametrize("mode", [0o620, 0o602])
def test_root_files_are_checked_when_an_owner_is_required(tmp_path: Path, mode: int) -> None:
    me = os.geteuid()
    cfg = write(tmp_path / "mcpd.yaml", "max_sessions: 5\n", mode)
    users = write(tmp_path / "users.yaml", "users: {}\n", mode)
    assert config.load(cfg).max_sessions == 5 and identity.load_users(users) == {}  # no owner asked
    with pytest.raises(config.ConfigError, match="group- or world-writable"):
        config.load(cfg, owner_uid=me)
    with pytest.raises(identity.UsersFileError, match="group- or world-writable"):
        identity.load_users(users, owner_uid=me)
    with pytest.raises(config.ConfigError, match="not owned by"):
        config.load(write(cfg, "max_sessions: 5\n"), owner_uid=me + 1)


def test_a_symlinked_root_file_is_refused(tmp_path: Path) -> None:
    real = write(tmp_path / "real.yaml", "max_sessions: 5\n")
    link = tmp_path / "mcpd.yaml"
    link.symlink_to(real)
    assert config.load(link).max_sessions == 5
    with pytest.raises(config.ConfigError, match="cannot open"):
        config.load(link, owner_uid=os.geteuid())


def test_missing_users_file_means_no_users_either_way(tmp_path: Path) -> None:
    assert identity.load_users(tmp_path / "none.yaml") == {}
    assert identity.load_users(tmp_path / "none.yaml", owner_uid=os.geteuid()) == {}


def test_file_authenticator_reloads_and_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    token, rec = identity.new_token()
    identity.save_users(path, {"alice": identity.UserRecord(name="alice", os_user="alice", tokens=[rec])})
    auth = FileAuthenticator(str(path))
    found = asyncio.run(auth.authenticate(token))
    assert found is not None and found.name == "alice"
    good = path.read_text()
    write(tmp_path / "new.yaml", good + "users: {}\n").replace(path)  # a broken edit (duplicate key)
    assert asyncio.run(auth.authenticate(token)) is None  # fail closed, not the last good users
    write(tmp_path / "new.yaml", good).replace(path)
    assert asyncio.run(auth.authenticate(token)) is not None
    path.unlink()
    assert asyncio.run(auth.authenticate(token)) is None


def test_merge_keys_oversized_and_non_utf8_files_are_refused(tmp_path: Path) -> None:
    from mcpd.common.strictyaml import load_secure_yaml, parse_strict_yaml
    from mcpd.helper.wire.securefile import MAX_CONFIG_BYTES, ConfigFileError

    with pytest.raises(ConfigFileError, match=r"x:2: merge keys"):
        parse_strict_yaml("a: &a {b: 1}\nc: {<<: *a}\n", "x")
    big = write(tmp_path / "big.yaml", "# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigFileError, match="larger than"):
        load_secure_yaml(str(big), os.geteuid())
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"a: caf\xe9\n")
    latin.chmod(0o600)
    with pytest.raises(ConfigFileError, match="not UTF-8"):
        load_secure_yaml(str(latin), os.geteuid())
    assert load_secure_yaml(str(write(tmp_path / "ok.yaml", "a: [1, 2]\n")), os.geteuid()) == {"a": [1, 2]}
