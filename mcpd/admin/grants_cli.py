"""``mcpd grants``: the operator commands for ``mcp-sudo.yaml`` (docs/REFERENCE.md §4.5).

``check`` (like ``visudo -c``, with lint warnings), ``list --user U`` (like ``sudo -l -U U``),
``test`` (one call decided by the daemon's own :func:`mcpd.common.grantmatch.decide`, then root's
opener predicted) and ``export`` (text or JSON). The grants file and the fixed deny come from
``mcpd.yaml`` (``--config``, default ``/etc/mcpd/mcpd.yaml`` when it exists) as the daemon
computes them; a broken file makes ``list``, ``test`` and ``export`` exit 78. Text from the file
or the command line goes through :func:`mcpd.common.printable.printable`.

Rules are shown by :mod:`mcpd.admin.grants_view`; the opener is predicted by
:mod:`mcpd.admin.opener_check`. The options and loading here (``--file``, ``--config``,
``--any-owner``, :func:`_load`) are shared with ``mcpd grants at`` and ``mcpd audit``.
"""

from __future__ import annotations

import dataclasses
import datetime
import grp
import json
import os
import pwd
import sys
from typing import Any

import click

from mcpd.admin.check_cli import readable_warning, symlink_problem
from mcpd.admin.grants_view import (
    approve_text,
    duration_text,
    policy_to_dict,
    reauth_text,
    redaction_lines,
    rule_lines,
)
from mcpd.admin.opener_check import predict_open
from mcpd.common import config as mcpd_config
from mcpd.common.grantmatch import REAUTH, TOOLS, Decision, Policy, decide, entry_covers_root, utcnow
from mcpd.common.printable import printable
from mcpd.policy.grants import PolicyError, load_policy, os_groups, parse_duration, secret_paths
from mcpd.policy.grants_lint import lint_policy

DEFAULT_CONFIG = "/etc/mcpd/mcpd.yaml"


def _defaults(config_path: str | None) -> mcpd_config.Config:
    """``config_path``'s configuration, else ``/etc/mcpd/mcpd.yaml``'s when it exists, else the
    built-in defaults; a broken one exits 78 with its error."""
    path = config_path or (DEFAULT_CONFIG if os.path.exists(DEFAULT_CONFIG) else None)
    if path is None:
        return mcpd_config.Config()
    try:
        return mcpd_config.load(path)
    except mcpd_config.ConfigError as exc:
        click.echo(printable(f"error: {exc}"), err=True)
        sys.exit(mcpd_config.EXIT_CONFIG)


def _owner_uid(any_owner: bool) -> int:
    return os.geteuid() if any_owner else 0


def _secrets(grants_file: str | None, config_path: str | None) -> tuple[str, tuple[str, ...]]:
    """``(grants file, fixed deny)``: ``--file`` else the configuration's, and the daemon's secrets."""
    cfg = _defaults(config_path)
    cfg = dataclasses.replace(cfg, grants_file=grants_file or cfg.grants_file)
    return cfg.grants_file, secret_paths(cfg, config_path or DEFAULT_CONFIG)


def _load(grants_file: str | None, config_path: str | None, any_owner: bool) -> Policy:
    """The grants file (``--file``, else the configuration's) with the helper's fixed deny."""
    path, secrets = _secrets(grants_file, config_path)
    try:
        return load_policy(path, _owner_uid(any_owner), secrets)
    except PolicyError as exc:
        for line in exc.errors:
            click.echo(printable(line), err=True)
        sys.exit(mcpd_config.EXIT_CONFIG)


def _groups(user: str, given: tuple[str, ...], token_groups: tuple[str, ...] = ()) -> frozenset[str]:
    """The groups a call of ``user`` is judged with: ``given`` or the OS's, plus an OAuth token's
    groups (``<issuer>:<group>``, docs/REFERENCE.md §5.4), as the policy process adds them."""
    for g in token_groups:
        if ":" not in g:
            raise click.BadParameter(f"{printable(g)}: an OAuth token's group is <issuer name>:<group>",
                                     param_hint="--token-group")
    return (frozenset(given) if given else os_groups(user)) | frozenset(token_groups)


_token_group_option = click.option(
    "--token-group", "token_groups", multiple=True, metavar="ISSUER:GROUP",
    help="Judge as an OAuth token carrying this group, added to the account's groups (repeat)")


def _exists(lookup: Any, name: str) -> bool:
    try:
        lookup(name)
    except KeyError:
        return False
    return True


def _note_unknown(user: str) -> None:
    """Say on stderr when no OS account is named ``user``: grants are matched by account name, so
    an answer for a misspelt name would otherwise look like a real "no grants"."""
    if not _exists(pwd.getpwnam, user):
        click.echo(f"note: no OS account is named {printable(user)}: grants are matched by OS account name, so "
                   "this answer is about a user who cannot log in (check the spelling)", err=True)


