"""docs/REFERENCE.md §4.1–4.3, §4.5: grants loading, the pure decision, reloads and the `mcpd grants` commands."""

from __future__ import annotations

import datetime
import json
import os
import pwd
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from mcpd.admin.grants_cli import grants
from mcpd.common.audit.writer import AuditLog
from mcpd.common.config import Config
from mcpd.common.grantmatch import NO_GRANT, decide, entry_covers, split_entry
from mcpd.common.strictyaml import load_secure_yaml
from mcpd.helper.wire.securefile import ConfigFileError
from mcpd.policy.grants import PolicyError, load_policy, os_groups, parse_policy, secret_paths
from mcpd.policy.grants_reload import PolicyHolder
from tests.support.osaccounts import AccountFactory, os_accounts  # noqa: F401 (fixture)

NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)


def policy_for(paths: list[str], deny: list[str] | None = None, tool: str = "files/read",
               expires: str | None = None, subject: str = "users", name: str = "alice"):
    rule = {"allowed": True, "paths": paths}
    if deny is not None:
        rule["deny"] = deny
    if expires is not None:
        rule["expires"] = expires
    text = json.dumps({subject: {name: {"privileged": {"tools": {tool: rule}}}}})
    return parse_policy(text, "t.yaml")


def allowed(policy, path: str, user: str = "alice", groups: frozenset[str] = frozenset(),
            tool: str = "files/read", now: datetime.datetime = NOW) -> bool:
    return decide(policy, user, groups, tool, path, now).allowed


# ---------------------------------------------------------------- §4.3 matching


def test_entry_covers_itself_and_below_component_by_component() -> None:
    p = policy_for(["/srv/app"])
    assert allowed(p, "/srv/app")
    assert allowed(p, "/srv/app/x")
    assert allowed(p, "/srv/app/deep/er/file.txt")
    assert not allowed(p, "/srv/app-evil")
    assert not allowed(p, "/srv/app-evil/x")
    assert not allowed(p, "/srv")
    assert not allowed(p, "/srv/ap")


def test_request_path_is_cleaned_lexically_first() -> None:
    p = policy_for(["/var/log"])
    d = decide(p, "alice", frozenset(), "files/read", "/var/log/../../etc/shadow", NOW)
    assert (d.allowed, d.resolved_path, d.reason) == (False, "/etc/shadow", NO_GRANT)
    assert not allowed(policy_for(["/srv/app"]), "/srv/app/../secret")
    assert allowed(p, "//var//log/./x")
    assert decide(p, "alice", frozenset(), "files/read", "//var/log/x", NOW).resolved_path == "/var/log/x"


def test_request_path_must_be_absolute_without_nul() -> None:
    p = policy_for(["/"])
    for bad in ("var/log/x", "", "/var/log/\0x"):
        d = decide(p, "alice", frozenset(), "files/read", bad, NOW)
        assert not d.allowed and d.resolved_path is None


def test_star_never_matches_slash() -> None:
    p = policy_for(["/etc/nginx/*.conf", "/home/*/notes"])
    assert allowed(p, "/etc/nginx/site.conf")
    assert not allowed(p, "/etc/nginx/sites/x.conf")
    assert not allowed(p, "/etc/nginx/.conf/../../shadow")
    assert allowed(p, "/home/bob/notes/a")
    assert not allowed(p, "/home/bob/x/notes")
    assert not allowed(p, "/etc/nginx")


def test_question_mark_and_brackets_match_one_component_character() -> None:
    p = policy_for(["/data/log?", "/data/[ab]x", "/data/[!c]y"])
    assert allowed(p, "/data/log1")
    assert not allowed(p, "/data/log")
    assert not allowed(p, "/data/log12")
    assert allowed(p, "/data/ax") and allowed(p, "/data/bx") and not allowed(p, "/data/cx")
    assert allowed(p, "/data/dy") and not allowed(p, "/data/cy")
    assert not entry_covers(split_entry("/a?b"), ("a", "b"))  # '?' never matches '/'


