"""docs/REFERENCE.md §4.5a: the daemon's own secrets are a fixed deny that no grant overrides, ``/`` included."""

from __future__ import annotations

import datetime
import os
import pwd
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from mcpd.admin.grants_cli import grants
from mcpd.common.config import TLS, Config
from mcpd.common.grantmatch import DENIED, GRANTED, SECRET, Policy, decide, is_secret
from mcpd.helper.wire.pathmatch import PathError
from mcpd.policy.grants import parse_policy, secret_paths
from mcpd.policy.grants_reload import PolicyHolder, summarize_changes

NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)
DEFAULT_SECRETS = secret_paths(Config(), "/etc/mcpd/mcpd.yaml")

# Every one of the daemon's own secrets in the shipped layout, with their usual companions.
SECRET_FILES = [
    "/etc/mcpd/mcpd.yaml", "/etc/mcpd/mcpd.yaml.dpkg-old", "/etc/mcpd/.mcpd.yaml.swp",
    "/etc/mcpd/users.yaml", "/etc/mcpd/users.yaml~", "/etc/mcpd/users.yaml.bak", "/etc/mcpd/.users.yaml.swp",
    "/etc/mcpd/mcp-sudo.yaml", "/etc/mcpd/mcp-sudo.yaml.orig",
    "/etc/mcpd/tls/server.key", "/etc/mcpd/tls/ca.key", "/etc/mcpd/tls",
    "/var/log/mcpd/audit.jsonl", "/var/log/mcpd/audit.jsonl.1", "/var/log/mcpd/audit.jsonl.2.gz", "/var/log/mcpd",
    "/var/lib/mcpd-helper", "/var/lib/mcpd-helper/issued-tokens.json", "/var/lib/mcpd-helper/lockout.json",
    "/var/lib/mcpd/helper/issued-tokens.json", "/var/lib/mcpd/helper/issued-tokens.json.lock",
    # the same files reached through lexical tricks
    "/var/log/../../etc/mcpd/users.yaml", "//etc//mcpd/./mcp-sudo.yaml",
]
NOT_SECRET = ["/etc/mcpd", "/etc/mcpd/README", "/etc/hosts", "/var/log/syslog", "/var/lib/mcpd",
              "/var/lib/mcpd/limits-counters.json", "/var/lib/mcpd-helper-other/x", "/etc/mcpd/users-guide.txt"]


def grant(paths: list[str], deny: list[str] | None = None, secrets: tuple[str, ...] = DEFAULT_SECRETS) -> Policy:
    rules = {t: {"allowed": True, "paths": paths, **({"deny": deny} if deny else {})}
             for t in ("files/read", "files/list", "files/find", "files/filetype")}
    text = f"users: {{alice: {{privileged: {{tools: {rules!r}}}}}}}".replace("'", '"').replace("True", "true")
    return parse_policy(text, "g.yaml", secrets)


@pytest.mark.parametrize("paths", [["/"], ["/**"], ["/etc", "/var"], ["/etc/mcpd", "/var/log/mcpd", "/var/lib"]])
@pytest.mark.parametrize("path", SECRET_FILES)
@pytest.mark.parametrize("tool", ["files/read", "files/list", "files/find", "files/filetype"])
def test_a_grant_never_serves_a_secret(paths: list[str], path: str, tool: str) -> None:
    d = decide(grant(paths), "alice", frozenset(), tool, path, NOW)
    assert (d.allowed, d.reason) == (False, SECRET)
    assert d.rule is not None and d.rule.startswith("fixed deny /")
    assert is_secret(DEFAULT_SECRETS, path)


@pytest.mark.parametrize("path", NOT_SECRET)
def test_a_root_grant_still_serves_the_rest(path: str) -> None:
    d = decide(grant(["/"]), "alice", frozenset(), "files/read", path, NOW)
    assert (d.allowed, d.reason) == (True, GRANTED)
    assert not is_secret(DEFAULT_SECRETS, path)


def test_the_fixed_deny_comes_before_a_grant_s_own_deny() -> None:
    d = decide(grant(["/"], deny=["/etc/mcpd"]), "alice", frozenset(), "files/read", "/etc/mcpd/users.yaml", NOW)
    assert d.reason == SECRET
    d = decide(grant(["/"], deny=["/etc/mcpd"]), "alice", frozenset(), "files/read", "/etc/mcpd/x", NOW)
    assert d.reason == DENIED


def test_without_secrets_nothing_is_fixed() -> None:
    assert decide(grant(["/"], secrets=()), "alice", frozenset(), "files/read", "/etc/mcpd/users.yaml", NOW).allowed


def test_default_secret_paths_are_exactly_these() -> None:
    assert set(DEFAULT_SECRETS) == {
        "/etc/mcpd/mcpd.yaml*", "/etc/mcpd/.mcpd.yaml*",
        "/etc/mcpd/users.yaml*", "/etc/mcpd/.users.yaml*",
        "/etc/mcpd/mcp-sudo.yaml*", "/etc/mcpd/.mcp-sudo.yaml*",
        "/var/log/mcpd", "/etc/mcpd/tls", "/var/lib/mcpd-helper", "/var/lib/mcpd/helper",
        "/etc/mcpd/tls/server.key",  # the key itself too, for the walker to follow where it is a symlink
        "/var/log/mcpd-front/access.jsonl*", "/var/log/mcpd-front/.access.jsonl*",  # who read what, by the front
        "/var/lib/mcpd/dev-token*", "/var/lib/mcpd/.dev-token*",  # the development mode's plain token
    }