def _now(text: str | None, param: str = "--now") -> datetime.datetime:
    """``text`` (ISO 8601 with a UTC offset) as an aware datetime, or the current time."""
    if not text:
        return utcnow()
    try:
        now = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter("must be an ISO 8601 time", param_hint=param) from None
    if now.tzinfo is None:
        raise click.BadParameter("must carry a UTC offset (Z)", param_hint=param)
    return now


def _fixed_deny(policy: Policy) -> None:
    click.echo("Fixed deny (the daemon's own secrets, never served whatever a grant says):")
    for secret in policy.secrets:
        click.echo(printable(f"  deny {secret}"))


_file_option = click.option("--file", "grants_file", default=None, type=click.Path(dir_okay=False),
                            help="The grants file (default: from --config, else /etc/mcpd/mcp-sudo.yaml)")
_config_option = click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
                              help="mcpd.yaml, to find grants_file and audit_log")
_any_owner_option = click.option("--any-owner", is_flag=True,
                                 help="Accept a file owned by the current user (development mode)")
_now_option = click.option("--now", "now_text", default=None,
                           help="Judge expiry at this ISO 8601 time with a UTC offset instead of now")


@click.group()
def grants() -> None:
    """Check, list, test and export privileged grants (mcp-sudo.yaml)."""


@grants.command()
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option("--strict", is_flag=True, help="Exit 1 when there is any warning")
@_now_option
@_config_option
@_any_owner_option
def check(file: str | None, strict: bool, now_text: str | None, config_path: str | None, any_owner: bool) -> None:
    """Check FILE like `visudo -c`: exit 0 if it parses, 1 with file:line errors otherwise.

    Also warns (exit 1 with --strict) about users and groups that are no OS account or group,
    expired rules, entries every path of which is denied or that no path can match, grants of
    everything, and a file every account may read."""
    now = _now(now_text)
    path, secrets = _secrets(file, config_path)
    try:
        if os.path.islink(path):
            raise PolicyError([symlink_problem(path)])
        policy = load_policy(path, _owner_uid(any_owner), secrets)
    except PolicyError as exc:
        for line in exc.errors:
            click.echo(printable(line), err=True)
        sys.exit(1)
    readable = readable_warning(path)
    if readable:
        click.echo(printable(readable), err=True)
    warnings = lint_policy(policy, now, lambda u: _exists(pwd.getpwnam, u), lambda g: _exists(grp.getgrnam, g))
    for table in (policy.users, policy.groups):
        for rules in table.values():
            for rule in rules.values():
                warnings += [(e.line, f"{rule.subject} {rule.tool}: paths {e.text} grants every file on the system "
                                      "(/etc/shadow, SSH host keys, other users' files); grant the folders really "
                                      "needed") for e in rule.paths if rule.allowed and entry_covers_root(e.parts)]
    for at, message in sorted(warnings, key=lambda w: w[0]):
        click.echo(printable(f"warning: {path}:{at}: {message}"), err=True)
    if strict and (warnings or readable):
        click.echo(printable(f"{path}: {len(warnings) + bool(readable)} warning(s); failing (--strict)"), err=True)
        sys.exit(1)
    click.echo(printable(f"{path}: parsed OK"))


@grants.command("list")
@click.option("--user", "user", required=True, help="OS user name")
@click.option("--group", "groups", multiple=True, help="Use these groups instead of the OS's (repeat)")
@_token_group_option
@_now_option
@_file_option
@_config_option
@_any_owner_option
def list_cmd(user: str, groups: tuple[str, ...], token_groups: tuple[str, ...], now_text: str | None,
             grants_file: str | None, config_path: str | None, any_owner: bool) -> None:
    """List every grant that applies to USER, like `sudo -l -U USER`."""
    now = _now(now_text)
    policy = _load(grants_file, config_path, any_owner)
    member = _groups(user, groups, token_groups)
    sources = [(f"users.{user}", policy.users.get(user, {}))]
    sources += [(f"groups.{g}", policy.groups[g]) for g in sorted(member) if g in policy.groups]
    found = False
    click.echo(printable(f"Grants for {user} (groups: {', '.join(sorted(member)) or 'none'}):"))
    for subject, rules in sources:
        for tool in TOOLS:
            if (rule := rules.get(tool)) is not None:
                found = True
                for line in rule_lines(policy, rule, now, f"  {tool} via {subject}", "    "):
                    click.echo(line)
    if not found:
        click.echo("  (no grants)")
    _fixed_deny(policy)
    _note_unknown(user)


def _login_text(login_age: float | None, login_used: bool, window: float | None) -> str:
    if login_age is None:
        return "login: judged as a static users.yaml token (no password login; give --login-age to judge one)"
    used = "already used" if login_used else "not used yet"
    once = f" (its one call under reauth_after: 0 {used})" if window == 0 or login_used else ""
    return f"login: judged as a password login {duration_text(login_age)} ago{once}"


