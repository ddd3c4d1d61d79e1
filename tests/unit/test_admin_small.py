"""The small operator fixes of issue 14: `users add` refuses root, `users list` says when it is
empty, `grants list`/`grants test` say when no OS account has the name, `certs` gives the server
key to the service group, help texts and shipped files speak of behaviour and name only commands
that exist, bootstrap.sh sees /sbin as non-root."""

from __future__ import annotations

import os
import pwd
import re
import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from mcpd.admin.cli import main as mcpd_main

ROOT = Path(__file__).resolve().parents[2]
GRANT = "users: {alice: {privileged: {tools: {files/read: {allowed: true, paths: [/var/log]}}}}}\n"
UNKNOWN = "no-such-account-x"


def uid0_names() -> list[str]:
    return sorted({p.pw_name for p in pwd.getpwall() if p.pw_uid == 0})


@pytest.mark.parametrize("account", uid0_names())
def test_users_add_refuses_root_under_any_name(tmp_path: Path, account: str) -> None:
    users = tmp_path / "users.yaml"
    res = CliRunner().invoke(mcpd_main, ["users", "add", "ops", "--os-user", account, "--file", str(users)])
    assert res.exit_code == 2
    assert "uid 0" in res.stderr and "mcp-sudo.yaml" in res.stderr
    assert not users.exists() and "mcpd_" not in res.stdout
    res = CliRunner().invoke(mcpd_main, ["users", "add", "root", "--file", str(users)])  # NAME is the account
    assert res.exit_code == 2 and not users.exists()


def test_users_list_says_when_there_is_nobody(tmp_path: Path) -> None:
    res = CliRunner().invoke(mcpd_main, ["users", "list", "--file", str(tmp_path / "users.yaml")])
    assert res.exit_code == 0
    assert res.stdout == ""
    assert res.stderr == f"no principals in {tmp_path / 'users.yaml'}; add one with `mcpd users add NAME`\n"


def test_grants_list_and_test_say_the_user_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / "mcp-sudo.yaml"
    path.write_text(GRANT)
    path.chmod(0o644)
    base = ["--file", str(path), "--any-owner"]
    listed = CliRunner().invoke(mcpd_main, ["grants", "list", "--user", UNKNOWN, *base])
    assert listed.exit_code == 0 and "  (no grants)" in listed.stdout
    assert f"note: no OS account is named {UNKNOWN}" in listed.stderr
    tested = CliRunner().invoke(mcpd_main, ["grants", "test", "--user", UNKNOWN, "--tool", "files/read",
                                            "--path", "/var/log/x", *base])
    assert tested.exit_code == 1 and tested.stdout.startswith("denied: no grant covers this path")
    assert f"note: no OS account is named {UNKNOWN}" in tested.stderr
    me = pwd.getpwuid(os.geteuid()).pw_name
    known = CliRunner().invoke(mcpd_main, ["grants", "list", "--user", me, *base])
    assert known.exit_code == 0 and known.stderr == ""


def all_commands(group: click.Command, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], click.Command]:
    found = {path: group}
    for name, sub in getattr(group, "commands", {}).items():
        found.update(all_commands(sub, (*path, name)))
    return found


def test_help_texts_cite_no_spec_sections() -> None:
    for path in all_commands(mcpd_main):
        text = CliRunner().invoke(mcpd_main, [*path, "--help"]).output
        assert "SPEC" not in text, path


def test_documents_name_only_commands_that_exist() -> None:
    commands = all_commands(mcpd_main)
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(p for p in (ROOT / "etc").rglob("*") if p.is_file()),
             *(p for p in (ROOT / "systemd").rglob("*") if p.is_file())]
    named = 0
    for f in files:
        for m in re.finditer(r"`mcpd ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)*)", f.read_text()):
            words = tuple(m.group(1).split())
            # the longest prefix that is a command; the next word must then not look like a subcommand
            n = max(k for k in range(len(words) + 1) if words[:k] in commands)
            cmd = commands[words[:n]]
            assert n > 0 and (n == len(words) or not isinstance(cmd, click.Group)), (f.name, m.group(0))
            named += 1
    assert named >= 10


def test_shipped_examples_cite_no_spec_sections() -> None:
    for f in (ROOT / "etc" / "mcpd").iterdir():
        assert "docs/REFERENCE.md §" not in f.read_text(), f.name


@pytest.mark.root
def test_bootstrap_sees_sbin_when_not_root() -> None:
    """As an unprivileged user with a bare PATH, the package check still finds ldconfig and useradd."""
    res = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "bash",
                          str(ROOT / "scripts" / "bootstrap.sh"), "--check"],
                         env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout) == (0, "system packages: all present\n"), res.stderr


def test_certs_give_the_server_key_to_the_service_group(tmp_path: Path) -> None:
    import grp
    import stat

    gid = grp.getgrnam("nogroup").gr_gid
    res = CliRunner().invoke(mcpd_main, ["certs", "--dir", str(tmp_path / "tls"), "--host", "h", "--group", "nogroup"])
    assert res.exit_code == 0, res.output
    key, folder, ca_key = (tmp_path / "tls" / "server.key", tmp_path / "tls", tmp_path / "tls" / "ca.key")
    assert (stat.S_IMODE(key.stat().st_mode), key.stat().st_gid) == (0o640, gid)
    assert (stat.S_IMODE(folder.stat().st_mode), folder.stat().st_gid) == (0o750, gid)
    assert stat.S_IMODE(ca_key.stat().st_mode) == 0o600  # the CA key is never shared
    private = CliRunner().invoke(mcpd_main, ["certs", "--dir", str(tmp_path / "own"), "--host", "h", "--group", ""])
    assert private.exit_code == 0
    assert stat.S_IMODE((tmp_path / "own" / "server.key").stat().st_mode) == 0o600
    missing = CliRunner().invoke(mcpd_main, ["certs", "--dir", str(tmp_path / "x"), "--host", "h",
                                             "--group", "no-such-group-x"])
    assert missing.exit_code == 2 and not (tmp_path / "x").exists()


def test_operator_messages_say_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a new operator following the README: each of these failed without saying what to
    do. ``linuxctl login`` with no terminal names --password-stdin (it printed Python's echo
    warning and "Aborted!"); ``audit verify`` names the log it looked for and --config;
    ``install-systemd`` warns about a venv whose interpreter lies under /root (the policy process
    and the workers cannot run it, and the helper only said the policy process ended)."""
    from mcpd.admin import install
    from mcpd.client.linuxctl import main as linuxctl_main

    res = CliRunner().invoke(linuxctl_main, ["login", "--user", "nobody"], input="")
    assert res.exit_code == 2 and "--password-stdin" in res.output
    cfg = tmp_path / "mcpd.yaml"
    cfg.write_text(f"audit_log: {tmp_path / 'none' / 'audit.jsonl'}\n")
    res = CliRunner().invoke(mcpd_main, ["audit", "verify", "--config", str(cfg)])
    assert res.exit_code != 0 and str(tmp_path / "none" / "audit.jsonl") in res.output and "--config" in res.output
    monkeypatch.setattr(install.os.path, "realpath", lambda p: "/root/.pyenv/bin/python3" if p == install.sys.executable
                        else str(p))
    monkeypatch.setattr(install.sys, "prefix", "/opt")
    assert any("/usr/bin/python3 -m venv" in w for w in install.prefix_warnings())