def test_double_star_matches_zero_or_many_whole_components() -> None:
    p = policy_for(["/srv/**/logs"])
    assert allowed(p, "/srv/logs")
    assert allowed(p, "/srv/a/logs")
    assert allowed(p, "/srv/a/b/c/logs/x")
    assert not allowed(p, "/srv/a/logsx")
    assert not allowed(p, "/srv/a/b")
    assert allowed(policy_for(["/**"]), "/etc/shadow")


def test_root_entry_must_be_written_out_and_covers_everything() -> None:
    assert allowed(policy_for(["/"]), "/etc/shadow")
    with pytest.raises(PolicyError, match=r"t\.yaml:\d+: .*empty paths"):
        policy_for([])


# ---------------------------------------------------------------- §4.1 decision


def test_no_grant_reason_is_exact() -> None:
    d = decide(policy_for(["/var/log"]), "bob", frozenset(), "files/read", "/var/log/x", NOW)
    assert (d.allowed, d.reason, d.rule) == (False, "no grant covers this path", None)


def test_deny_always_wins_over_paths() -> None:
    p = policy_for(["/var/log"], deny=["/var/log/auth.log", "/var/log/private"])
    assert allowed(p, "/var/log/syslog")
    d = decide(p, "alice", frozenset(), "files/read", "/var/log/auth.log", NOW)
    assert not d.allowed and d.rule is not None and "deny /var/log/auth.log" in d.rule
    assert not allowed(p, "/var/log/private/x")
    assert not allowed(p, "/var/log/x/../auth.log")


def test_deny_from_a_group_wins_over_a_user_grant() -> None:
    text = """
users: {alice: {privileged: {tools: {files/read: {allowed: true, paths: [/var/log]}}}}}
groups: {staff: {privileged: {tools: {files/read: {allowed: false, deny: [/var/log/secret]}}}}}
"""
    p = parse_policy(text, "t.yaml")
    assert allowed(p, "/var/log/secret")
    assert not allowed(p, "/var/log/secret", groups=frozenset({"staff"}))


def test_expired_grant_is_no_grant() -> None:
    p = policy_for(["/var/log"], expires="2026-05-31T23:59:59Z")
    d = decide(p, "alice", frozenset(), "files/read", "/var/log/x", NOW)
    assert (d.allowed, d.reason) == (False, NO_GRANT)
    assert "expired" in d.note
    earlier = datetime.datetime(2026, 5, 1, tzinfo=datetime.UTC)
    assert allowed(p, "/var/log/x", now=earlier)


def test_a_remembered_grant_never_outlives_its_expiry() -> None:
    """Decisions are remembered per loaded grants file only while no rule can expire: an allow
    decided before the expiry is decided afresh after it."""
    p = policy_for(["/var/log"], expires="2026-06-01T00:00:10Z")
    assert allowed(p, "/var/log/x", now=NOW)
    assert not allowed(p, "/var/log/x", now=NOW + datetime.timedelta(seconds=10))
    assert p.decided == {}


def test_decisions_are_remembered_per_loaded_grants_file_and_per_group_set() -> None:
    p = policy_for(["/var/log"], subject="groups", name="ops")
    first = decide(p, "bob", frozenset({"ops"}), "files/read", "/var/log/x", NOW)
    assert first.allowed and decide(p, "bob", frozenset({"ops"}), "files/read", "/var/log/x", NOW) is first
    # the same user without the group (removed from it) is decided for its own groups
    assert not allowed(p, "/var/log/x", user="bob", groups=frozenset())
    # a reloaded file is a new Policy: nothing carries over from the old one's answers
    narrower = policy_for(["/srv"], subject="groups", name="ops")
    assert not allowed(narrower, "/var/log/x", user="bob", groups=frozenset({"ops"}))


def test_remembered_decisions_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import mcpd.common.grantmatch as grants_module

    monkeypatch.setattr(grants_module, "DECIDED_MAX", 8)
    p = policy_for(["/var/log"])
    for i in range(50):
        assert allowed(p, f"/var/log/f{i}")
        assert len(p.decided) <= 8
    assert allowed(p, "/var/log/f49") and not allowed(p, "/etc/f49")