@grants.command()
@click.option("--user", "user", required=True, help="OS user name")
@click.option("--tool", "tool", required=True, type=click.Choice(TOOLS), help="Tool name")
@click.option("--path", "path", required=True, help="Absolute path to test")
@click.option("--group", "groups", multiple=True, help="Use these groups instead of the OS's (repeat)")
@click.option("--login-age", "login_age_text", default=None, metavar="DURATION",
              help="Judge as a token of a password login (linuxctl login) this long ago: 0, 30s, 10m, 1h "
                   "[default: a static users.yaml token, which never satisfies reauth_after]")
@click.option("--login-used", is_flag=True,
              help="With --login-age: that login already had its one call under a reauth_after: 0 rule")
@_token_group_option
@_now_option
@_file_option
@_config_option
@_any_owner_option
def test(user: str, tool: str, path: str, groups: tuple[str, ...], login_age_text: str | None, login_used: bool,
         token_groups: tuple[str, ...], now_text: str | None, grants_file: str | None, config_path: str | None,
         any_owner: bool) -> None:
    """Decide one call as the daemon would: exit 0 when it would be served, 1 when not; print the
    deciding rule and why. For a path that exists here, also predict root's opener."""
    now = _now(now_text)
    login_age = None if login_age_text is None else parse_duration(login_age_text)
    if login_age_text is not None and login_age is None:
        raise click.BadParameter("must be a duration like 0, 30s, 10m or 1h", param_hint="--login-age")
    if login_used and login_age is None:
        raise click.UsageError("--login-used needs --login-age (a static token has no login to use)")
    policy = _load(grants_file, config_path, any_owner)
    login_time = None if login_age is None else now - datetime.timedelta(seconds=login_age)
    d = decide(policy, user, _groups(user, groups, token_groups), tool, path, now, login_time=login_time,
               login_used=login_used)
    refused, opened = _open_check(policy, d, tool)
    verdict = f"denied: would be refused at open: {refused}" if refused else \
        f"{'allowed' if d.allowed else 'denied'}: {d.reason}"
    lines = [verdict, f"path: {d.resolved_path if d.resolved_path is not None else '(invalid)'}",
             f"rule: {d.rule or '(none)'}"]
    lines += [f"note: {d.note}"] if d.note and d.reason != REAUTH else []  # a refused login: the reauth line says it
    if d.reauth_after is not None or login_age is not None:
        lines.append(_login_text(login_age, login_used, d.reauth_after))
    lines += [reauth_text(d.reauth_after)] if d.reauth_after is not None else []
    if d.allowed and d.reauth_after == 0:
        lines.append("note: this call would use the login's one reauth_after: 0 call; the next one is refused")
    lines += ["symlinks: followed (the grant covers /)"] if d.covers_root else []
    lines += [f"note: the call waits for an approver: {approve_text(d.approve)}"] if d.allowed and d.approve else []
    lines += [opened] if opened else []
    lines += redaction_lines(d.redact, _defaults(config_path).users_file, user) if d.allowed else []
    for line in lines:
        click.echo(printable(line))
    _note_unknown(user)
    sys.exit(0 if d.allowed and not refused else 1)


def _open_check(policy: Policy, d: Decision, tool: str) -> tuple[str | None, str | None]:
    """``(refusal, open: line)`` of :func:`predict_open` for an allowed decision; nothing for a refusal."""
    if not d.allowed or d.resolved_path is None:
        return None, None
    try:
        why = predict_open(policy, d.resolved_path, tool, d.covers_root)
    except (FileNotFoundError, NotADirectoryError):
        return None, "open: the path does not exist on this host, so what root's opener does was not checked"
    except OSError as exc:
        return None, (f"open: could not look at the path as root's opener would ({exc.strerror}); run as root "
                      "to check it")
    if why is None:
        return None, "open: checked on this host: root's opener would open it"
    return why, "note: the grant allows this path, but root's opener refuses it as it is on this host now"


@grants.command()
@click.option("--json", "as_json", is_flag=True, help="JSON output (default: text)")
@_now_option
@_file_option
@_config_option
@_any_owner_option
def export(as_json: bool, now_text: str | None, grants_file: str | None, config_path: str | None,
           any_owner: bool) -> None:
    """Print the whole policy: every rule of every user and group, then the fixed deny."""
    now = _now(now_text)
    policy = _load(grants_file, config_path, any_owner)
    if as_json:
        click.echo(json.dumps(policy_to_dict(policy), indent=2, sort_keys=True))
        return
    click.echo(printable(f"Grants in {policy.source}:"))
    rules = [r for table in (policy.users, policy.groups) for name in sorted(table) for r in
             (table[name][t] for t in TOOLS if t in table[name])]
    for rule in rules:
        for line in rule_lines(policy, rule, now, f"  {rule.subject} {rule.tool}", "    "):
            click.echo(line)
    if not rules:
        click.echo("  (no grants)")
    _fixed_deny(policy)


@click.group()
def _main() -> None:
    """Stand-alone entry (``python -m mcpd.admin.grants_cli``) until ``mcpd.admin.cli`` registers the group."""


_main.add_command(grants)

if __name__ == "__main__":
    _main()
