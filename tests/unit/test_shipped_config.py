"""The configuration examples shipped in etc/ load with the product's own loaders and mean what
their comments say (golden decisions for the grants example, like sudo's testsudoers)."""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from mcpd.common import config
from mcpd.helper.grants import DENIED, GRANTED, NO_GRANT, TOOLS, decide, load_policy, parse_policy
from mcpd.common.identity import parse_users, verify

ETC = Path(__file__).resolve().parents[2] / "etc"
DAEMON = ETC / "mcpd/mcpd.yaml"
GRANTS = ETC / "mcpd/mcp-sudo.yaml"
USERS = ETC / "mcpd/users.yaml.example"
PAM = ETC / "pam.d/mcpd"
BEFORE_EXPIRY = datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc)
AFTER_EXPIRY = datetime.datetime(2027, 3, 31, tzinfo=datetime.timezone.utc)


def _schema_keys(cls: Any) -> dict[str, Any]:
    """The config schema as nested ``{key: sub-schema or None}``."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: _schema_keys(hints[f.name]) if dataclasses.is_dataclass(hints[f.name]) else None
        for f in dataclasses.fields(cls)
    }


def _file_keys(data: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    return {k: _file_keys(data[k], schema[k]) if isinstance(schema.get(k), dict) else None for k in data}


def test_shipped_daemon_config_loads_and_equals_defaults() -> None:
    """etc/mcpd/mcpd.yaml passes mcpd.common.config.load and states exactly the built-in defaults."""
    assert config.load(DAEMON) == config.Config()


def test_shipped_daemon_config_states_every_key() -> None:
    """Every key of the schema appears in the production config, so operators see them all."""
    data = yaml.safe_load(DAEMON.read_text(encoding="utf-8"))
    schema = _schema_keys(config.Config)
    assert _file_keys(data, schema) == schema


def test_grants_example_has_the_spec_4_2_shape() -> None:
    """SPEC §4.2: users/groups -> NAME -> privileged -> tools -> TOOL -> allowed/paths/deny/expires."""
    data = yaml.safe_load(GRANTS.read_text(encoding="utf-8"))
    assert set(data) == {"users", "groups"}
    seen: set[str] = set()
    for kind in ("users", "groups"):
        for body in data[kind].values():
            assert set(body) == {"privileged"}
            assert set(body["privileged"]) == {"tools"}
            for tool, rule in body["privileged"]["tools"].items():
                assert tool in TOOLS
                assert isinstance(rule["allowed"], bool)
                assert set(rule) <= {"allowed", "paths", "deny", "expires"}
                seen |= set(rule)
    assert seen == {"allowed", "paths", "deny", "expires"}  # the example teaches every key


def test_grants_example_loads_with_the_helper_loader(tmp_path: Path) -> None:
    """SPEC §4.5: the example passes the helper's strict loader once installed 0600 by its owner."""
    installed = tmp_path / "mcp-sudo.yaml"
    shutil.copy(GRANTS, installed)
    installed.chmod(0o600)
    policy = load_policy(str(installed), owner_uid=os.geteuid())
    assert set(policy.users) == {"alice", "bob", "carol"}
    assert set(policy.groups) == {"ops", "auditors"}


def test_grants_example_refused_when_group_writable(tmp_path: Path) -> None:
    """SPEC §4.5: the same file installed group-writable is refused (the loader is not lenient)."""
    from mcpd.helper.grants import PolicyError

    installed = tmp_path / "mcp-sudo.yaml"
    shutil.copy(GRANTS, installed)
    installed.chmod(0o620)
    with pytest.raises(PolicyError):
        load_policy(str(installed), owner_uid=os.geteuid())


# (user, groups, path, when, allowed, reason): what the comments in the example promise.
GOLDEN = [
    ("alice", (), "/var/log/syslog", BEFORE_EXPIRY, True, GRANTED),
    ("alice", (), "/var/log/auth.log", BEFORE_EXPIRY, False, DENIED),
    ("alice", (), "/etc/nginx/nginx.conf", BEFORE_EXPIRY, True, GRANTED),
    ("alice", (), "/etc/nginx/conf.d/site.conf", BEFORE_EXPIRY, False, NO_GRANT),
    ("bob", (), "/srv/app/config/db.yaml", BEFORE_EXPIRY, True, GRANTED),
    ("bob", (), "/srv/app-staging/config/db.yaml", BEFORE_EXPIRY, False, NO_GRANT),
    ("bob", (), "/srv/app/secrets/db.password", BEFORE_EXPIRY, False, DENIED),
    ("bob", (), "/srv/app/tls/server.key", BEFORE_EXPIRY, False, DENIED),
    ("bob", (), "/srv/app/config/db.yaml", AFTER_EXPIRY, False, NO_GRANT),
    ("carol", ("ops",), "/etc/hosts", BEFORE_EXPIRY, True, GRANTED),
    ("carol", ("ops",), "/var/lib/postgresql/15/main/PG_VERSION", BEFORE_EXPIRY, False, DENIED),
    ("dave", ("ops",), "/var/lib/postgresql/15/main/PG_VERSION", BEFORE_EXPIRY, True, GRANTED),
    ("dave", ("ops",), "/etc/shadow", BEFORE_EXPIRY, False, DENIED),
    ("dave", ("ops",), "/var/log/../../etc/shadow", BEFORE_EXPIRY, False, DENIED),
    ("dave", ("ops",), "/home/erin/.ssh/id_ed25519", BEFORE_EXPIRY, False, DENIED),
    ("dave", ("ops",), "/home/erin/old/.ssh/id_rsa", BEFORE_EXPIRY, False, DENIED),
    ("erin", ("auditors",), "/var/log/mcpd/audit.jsonl", BEFORE_EXPIRY, True, GRANTED),
    ("erin", ("auditors",), "/var/log/mcpd/old/audit.jsonl", BEFORE_EXPIRY, False, NO_GRANT),
    ("erin", (), "/etc/hosts", BEFORE_EXPIRY, False, NO_GRANT),
]


@pytest.mark.parametrize(("user", "groups", "path", "when", "allowed", "reason"), GOLDEN)
def test_grants_example_decisions_match_its_comments(
    user: str, groups: tuple[str, ...], path: str, when: datetime.datetime, allowed: bool, reason: str
) -> None:
    """SPEC §4.1/§4.3: component matching, globs, **, deny wins, expiry, lexical cleaning."""
    policy = parse_policy(GRANTS.read_text(encoding="utf-8"), str(GRANTS))
    decision = decide(policy, user, set(groups), "files/read", path, when)
    assert (decision.allowed, decision.reason) == (allowed, reason)


def test_users_example_parses_and_its_placeholders_match_no_token() -> None:
    """SPEC §5.1: the users example has the identity module's shape and no usable digest."""
    users = parse_users(yaml.safe_load(USERS.read_text(encoding="utf-8")), str(USERS))
    assert {u.os_user for u in users.values()} == {"alice", "ci"}
    for user in users.values():
        for rec in user.tokens:
            assert len(set(rec.sha256)) == 1 and len(set(rec.salt)) == 1  # placeholders
            assert verify(users, f"mcpd_{rec.id}_{'A' * 43}") is None


def test_pam_service_checks_password_and_account_only() -> None:
    """SPEC §5.2: service mcpd = Debian's auth and account stacks; no session, no password change."""
    lines = [
        line.strip()
        for line in PAM.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert lines == ["@include common-auth", "@include common-account"]
    if Path("/etc/debian_version").exists():
        for included in ("common-auth", "common-account"):
            assert Path("/etc/pam.d", included).is_file(), included