def test_a_login_token_is_decided_afresh_every_time() -> None:
    """reauth_after: 0 admits one call per login: a remembered answer would admit more."""
    text = "users: {alice: {privileged: {tools: {files/read: {allowed: true, paths: [/var/log], reauth_after: 0}}}}}"
    p = parse_policy(text, "t")
    login = NOW - datetime.timedelta(seconds=1)
    assert decide(p, "alice", frozenset(), "files/read", "/var/log/x", NOW, login_time=login).allowed
    assert not decide(p, "alice", frozenset(), "files/read", "/var/log/x", NOW, login_time=login,
                      login_used=True).allowed
    assert p.decided == {} or all(not d.allowed for d in p.decided.values())


def test_allowed_false_means_no_grant() -> None:
    p = parse_policy("users: {alice: {privileged: {tools: {files/read: {allowed: false, paths: [/]}}}}}", "t")
    assert not allowed(p, "/etc/hosts")


def test_group_grants_apply_to_members_only() -> None:
    p = policy_for(["/var/log"], subject="groups", name="ops")
    assert allowed(p, "/var/log/x", user="bob", groups=frozenset({"ops", "users"}))
    assert not allowed(p, "/var/log/x", user="bob", groups=frozenset({"users"}))


def test_grant_is_per_tool() -> None:
    p = policy_for(["/var/log"], tool="files/list")
    assert allowed(p, "/var/log", tool="files/list")
    assert not allowed(p, "/var/log")
    assert not allowed(p, "/var/log", tool="files/write")


def test_covers_root_only_for_a_root_grant_without_deny() -> None:
    def covers_root(p) -> bool:
        return decide(p, "alice", frozenset(), "files/read", "/var/x", NOW).covers_root

    assert covers_root(policy_for(["/"])) and covers_root(policy_for(["/**"]))
    assert not covers_root(policy_for(["/var"]))
    # a deny entry means links may not be followed: one could lead into the denied path
    assert not covers_root(policy_for(["/"], deny=["/etc/shadow"]))


def test_leaving_a_group_ends_its_group_grants_within_seconds(os_accounts: AccountFactory) -> None:  # noqa: F811
    """The group files are looked at no more than once a second, not per call; a change is still
    seen within seconds (polled for at most 10 s)."""
    import subprocess
    import time

    ops = os_accounts.group()
    bob = os_accounts.user(groups=[ops]).name
    p = policy_for(["/var/log"], subject="groups", name=ops)
    assert ops in os_groups(bob) and allowed(p, "/var/log/x", user=bob, groups=os_groups(bob))
    subprocess.run(["gpasswd", "-d", bob, ops], check=True, capture_output=True)
    end = time.monotonic() + 10
    while ops in os_groups(bob) and time.monotonic() < end:
        time.sleep(0.1)
    assert ops not in os_groups(bob)
    assert not allowed(p, "/var/log/x", user=bob, groups=os_groups(bob))


def test_os_groups_include_the_primary_group() -> None:
    root_primary = pwd.getpwnam("root").pw_gid
    import grp

    assert grp.getgrgid(root_primary).gr_name in os_groups("root")
    assert os_groups("no-such-user-mcpd") == frozenset()


# ---------------------------------------------------------------- §4.5 strict loading


def errors_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(textwrap.dedent(text), "g.yaml")
    return info.value.errors


def test_duplicate_keys_rejected_with_line() -> None:
    errs = errors_of("""\
        users:
          alice:
            privileged: {tools: {}}
          alice:
            privileged: {tools: {}}
        """)
    assert errs == ["g.yaml:4: duplicate key 'alice' (first on line 2)"]


def test_unknown_keys_rejected_with_line() -> None:
    errs = errors_of("""\
        users:
          alice:
            privileged:
              tools:
                files/read:
                  allowed: true
                  paths: [/var/log]
                  timeout: 10
        """)
    assert len(errs) == 1 and errs[0].startswith("g.yaml:8: unknown key 'timeout'")
    assert errors_of("extra: 1\n")[0].startswith("g.yaml:1: unknown key 'extra'")
    assert errors_of("users: {a: {privileged: {tools: {files/write: {allowed: true, paths: [/]}}}}}\n")[0] \
        .startswith("g.yaml:1: unknown tool 'files/write'")


