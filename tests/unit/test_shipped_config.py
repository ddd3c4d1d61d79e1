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
from click.testing import CliRunner

from mcpd.admin.grants_cli import grants
from mcpd.common import config
from mcpd.common.grantmatch import DENIED, GRANTED, NO_GRANT, REAUTH, SECRET, TOOLS, decide, entry_covers_root
from mcpd.common.identity import parse_users, verify
from mcpd.policy.grants import RULE_KEYS, load_policy, parse_policy, secret_paths

ETC = Path(__file__).resolve().parents[2] / "etc"
DAEMON = ETC / "mcpd/mcpd.yaml"
LIVE_GRANTS = ETC / "mcpd/mcp-sudo.yaml"  # installed as /etc/mcpd/mcp-sudo.yaml: what a new host grants
GRANTS = ETC / "mcpd/mcp-sudo.yaml.example"  # installed beside it, never read by the daemon
USERS = ETC / "mcpd/users.yaml.example"
PAM = ETC / "pam.d/mcpd"
BEFORE_EXPIRY = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
AFTER_EXPIRY = datetime.datetime(2027, 3, 31, tzinfo=datetime.UTC)


def _schema_keys(cls: Any) -> dict[str, Any]:
    """The config schema as nested ``{key: sub-schema or None}``."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: _schema_keys(hints[f.name]) if dataclasses.is_dataclass(hints[f.name]) else None
        for f in dataclasses.fields(cls)
    }


def _file_keys(data: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    return {k: _file_keys(data[k], schema[k]) if isinstance(schema.get(k), dict) else None for k in data}


def test_shipped_daemon_config_loads_and_equals_defaults_but_allowed_hosts() -> None:
    """etc/mcpd/mcpd.yaml passes mcpd.common.config.load and states exactly the built-in defaults,
    but for allowed_hosts, which it sets to auto (its comment says why)."""
    assert config.load(DAEMON) == dataclasses.replace(config.Config(), allowed_hosts=("auto",))


def test_shipped_daemon_config_beyond_loopback_checks_the_host_header() -> None:
    """docs/REFERENCE.md §1.3: a listener exposed beyond loopback takes only the Host names of its
    certificate (DNS-rebinding defence): the shipped file, which binds every interface, says so."""
    import ipaddress

    cfg = config.load(DAEMON)
    if not ipaddress.ip_address(cfg.listen.host).is_loopback:
        assert "auto" in cfg.allowed_hosts


def test_shipped_daemon_config_states_every_key() -> None:
    """Every key of the schema appears in the production config, so operators see them all."""
    data = yaml.safe_load(DAEMON.read_text(encoding="utf-8"))
    schema = _schema_keys(config.Config)
    del schema["oauth"]  # the one block shown commented out: present, it turns OAuth on
    assert _file_keys(data, schema) == schema


def _commented_oauth_block() -> str:
    lines = DAEMON.read_text(encoding="utf-8").splitlines()
    start = lines.index("# oauth:")
    block = []
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        block.append(line[2:])
    return "\n".join(block) + "\n"


def test_shipped_oauth_example_states_every_key_and_loads() -> None:
    """The commented-out oauth block of etc/mcpd/mcpd.yaml, uncommented, is valid and names every
    key of the oauth schema (docs/REFERENCE.md §5.4), each issuer key included."""
    data = yaml.safe_load(_commented_oauth_block())
    schema = _schema_keys(config.OAuth)
    assert set(data["oauth"]) == set(schema)
    issuer_keys = {f.name for f in dataclasses.fields(config.OAuthIssuer)}
    assert [set(i) for i in data["oauth"]["issuers"]] == [issuer_keys]
    cfg = config.from_dict(data)
    assert cfg.oauth.enabled and cfg.oauth.issuers[0].name == "corp"
    assert not config.Config().oauth.enabled  # absent: off


@pytest.mark.parametrize("tool", TOOLS)
def test_shipped_grants_file_grants_nothing(tool: str, tmp_path: Path) -> None:
    """The grants file installed as /etc/mcpd/mcp-sudo.yaml loads with the helper's loader and
    grants no account anything, whatever its name and groups (the example's included): privileged
    reads start refused on a new host until the operator writes a rule."""
    installed = tmp_path / "mcp-sudo.yaml"
    shutil.copy(LIVE_GRANTS, installed)
    installed.chmod(0o600)
    policy = load_policy(str(installed), owner_uid=os.geteuid(), secrets=SHIPPED_SECRETS)
    assert (policy.users, policy.groups) == ({}, {})
    example = shipped_policy()
    for user in (*example.users, "root", "someone"):
        for path in ("/var/log/syslog", "/var/log/auth.log", "/etc/nginx/nginx.conf", "/srv/app/log/app.log"):
            d = decide(policy, user, set(example.groups), tool, path, BEFORE_EXPIRY)
            assert (d.allowed, d.reason) == (False, NO_GRANT), (user, path)
    check = CliRunner().invoke(grants, ["check", "--any-owner", str(installed)])
    assert (check.exit_code, check.stderr) == (0, ""), check.output


def test_grants_example_has_the_spec_4_2_shape() -> None:
    """docs/REFERENCE.md §4.2: users/groups -> NAME -> privileged -> tools -> TOOL -> a rule, and the example
    uses every key a rule may have (the loader's RULE_KEYS)."""
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
                assert set(rule) <= set(RULE_KEYS)
                seen |= set(rule)
    assert seen == set(RULE_KEYS)  # the example teaches every key the daemon enforces


def test_grants_example_loads_with_the_helper_loader(tmp_path: Path) -> None:
    """docs/REFERENCE.md §4.5: the example passes the helper's strict loader once installed 0600 by its owner."""
    installed = tmp_path / "mcp-sudo.yaml"
    shutil.copy(GRANTS, installed)
    installed.chmod(0o600)
    policy = load_policy(str(installed), owner_uid=os.geteuid())
    assert set(policy.users) == {"alice", "bob", "carol"}
    assert set(policy.groups) == {"ops", "auditors"}
    check = CliRunner().invoke(grants, ["check", "--any-owner", "--now", "2026-12-01T00:00:00Z", str(installed)])
    assert check.exit_code == 0
    # its accounts and groups are examples, so the only warnings are that they are not this host's
    assert all("no OS account is named" in w or "no OS group is named" in w for w in check.stderr.splitlines())


def test_grants_example_refused_when_group_writable(tmp_path: Path) -> None:
    """docs/REFERENCE.md §4.5: the same file installed group-writable is refused (the loader is not lenient)."""
    from mcpd.policy.grants import PolicyError

    installed = tmp_path / "mcp-sudo.yaml"
    shutil.copy(GRANTS, installed)
    installed.chmod(0o620)
    with pytest.raises(PolicyError):
        load_policy(str(installed), owner_uid=os.geteuid())


# (user, groups, path, when, allowed, reason): what the comments in the example promise.
GOLDEN = [
    ("dave", ("ops",), "/var/log/syslog", BEFORE_EXPIRY, True, GRANTED),
    ("dave", ("ops",), "/var/log/nginx/access.log.2.gz", BEFORE_EXPIRY, True, GRANTED),
    ("dave", ("ops",), "/var/log/auth.log", BEFORE_EXPIRY, False, DENIED),
    ("dave", ("ops",), "/var/log/auth.log.1", BEFORE_EXPIRY, False, DENIED),
    ("dave", ("ops",), "/var/log/btmp", BEFORE_EXPIRY, False, DENIED),
    ("dave", ("ops",), "/var/log/audit/audit.log", BEFORE_EXPIRY, False, DENIED),
    ("dave", ("ops",), "/etc/nginx/nginx.conf", BEFORE_EXPIRY, True, GRANTED),
    ("dave", ("ops",), "/etc/nginx/sites-enabled/default", BEFORE_EXPIRY, True, GRANTED),
    ("dave", ("ops",), "/etc/nginx/ssl/site.key", BEFORE_EXPIRY, False, DENIED),
    ("dave", ("ops",), "/etc/nginx/.htpasswd", BEFORE_EXPIRY, False, DENIED),
    ("dave", ("ops",), "/etc/apache2/apache2.conf", BEFORE_EXPIRY, True, GRANTED),
    ("dave", ("ops",), "/etc/systemd/system/app.service.d/override.conf", BEFORE_EXPIRY, True, GRANTED),
    ("dave", ("ops",), "/usr/lib/systemd/system/ssh.service", BEFORE_EXPIRY, True, GRANTED),
    ("dave", ("ops",), "/lib/systemd/system/ssh.service", BEFORE_EXPIRY, True, GRANTED),
    ("dave", ("ops",), "/etc/nginx-evil/x", BEFORE_EXPIRY, False, NO_GRANT),
    ("dave", ("ops",), "/etc/shadow", BEFORE_EXPIRY, False, NO_GRANT),
    ("dave", ("ops",), "/var/log/../../etc/shadow", BEFORE_EXPIRY, False, NO_GRANT),
    ("dave", ("ops",), "/var/log/mcpd/audit.jsonl", BEFORE_EXPIRY, False, SECRET),
    ("carol", ("ops",), "/etc/apache2/apache2.conf", BEFORE_EXPIRY, False, DENIED),
    ("carol", ("ops",), "/etc/nginx/nginx.conf", BEFORE_EXPIRY, True, GRANTED),
    ("erin", ("auditors",), "/var/log/auth.log", BEFORE_EXPIRY, False, REAUTH),  # a static token: no login
    ("erin", ("auditors",), "/var/log/audit/audit.log", BEFORE_EXPIRY, False, REAUTH),
    ("erin", ("auditors",), "/var/log/syslog", BEFORE_EXPIRY, False, NO_GRANT),
    ("frank", ("ops", "auditors"), "/var/log/auth.log", BEFORE_EXPIRY, False, DENIED),
    ("alice", (), "/etc/nginx/nginx.conf", BEFORE_EXPIRY, True, GRANTED),
    ("alice", (), "/etc/nginx/conf.d/site.conf", BEFORE_EXPIRY, False, NO_GRANT),
    ("alice", (), "/var/log/nginx/error.log", BEFORE_EXPIRY, True, GRANTED),
    ("alice", (), "/var/log/syslog", BEFORE_EXPIRY, False, NO_GRANT),
    ("bob", (), "/srv/app/log/app.log", BEFORE_EXPIRY, True, GRANTED),
    ("bob", (), "/srv/app-staging/log/app.log", BEFORE_EXPIRY, False, NO_GRANT),
    ("bob", (), "/srv/app/log/app.log", AFTER_EXPIRY, False, NO_GRANT),
    ("erin", (), "/etc/hosts", BEFORE_EXPIRY, False, NO_GRANT),
]
SHIPPED_SECRETS = secret_paths(config.Config(), "/etc/mcpd/mcpd.yaml")


def shipped_policy() -> Any:
    return parse_policy(GRANTS.read_text(encoding="utf-8"), str(GRANTS), SHIPPED_SECRETS)


@pytest.mark.parametrize(("user", "groups", "path", "when", "allowed", "reason"), GOLDEN)
def test_grants_example_decisions_match_its_comments(
    user: str, groups: tuple[str, ...], path: str, when: datetime.datetime, allowed: bool, reason: str
) -> None:
    """docs/REFERENCE.md §4.1/§4.3: component matching, globs, **, deny wins, expiry, lexical cleaning."""
    decision = decide(shipped_policy(), user, set(groups), "files/read", path, when)
    assert (decision.allowed, decision.reason) == (allowed, reason)


@pytest.mark.parametrize(("age", "used", "allowed"), [(60, False, True), (300, False, True), (301, False, False),
                                                   (60, True, True)])
def test_grants_example_auditors_need_a_recent_login(age: int, used: bool, allowed: bool) -> None:
    """The auditors' rule says reauth_after: 5m: a password login at most 5 minutes old reads the
    authentication logs (a used login too: only reauth_after 0 is one call per login)."""
    login = BEFORE_EXPIRY - datetime.timedelta(seconds=age)
    decision = decide(shipped_policy(), "erin", {"auditors"}, "files/read", "/var/log/auth.log", BEFORE_EXPIRY,
                      login_time=login, login_used=used)
    assert (decision.allowed, decision.reason) == (allowed, GRANTED if allowed else REAUTH)


NEVER = [
    "/", "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d/ops",
    "/etc/ssh/ssh_host_ed25519_key", "/etc/ssh/ssh_host_rsa_key", "/etc/ssh/ssh_host_ecdsa_key",
    "/root/.ssh/id_ed25519", "/home/alice/.ssh/id_rsa", "/etc/ssl/private/site.key",
    "/etc/nginx/ssl/site.key", "/etc/nginx/conf.d/.htpasswd", "/etc/apache2/.htpasswd",
    "/var/log/auth.log", "/var/log/auth.log.1", "/var/log/btmp", "/var/log/secure",
    "/etc/mcpd/users.yaml", "/etc/mcpd/mcp-sudo.yaml", "/etc/mcpd/mcpd.yaml", "/etc/mcpd/tls/server.key",
    "/etc/mcpd/tls/ca.key", "/var/log/mcpd/audit.jsonl", "/var/lib/mcpd-helper/issued-tokens.json",
    "/var/lib/postgresql/15/main/PG_VERSION", "/proc/1/environ",
]


@pytest.mark.parametrize("path", NEVER)
@pytest.mark.parametrize("tool", TOOLS)
def test_grants_example_never_grants_the_machine_s_secrets(path: str, tool: str) -> None:
    """An account in every group and named like every user of the example still gets none of
    these (the auth logs aside, which only the auditors group reads)."""
    policy = shipped_policy()
    every_group = set(policy.groups) - ({"auditors"} if path.startswith(("/var/log/auth.log", "/var/log/secure"))
                                        else set())
    for user in (*policy.users, "someone"):
        d = decide(policy, user, every_group, tool, path, BEFORE_EXPIRY)
        assert not d.allowed, (user, tool, path, d.rule)


def test_grants_example_grants_no_entry_covering_root() -> None:
    policy = shipped_policy()
    for table in (policy.users, policy.groups):
        for rules in table.values():
            for rule in rules.values():
                assert not any(entry_covers_root(e.parts) for e in rule.paths), rule.subject


def test_users_example_parses_and_its_placeholders_match_no_token() -> None:
    """docs/REFERENCE.md §5.1: the users example has the identity module's shape and no usable digest."""
    users = parse_users(yaml.safe_load(USERS.read_text(encoding="utf-8")), str(USERS))
    assert {u.os_user for u in users.values()} == {"alice", "ci"}
    for user in users.values():
        for rec in user.tokens:
            assert len(set(rec.sha256)) == 1 and len(set(rec.salt)) == 1  # placeholders
            assert verify(users, f"mcpd_{rec.id}_{'A' * 43}") is None


def test_pam_service_checks_password_and_account_only() -> None:
    """docs/REFERENCE.md §5.2: service mcpd = Debian's auth and account stacks; no session, no password change."""
    lines = [
        line.strip()
        for line in PAM.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert lines == ["@include common-auth", "@include common-account"]
    if Path("/etc/debian_version").exists():
        for included in ("common-auth", "common-account"):
            assert Path("/etc/pam.d", included).is_file(), included


def test_dev_mode_installs_the_pam_service_only_when_missing(tmp_path: Path) -> None:
    """`mcpd dev` as root: no PAM service mcpd → the shipped one is installed (0644), and said so;
    an existing one is left alone; an impossible install says exactly how to do it."""
    import io

    from mcpd.admin import devroot

    target, err = tmp_path / "pam.d" / "mcpd", io.StringIO()
    target.parent.mkdir()
    assert devroot.ensure_pam_service(err, target=target)
    assert target.read_bytes() == devroot.SHIPPED_PAM_SERVICE.read_bytes()
    assert (target.stat().st_mode & 0o777) == 0o644 and "installed the PAM service mcpd" in err.getvalue()
    target.write_text("# the operator's own\n")
    assert devroot.ensure_pam_service(io.StringIO(), target=target)
    assert target.read_text() == "# the operator's own\n"
    err = io.StringIO()
    assert not devroot.ensure_pam_service(err, target=tmp_path / "missing-folder" / "mcpd")
    assert f"install -m 0644 {devroot.SHIPPED_PAM_SERVICE} {tmp_path / 'missing-folder' / 'mcpd'}" in err.getvalue()
