"""`mcpd grants` shows what the daemon enforces, run as root against real files, real OS
accounts and groups, and root's real opener: `grants test` predicts the opener's refusals (symlink
in path, several hard links, not a regular file) with the opener's own judgement; `check` warns
about names that are no account or group; every readable view escapes what a file or a client
controls (`grants test`, `users list`, `users sessions`)."""

from __future__ import annotations

import os
import pwd
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from mcpd.admin.cli import main as mcpd_main
from mcpd.admin.grants_cli import grants
from mcpd.common.config import POLICY_USER
from mcpd.common.folders import safe_folder
from mcpd.common.grantmatch import split_entry
from mcpd.helper.wire.errors import ToolError
from mcpd.helper.wire.opener import open_checked
from mcpd.policy.login import Store
from tests.support.osaccounts import AccountFactory, os_accounts  # noqa: F401 (fixture)

FORGED = "x\nallowed: granted\x1b[2J\u202efdp.exe"  # a newline, ESC, a right-to-left override
SHOWN = "x\\x0aallowed: granted\\x1b[2J\\u202efdp.exe"


def grants_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "mcp-sudo.yaml"
    path.write_text(textwrap.dedent(body))
    os.chmod(path, 0o600)
    return str(path)


def run(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(grants, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output.splitlines()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A granted folder holding what root's opener refuses and what it opens."""
    app = tmp_path / "app"
    (app / "sub").mkdir(parents=True)
    (app / "plain.log").write_text("ok\n")
    (app / "shadow-link").symlink_to("/etc/shadow")
    (app / "linked-dir").symlink_to(app / "sub")
    (app / "sub" / "in-sub.log").write_text("s\n")
    (app / "twice.log").write_text("two names\n")
    os.link(app / "twice.log", tmp_path / "outside-second-name")
    os.mkfifo(app / "pipe")
    (app / FORGED).write_text("forged\n")
    return app


@pytest.mark.root
@pytest.mark.parametrize(("name", "tool", "reason"), [
    ("shadow-link", "files/read", "symlink in path"),
    ("linked-dir/in-sub.log", "files/read", "symlink in path"),  # a symlinked folder on the way
    ("twice.log", "files/read", "file has several hard links"),
    ("twice.log", "files/filetype", "file has several hard links"),
    ("pipe", "files/read", "not a regular file (fifo)"),
    ("plain.log", "files/find", "not a directory (regular file)"),
    ("shadow-link", "files/list", "symlink in path"),
    ("twice.log", "files/grep", "file has several hard links"),  # a file searched alone
    ("pipe", "files/grep", "not a regular file (fifo)"),
    ("shadow-link", "files/grep", "symlink in path"),
])
def test_grants_test_predicts_what_the_opener_refuses(tmp_path: Path, tree: Path, name: str, tool: str,
                                                      reason: str) -> None:
    me = pwd.getpwuid(os.geteuid()).pw_name
    path = grants_file(tmp_path, f"""
        users:
          {me}:
            privileged:
              tools:
                {tool}: {{allowed: true, paths: ["{tree}"]}}
        """)
    code, out = run("test", "--user", me, "--tool", tool, "--path", f"{tree}/{name}", "--file", path)
    assert code == 1, out
    assert out[0] == f"denied: would be refused at open: {reason}"
    assert out[2] == f"rule: users.{me} {tool} paths {tree} ({path}:6)"  # the grant itself allows it
    assert "note: the grant allows this path, but root's opener refuses it as it is on this host now" in out
    # root's opener, asked for real, refuses the same path for the same reason
    want = {"files/read": "file", "files/filetype": "any", "files/find": "dir", "files/list": "dir",
            "files/grep": "file"}[tool]
    with pytest.raises(ToolError) as refused:
        fd, _ = open_checked(f"{tree}/{name}", False, want)
        os.close(fd)
    said = refused.value.details.get("reason") or refused.value.message.split(":")[0]
    assert reason.startswith(said), (reason, refused.value.message, refused.value.details)


@pytest.mark.root
@pytest.mark.parametrize(("name", "tool"), [("plain.log", "files/read"), ("pipe", "files/filetype"),
                                            ("pipe", "files/list"), ("sub", "files/find"), ("sub", "files/list"),
                                            ("sub", "files/grep"), ("plain.log", "files/grep")])
def test_grants_test_says_the_opener_would_open_it(tmp_path: Path, tree: Path, name: str, tool: str) -> None:
    me = pwd.getpwuid(os.geteuid()).pw_name
    path = grants_file(tmp_path, f"""
        users:
          {me}: {{privileged: {{tools: {{{tool}: {{allowed: true, paths: ["{tree}"]}}}}}}}}
        """)
    code, out = run("test", "--user", me, "--tool", tool, "--path", f"{tree}/{name}", "--file", path)
    assert (code, out[0]) == (0, "allowed: granted"), out
    assert "open: checked on this host: root's opener would open it" in out
    gone = run("test", "--user", me, "--tool", tool, "--path", f"{tree}/not-there", "--file", path)
    assert gone[0] == 0 and "open: the path does not exist on this host, so what root's opener does was not " \
                              "checked" in gone[1]


@pytest.mark.root
def test_grants_test_with_a_grant_of_everything_follows_links_but_not_into_secrets(tmp_path: Path, tree: Path) -> None:
    """A grant covering / follows symlinks (so shadow-link would be read), but the real path is
    still checked against the daemon's own secrets."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    path = grants_file(tmp_path, f"users: {{{me}: {{privileged: {{tools: {{files/read: {{allowed: true, paths: [/]}}}}}}}}}}\n")
    code, out = run("test", "--user", me, "--tool", "files/read", "--path", f"{tree}/shadow-link", "--file", path)
    assert (code, out[0]) == (0, "allowed: granted") and "symlinks: followed (the grant covers /)" in out, out
    (tree / "to-grants").symlink_to(path)
    code, out = run("test", "--user", me, "--tool", "files/read", "--path", f"{tree}/to-grants", "--file", path)
    assert (code, out[0]) == (1, "denied: would be refused at open: the daemon's own secrets are never served"), out


@pytest.mark.root
def test_grants_test_escapes_the_path_it_shows(tmp_path: Path, tree: Path) -> None:
    me = pwd.getpwuid(os.geteuid()).pw_name
    path = grants_file(tmp_path, f"users: {{{me}: {{privileged: {{tools: {{files/read: {{allowed: true, paths: ['{tree}']}}}}}}}}}}\n")
    code, out = run("test", "--user", me, "--tool", "files/read", "--path", f"{tree}/{FORGED}", "--file", path)
    assert code == 0 and out[:2] == ["allowed: granted", f"path: {tree}/{SHOWN}"], out
    assert sum(line.startswith("allowed: ") for line in out) == 1  # the name forged no second verdict
    code, out = run("test", "--user", f"bad{FORGED}", "--tool", "files/read", "--path", f"/nope/{FORGED}",
                    "--file", path)
    assert code == 1 and out[1] == f"path: /nope/{SHOWN}" and f"no OS account is named bad{SHOWN}" in out[-1], out
    assert not any("\x1b" in line or "\u202e" in line for line in out)


@pytest.mark.root
def test_grants_check_knows_real_accounts_and_groups(tmp_path: Path, os_accounts: AccountFactory) -> None:  # noqa: F811
    ops = os_accounts.group()
    ann = os_accounts.user(groups=(ops,))
    rule = "{privileged: {tools: {files/read: {allowed: true, paths: [/var/log]}}}}"
    good = grants_file(tmp_path, f"users: {{{ann.name}: {rule}}}\ngroups: {{{ops}: {rule}}}\n")
    assert run("check", "--strict", good) == (0, [f"{good}: parsed OK"])
    typo = grants_file(tmp_path, f"users: {{{ann.name}x: {rule}}}\ngroups: {{{ops}x: {rule}}}\n")
    code, out = run("check", typo)
    assert code == 0 and out == [
        f"warning: {typo}:1: users.{ann.name}x: no OS account is named {ann.name}x: its rules apply to no one "
        "(check the spelling)",
        f"warning: {typo}:2: groups.{ops}x: no OS group is named {ops}x: its rules apply to no one "
        "(check the spelling)",
        f"{typo}: parsed OK"]
    code, out = run("check", "--strict", typo)
    assert code == 1 and out[-1] == f"{typo}: 2 warning(s); failing (--strict)"
    broken = grants_file(tmp_path, "users: {x: {privileged: {tools: {files/read: {allowed: yes}}}}}\n")
    assert run("check", broken)[0] == 1 and run("check", "--strict", broken)[0] == 1


@pytest.mark.root
def test_grants_list_and_test_judge_a_real_group_members_reauth_rule(tmp_path: Path,
                                                                     os_accounts: AccountFactory) -> None:  # noqa: F811
    """Through the OS's own group membership (no --group): the group's reauth_after shows in
    list, and test judges a login on both sides of it."""
    ops = os_accounts.group()
    ann = os_accounts.user(groups=(ops,))
    path = grants_file(tmp_path, f"""
        groups:
          {ops}:
            privileged:
              tools:
                files/read: {{allowed: true, paths: [/var/log], reauth_after: 20s}}
        """)
    code, out = run("list", "--user", ann.name, "--file", path)
    assert code == 0 and f"  files/read via groups.{ops} (allowed, reauth_after 20s, {path}:6)" in out, out
    base = ("test", "--user", ann.name, "--tool", "files/read", "--path", "/var/log/mcpd-test-none", "--file", path)
    assert run(*base)[1][0] == "denied: reauthentication required"  # a users.yaml token
    assert run(*base, "--login-age", "10s")[0] == 0
    assert run(*base, "--login-age", "10m")[1][0] == "denied: reauthentication required"


def test_entry_problems_and_subsumption() -> None:
    """The pieces of check's 'no path can match' warnings, including a component too long."""
    from mcpd.common.grantmatch import Entry
    from mcpd.policy.grants_lint import entry_problems, entry_subsumes

    def problem(text: str) -> str | None:
        return entry_problems(Entry(text, split_entry(text), 1))[0]

    assert problem("/srv/" + "a" * 256) is not None and problem("/srv/" + "a" * 255) is None
    assert problem("/srv/" + "?" * 256) is not None and problem("/srv/*" + "?" * 254) is None
    assert problem("/" + "/".join(["a" * 200] * 21)) is not None  # over PATH_MAX
    assert problem("/srv/[z-a]") is not None and problem("/srv/[a-z]") is None
    assert problem("/srv/[.][.]") is not None and problem("/srv/[.][.][.]") is None and problem("/srv/.*") is None
    assert entry_subsumes(split_entry("/srv"), split_entry("/srv/app/*.log"))
    assert entry_subsumes(split_entry("/srv/*"), split_entry("/srv/a?p"))
    assert entry_subsumes(split_entry("/srv/**"), split_entry("/srv/**/x"))
    assert not entry_subsumes(split_entry("/srv/*"), split_entry("/srv/**"))  # /srv itself is not covered
    assert not entry_subsumes(split_entry("/srv/a*"), split_entry("/srv/b*"))
    assert not entry_subsumes(split_entry("/srv/app"), split_entry("/srv"))


def test_users_list_escapes_what_the_file_says(tmp_path: Path) -> None:
    users = tmp_path / "users.yaml"
    users.write_text(textwrap.dedent("""\
        users:
          ann:
            os_user: ann
            tokens:
              - id: 0123456789ab
                salt: 0123456789abcdef0123456789abcdef
                sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
                created: "2026-01-01T00:00:00Z\\nmallory\\tos_user=root\\ttokens: none\\e[2J\\u202e"
        """))
    os.chmod(users, 0o600)
    res = CliRunner().invoke(mcpd_main, ["users", "list", "--file", str(users)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [
        "ann\tos_user=ann\ttokens: 0123456789ab (created 2026-01-01T00:00:00Z\\x0amallory\\x09os_user=root\\x09"
        "tokens: none\\x1b[2J\\u202e)"]


@pytest.mark.root
def test_users_sessions_escapes_the_client_address_and_account(tmp_path: Path) -> None:
    policy_uid = pwd.getpwnam(POLICY_USER).pw_uid
    state = tmp_path / "helper-state"
    fd = safe_folder(str(state), owner=policy_uid)
    try:
        _, issued, _ = Store(fd).issue("ann", 3600, "203.0.113.7:5\nfff0\tforged\tlogin 2026\x1b[2J")
    finally:
        os.close(fd)
    cfg = tmp_path / "mcpd.yaml"
    cfg.write_text(f"helper_state_dir: {state}\n")
    res = CliRunner().invoke(mcpd_main, ["users", "sessions", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{issued.id}\tann\tlogin ")
    assert lines[0].endswith("\tfrom 203.0.113.7:5\\x0afff0\\x09forged\\x09login 2026\\x1b[2J"), lines