def test_wrong_types_rejected_with_line() -> None:
    errs = errors_of("""\
        users:
          alice:
            privileged:
              tools:
                files/read:
                  allowed: "yes"
                  paths: /var/log
        """)
    assert errs == ["g.yaml:6: users.alice files/read: allowed must be true or false"]
    errs = errors_of("""\
        users:
          alice:
            privileged:
              tools:
                files/read:
                  allowed: true
                  paths: /var/log
        """)
    assert errs == ["g.yaml:7: paths must be a list of absolute paths"]
    assert errors_of("users: [a]\n") == ["g.yaml:1: users must be a mapping"]


def test_missing_paths_is_a_configuration_error() -> None:
    errs = errors_of("""\
        users:
          alice:
            privileged:
              tools:
                files/list:
                  allowed: true
        """)
    assert len(errs) == 1 and errs[0].startswith("g.yaml:5: ") and "without paths" in errs[0]


def test_relative_and_unnormalised_entries_rejected() -> None:
    errs = errors_of("""\
        users:
          alice:
            privileged:
              tools:
                files/read:
                  allowed: true
                  paths:
                    - var/log
                    - /var/log/
                    - /var/../etc
                  deny: [/a/**b]
        """)
    assert [e.split(": ")[0] for e in errs] == ["g.yaml:8", "g.yaml:9", "g.yaml:10", "g.yaml:11"]
    assert "must be absolute" in errs[0] and "not normalised" in errs[1]


def test_expires_formats() -> None:
    ok = parse_policy("users: {a: {privileged: {tools: {files/read: "
                      "{allowed: true, paths: [/], expires: '2027-03-31T00:00:00+02:00'}}}}}", "t")
    when = ok.users["a"]["files/read"].expires
    assert when == datetime.datetime(2027, 3, 30, 22, tzinfo=datetime.UTC)
    for bad in ("2027-03-31T00:00:00", "2027-03-31", "tomorrow", "12"):
        errs = errors_of(f"users: {{a: {{privileged: {{tools: {{files/read: "
                         f"{{allowed: true, paths: [/], expires: {bad}}}}}}}}}}}\n")
        assert errs[0].startswith("g.yaml:1: expires must be")


def test_yaml_syntax_error_has_line_and_no_file_text() -> None:
    errs = errors_of("users:\n  alice: [secretword\n")
    assert errs[0].startswith("g.yaml:3: invalid YAML") and "secretword" not in errs[0]