def test_the_development_modes_plain_token_is_never_served(tmp_path: Path) -> None:
    """``mcpd dev`` keeps its token in plain text in its state folder (the config's folder): a
    grant on that folder, or on ``/``, still never serves it."""
    from mcpd.admin import devmode

    cfg = replace(Config(), state_dir=".")
    secrets = secret_paths(cfg, str(tmp_path / "mcpd.yaml"))
    assert is_secret(secrets, str(tmp_path / devmode.TOKEN_FILE))
    d = decide(grant(["/"], secrets=secrets), "alice", frozenset(), "files/read", str(tmp_path / "dev-token"), NOW)
    assert d.reason == SECRET
    assert not is_secret(secrets, str(tmp_path / "notes.txt"))


def test_shared_folders_give_the_files_not_the_folder() -> None:
    cfg = replace(Config(), audit_log="/var/log/mcpd-audit.jsonl", tls=TLS(key="/etc/ssl/private/mcpd.key"))
    secrets = secret_paths(cfg, "/etc/mcpd/mcpd.yaml")
    for path in ("/var/log/mcpd-audit.jsonl", "/var/log/mcpd-audit.jsonl.1", "/etc/ssl/private/mcpd.key",
                 "/etc/ssl/private/ca.key", "/etc/ssl/private/.mcpd.key.swp"):
        assert is_secret(secrets, path), path
    for path in ("/var/log/syslog", "/var/log", "/etc/ssl/private/other.key", "/etc/ssl/private"):
        assert not is_secret(secrets, path), path


def test_relative_settings_follow_the_config_folder_and_symlinks_are_covered(tmp_path: Path) -> None:
    real = tmp_path / "real-state"
    real.mkdir()
    link = tmp_path / "state"
    link.symlink_to(real)
    cfg = replace(Config(), users_file="users.yaml", grants_file="g[1].yaml", audit_log="audit/audit.jsonl",
                  tls=TLS(key="server.key"), state_dir=".", helper_state_dir="helper-state")
    secrets = secret_paths(cfg, str(link / "mcpd.yaml"))
    for base in (link, real):
        for name in ("mcpd.yaml", "users.yaml", "g[1].yaml", "g[1].yaml.bak", "audit/audit.jsonl.3",
                     "server.key", "ca.key", "helper-state/x", "helper/issued-tokens.json"):
            assert is_secret(secrets, str(base / name)), (base, name)
        # glob characters in a name are literal, and the rest of the state folder is served
        for name in ("g1.yaml", "root-only/secret.txt", "server.crt", "ca.crt"):
            assert not is_secret(secrets, str(base / name)), (base, name)


def test_is_secret_takes_a_policy_and_fails_closed() -> None:
    policy = grant(["/"])
    assert is_secret(policy, "/etc/mcpd/users.yaml") and not is_secret(policy, "/etc/hosts")
    for odd in ("socket:[1234]", "anon_inode:[eventfd]", "", "relative/path"):
        assert is_secret(policy, odd)