def write_root_file(tmp_path: Path, text: str, mode: int = 0o644, name: str = "mcp-sudo.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


GOOD = "users: {alice: {privileged: {tools: {files/read: {allowed: true, paths: [/var/log]}}}}}\n"


@pytest.mark.root
@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_group_or_world_writable_file_refused(tmp_path: Path, mode: int) -> None:
    path = write_root_file(tmp_path, GOOD, mode)
    with pytest.raises(PolicyError, match="group- or world-writable"):
        load_policy(path)


@pytest.mark.root
def test_file_not_owned_by_root_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    path = write_root_file(tmp_path, GOOD)
    nobody = pwd.getpwnam("nobody")
    os.chown(path, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(PolicyError, match="not owned by root"):
        load_policy(path)
    os.chown(path, 0, 0)
    assert "alice" in load_policy(path).users


@pytest.mark.root
def test_users_file_checked_by_the_same_loader(tmp_path: Path) -> None:
    path = write_root_file(tmp_path, "users: {a: {os_user: a}, a: {os_user: b}}\n", name="users.yaml")
    with pytest.raises(ConfigFileError, match="users.yaml:1: duplicate key 'a'"):
        load_secure_yaml(path)
    os.chmod(path, 0o666)
    with pytest.raises(ConfigFileError, match="world-writable"):
        load_secure_yaml(path)


@pytest.mark.root
def test_symlinked_grants_file_refused(tmp_path: Path) -> None:
    real = write_root_file(tmp_path, GOOD)
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    with pytest.raises(PolicyError, match="cannot open"):
        load_policy(str(link))


# ---------------------------------------------------------------- §4.5 reload


@pytest.mark.root
def test_reload_keeps_last_good_policy_and_summarises_changes(tmp_path: Path) -> None:
    path = write_root_file(tmp_path, GOOD)
    log = tmp_path / "audit" / "audit.jsonl"
    with AuditLog(str(log), syslog=False) as audit:
        holder = PolicyHolder(path, audit=audit)
        assert allowed(holder.policy, "/var/log/x")
        Path(path).write_text("users: {alice: {bad: 1}}\n")
        result = holder.reload()
        assert not result.ok and result.errors[0].startswith(f"{path}:1: unknown key 'bad'")
        assert allowed(holder.policy, "/var/log/x")  # last good kept
        os.chmod(path, 0o666)
        Path(path).write_text(GOOD.replace("/var/log", "/srv"))
        assert not holder.reload().ok and allowed(holder.policy, "/var/log/x")
        os.chmod(path, 0o644)
        Path(path).write_text(
            "users: {alice: {privileged: {tools: {files/read: {allowed: true, paths: [/srv], deny: [/srv/k]}}}}}\n"
            "groups: {ops: {privileged: {tools: {files/list: {allowed: true, paths: [/]}}}}}\n"
        )
        result = holder.reload()
        assert result.ok
        assert result.summary == [
            "groups.ops added",
            "groups.ops files/list added",
            "groups.ops files/list allowed true added",
            "groups.ops files/list expires never added",
            "groups.ops files/list paths / added",
            "users.alice files/read deny /srv/k added",
            "users.alice files/read paths /srv added",
            "users.alice files/read paths /var/log removed",
        ]
        assert not allowed(holder.policy, "/var/log/x") and allowed(holder.policy, "/srv/x")
        assert holder.reload_if_changed() is None
    records = [json.loads(line) for line in log.read_text().splitlines()]
    events = [r["event"] for r in records if r.get("part", 1) == 1]  # one set of parts per reload
    assert events == ["reload", "reload_failed", "reload_failed", "reload"]


@pytest.mark.root
def test_first_load_failure_grants_nothing(tmp_path: Path) -> None:
    path = write_root_file(tmp_path, GOOD, 0o666)
    holder = PolicyHolder(path)
    assert holder.last_errors and not allowed(holder.policy, "/var/log/x")


# ---------------------------------------------------------------- `mcpd grants`


@pytest.mark.root
def test_grants_check_like_visudo(tmp_path: Path) -> None:
    runner = CliRunner()
    path = write_root_file(tmp_path, GOOD.replace("alice", pwd.getpwuid(os.geteuid()).pw_name), 0o600)  # a real account
    ok = runner.invoke(grants, ["check", path])
    assert ok.exit_code == 0 and ok.output == f"{path}: parsed OK\n"
    Path(path).write_text("users:\n  a: {privileged: {tools: {files/read: {allowed: true}}}}\n")
    bad = runner.invoke(grants, ["check", path])
    assert bad.exit_code == 1 and f"{path}:2: users.a files/read: a path tool granted without paths" in bad.output


@pytest.mark.root
def test_grants_list_shows_user_and_group_grants(tmp_path: Path) -> None:
    path = write_root_file(tmp_path, GOOD + "groups: {ops: {privileged: {tools: {files/find: "
                           "{allowed: true, paths: [/srv], deny: [/srv/k], expires: 2030-01-01T00:00:00Z}}}}}\n")
    out = CliRunner().invoke(grants, ["list", "--user", "alice", "--group", "ops", "--file", path])
    assert out.exit_code == 0
    assert out.stdout.splitlines() == [
        "Grants for alice (groups: ops):",
        f"  files/read via users.alice (allowed, {path}:1)",
        f"    path /var/log ({path}:1)",
        f"  files/find via groups.ops (allowed, expires 2030-01-01T00:00:00Z, {path}:2)",
        f"    path /srv ({path}:2)",
        f"    deny /srv/k ({path}:2)",
        "Fixed deny (the daemon's own secrets, never served whatever a grant says):",
        *(f"  deny {s}" for s in sorted(secret_paths(replace(Config(), grants_file=path), "/etc/mcpd/mcpd.yaml"))),
    ]
    assert f"  deny {path}*" in out.output and "  deny /etc/mcpd/users.yaml*" in out.output


@pytest.mark.root
def test_grants_test_exit_codes(tmp_path: Path) -> None:
    path = write_root_file(tmp_path, GOOD)
    runner = CliRunner()
    yes = runner.invoke(grants, ["test", "--user", "alice", "--tool", "files/read", "--path", "/var/log/a",
                                 "--file", path])
    assert yes.exit_code == 0 and yes.output.startswith("allowed: granted\n")
    assert f"rule: users.alice files/read paths /var/log ({path}:1)" in yes.output
    no = runner.invoke(grants, ["test", "--user", "alice", "--tool", "files/read", "--path",
                                "/var/log/../shadow", "--file", path])
    assert no.exit_code == 1 and no.output.startswith("denied: no grant covers this path\npath: /var/shadow\n")


@pytest.mark.root
def test_grants_export_json(tmp_path: Path) -> None:
    path = write_root_file(tmp_path, GOOD)
    out = CliRunner().invoke(grants, ["export", "--json", "--file", path])
    assert out.exit_code == 0
    assert json.loads(out.output) == {
        "users": {"alice": {"privileged": {"tools": {"files/read": {
            "allowed": True, "paths": ["/var/log"], "deny": [], "expires": None, "reauth_after": None, "line": 1}}}}},
        "groups": {},
        "fixed_deny": sorted(secret_paths(replace(Config(), grants_file=path), "/etc/mcpd/mcpd.yaml")),
    }
    os.chmod(path, 0o666)
    assert CliRunner().invoke(grants, ["export", "--file", path]).exit_code == 78


def test_an_oauth_group_may_be_named_and_applies_to_its_token_holders_only() -> None:
    """docs/REFERENCE.md §4.2, §5.4: ``groups: {corp:ops: ...}`` names an OAuth token's group; the
    policy process adds ``<issuer>:<group>`` to the account's groups for that token's calls; lint
    does not call it a missing OS group; the user-subject syntax still has no ':'."""
    from mcpd.policy.grants_lint import lint_policy

    text = "groups:\n  corp:ops:\n    privileged:\n      tools:\n        files/read: {allowed: true, paths: [/var/log]}\n"
    p = parse_policy(text)
    assert allowed(p, "/var/log/x", user="bob", groups=frozenset({"corp:ops"}))
    assert not allowed(p, "/var/log/x", user="bob", groups=frozenset({"ops"}))
    assert not lint_policy(p, NOW, lambda _: True, lambda _: False)
    with pytest.raises(PolicyError, match="invalid user name"):
        parse_policy(text.replace("groups:", "users:"))
    with pytest.raises(PolicyError, match="invalid group name"):
        parse_policy(text.replace("corp:ops", "\"corp:o ps\""))


@pytest.mark.root
def test_grants_test_and_list_judge_an_oauth_tokens_groups(tmp_path: Path) -> None:
    """``--token-group corp:ops`` judges the call of an OAuth token carrying group ops of issuer
    corp: the account's own groups and the token's together, as the policy process decides it."""
    text = "groups:\n  corp:ops:\n    privileged:\n      tools:\n        files/read: {allowed: true, paths: [/var/log]}\n"
    path = write_root_file(tmp_path, text)
    runner = CliRunner()
    args = ["test", "--user", "nobody", "--tool", "files/read", "--path", "/var/log/a", "--file", path]
    assert runner.invoke(grants, args).exit_code == 1
    yes = runner.invoke(grants, [*args, "--token-group", "corp:ops"])
    assert yes.exit_code == 0 and "groups.corp:ops" in yes.output
    bad = runner.invoke(grants, [*args, "--token-group", "ops"])
    assert bad.exit_code == 2 and "<issuer name>:<group>" in bad.output
    listed = runner.invoke(grants, ["list", "--user", "nobody", "--token-group", "corp:ops", "--file", path])
    assert "files/read via groups.corp:ops" in listed.output