def write_root_file(tmp_path: Path, text: str, name: str = "mcp-sudo.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    os.chmod(path, 0o600)
    return str(path)


ROOT_GRANT = "users: {alice: {privileged: {tools: {files/read: {allowed: true, paths: [/]}}}}}\n"


@pytest.mark.root
def test_the_holder_keeps_the_secrets_through_reloads_and_failures(tmp_path: Path) -> None:
    path = write_root_file(tmp_path, ROOT_GRANT)
    secrets = secret_paths(replace(Config(), grants_file=path), "/etc/mcpd/mcpd.yaml")
    holder = PolicyHolder(path, owner_uid=os.geteuid(), secrets=secrets)
    assert holder.policy.secrets == secrets and holder.text == ROOT_GRANT
    for p in (path, "/etc/mcpd/users.yaml"):
        assert decide(holder.policy, "alice", frozenset(), "files/read", p, NOW).reason == SECRET
    Path(path).write_text(ROOT_GRANT + "users: {}\n")  # duplicate key: kept the last good policy
    assert not holder.reload().ok and holder.policy.secrets == secrets
    broken = PolicyHolder(str(tmp_path / "missing.yaml"), secrets=secrets)
    assert broken.last_errors and broken.policy.secrets == secrets
    with pytest.raises(PathError):
        PolicyHolder(path, owner_uid=os.geteuid(), secrets=("relative/secret",))


def test_summary_lists_each_changed_fact() -> None:
    a = parse_policy("users: {alice: {privileged: {tools: {files/read: {allowed: true, paths: [/a]}}}}}")
    b = parse_policy("users: {alice: {privileged: {tools: {files/read: {allowed: false, paths: [/a], "
                     "expires: 2030-01-01T00:00:00Z, reauth_after: 5m}}}}}")
    assert summarize_changes(a, a) == ["no changes"]
    assert summarize_changes(a, b) == [
        "users.alice files/read allowed true -> false",
        "users.alice files/read expires never -> 2030-01-01T00:00:00Z",
        "users.alice files/read reauth_after 300s added",
    ]
    c = parse_policy("users: {alice: {privileged: {tools: {files/read: {allowed: false, paths: [/a], deny: [/a/k], "
                     "expires: 2031-01-01T00:00:00Z, reauth_after: 10m}}}}}")
    assert summarize_changes(b, c) == [
        "users.alice files/read deny /a/k added",
        "users.alice files/read expires 2030-01-01T00:00:00Z -> 2031-01-01T00:00:00Z",
        "users.alice files/read reauth_after 300s -> 600s",
    ]
    assert summarize_changes(c, b) == [
        "users.alice files/read expires 2031-01-01T00:00:00Z -> 2030-01-01T00:00:00Z",
        "users.alice files/read reauth_after 600s -> 300s",
        "users.alice files/read deny /a/k removed",
    ]
    assert summarize_changes(b, a)[-1] == "users.alice files/read reauth_after 300s removed"


# ---------------------------------------------------------------- `mcpd grants`


@pytest.mark.root
def test_grants_test_answers_denied_for_a_secret(tmp_path: Path) -> None:
    path = write_root_file(tmp_path, ROOT_GRANT)
    run = CliRunner().invoke(grants, ["test", "--user", "alice", "--tool", "files/read", "--path",
                                      "/etc/mcpd/users.yaml", "--file", path])
    assert run.exit_code == 1
    assert run.output.startswith(f"denied: {SECRET}\npath: /etc/mcpd/users.yaml\nrule: fixed deny /etc/mcpd/users.yaml*")
    own = CliRunner().invoke(grants, ["test", "--user", "alice", "--tool", "files/read", "--path", path,
                                      "--file", path])
    assert own.exit_code == 1 and own.output.startswith(f"denied: {SECRET}")
    other = CliRunner().invoke(grants, ["test", "--user", "alice", "--tool", "files/read", "--path", "/etc/hosts",
                                        "--file", path])
    assert other.exit_code == 0


@pytest.mark.root
def test_grants_test_uses_the_configuration_s_paths(tmp_path: Path) -> None:
    path = write_root_file(tmp_path, ROOT_GRANT)
    cfg = tmp_path / "mcpd.yaml"
    cfg.write_text(f"grants_file: {path}\nusers_file: /srv/conf/people.yaml\n")
    run = CliRunner().invoke(grants, ["test", "--user", "alice", "--tool", "files/read", "--path",
                                      "/srv/conf/people.yaml", "--config", str(cfg)])
    assert run.exit_code == 1 and run.output.startswith(f"denied: {SECRET}")
    cfg_read = CliRunner().invoke(grants, ["test", "--user", "alice", "--tool", "files/read", "--path",
                                           str(cfg), "--config", str(cfg)])
    assert cfg_read.exit_code == 1


@pytest.mark.root
def test_grants_list_shows_the_fixed_deny(tmp_path: Path) -> None:
    path = write_root_file(tmp_path, ROOT_GRANT)
    out = CliRunner().invoke(grants, ["list", "--user", "nobody-here", "--group", "x", "--file", path]).output
    lines = out.splitlines()
    head = lines.index("Fixed deny (the daemon's own secrets, never served whatever a grant says):")
    assert lines[1] == "  (no grants)" and head == 2
    assert {"  deny /etc/mcpd/users.yaml*", "  deny /var/lib/mcpd-helper", "  deny /etc/mcpd/tls",
            "  deny /var/log/mcpd", f"  deny {path}*"} <= set(lines[head + 1:])


@pytest.mark.root
@pytest.mark.parametrize("entry", ["/", "/**"])
def test_grants_check_warns_on_a_grant_of_everything(tmp_path: Path, entry: str) -> None:
    me = pwd.getpwuid(os.geteuid()).pw_name  # a real account: check warns about names that are none
    path = write_root_file(tmp_path, ROOT_GRANT.replace("[/]", f"['{entry}']").replace("alice", me))
    run = CliRunner().invoke(grants, ["check", path])
    assert run.exit_code == 0 and run.stdout == f"{path}: parsed OK\n"
    assert run.stderr.startswith(f"warning: {path}:1: users.{me} files/read: paths {entry} grants every file")


@pytest.mark.root
def test_grants_check_is_quiet_for_folders(tmp_path: Path) -> None:
    me = pwd.getpwuid(os.geteuid()).pw_name
    path = write_root_file(tmp_path, ROOT_GRANT.replace("[/]", "[/var/log]").replace("alice", me))
    run = CliRunner().invoke(grants, ["check", path])
    assert run.exit_code == 0 and run.stderr == ""
    off = write_root_file(tmp_path, ROOT_GRANT.replace("true", "false").replace("alice", me), name="off.yaml")
    assert CliRunner().invoke(grants, ["check", off]).stderr == ""  # allowed: false grants nothing
