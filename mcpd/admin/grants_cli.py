"""``mcpd grants``: operator commands for ``mcp-sudo.yaml`` (SPEC §4).

* ``mcpd grants check [FILE]`` — like ``visudo -c``: exit 0 and ``FILE: parsed OK``, or exit 1
  with one ``file:line: message`` per problem on stderr. A grant of everything (an entry covering
  ``/``, like ``paths: ["/"]``) is a warning on stderr (exit 0).
* ``mcpd grants list --user U`` — like ``sudo -l -U U``: every tool, path, deny entry and expiry
  that applies to U, directly or through its OS groups, then the fixed deny of the daemon's own
  secrets (SPEC §4.5a), which no grant overrides.
* ``mcpd grants test --user U --tool T --path P`` — exit 0 when allowed, 1 when denied; prints the
  rule that decided and why (a secret answers ``denied: the daemon's own secrets are never served``).
* ``mcpd grants export --json`` — the policy as JSON.

The grants file defaults to ``mcpd.yaml``'s ``grants_file``
(``--config``, default ``/etc/mcpd/mcpd.yaml`` when it exists), else the built-in defaults; the
fixed deny is computed from the same configuration, as the helper does. A broken grants file makes ``list``, ``test`` and
``export`` exit 78 (configuration error).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from typing import Any

import dataclasses

import click

from mcpd.common import config as mcpd_config
from mcpd.policy.grants import TOOLS, Policy, PolicyError, Rule, decide, load_policy, os_groups, secret_paths, utcnow
from mcpd.policy.entries import entry_covers_root

_FMT = "%Y-%m-%dT%H:%M:%SZ"
DEFAULT_CONFIG = "/etc/mcpd/mcpd.yaml"


def _defaults(config_path: str | None) -> mcpd_config.Config:
    if not config_path:
        return mcpd_config.load(DEFAULT_CONFIG) if os.path.exists(DEFAULT_CONFIG) else mcpd_config.Config()
    try:
        return mcpd_config.load(config_path)
    except mcpd_config.ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(mcpd_config.EXIT_CONFIG)


def _owner_uid(any_owner: bool) -> int:
    return os.geteuid() if any_owner else 0


def _load(grants_file: str | None, config_path: str | None, any_owner: bool) -> Policy:
    """The grants file (``--file``, else the configuration's) with the helper's fixed deny."""
    cfg = _defaults(config_path)
    cfg = dataclasses.replace(cfg, grants_file=grants_file or cfg.grants_file)
    try:
        return load_policy(cfg.grants_file, _owner_uid(any_owner), secret_paths(cfg, config_path or DEFAULT_CONFIG))
    except PolicyError as exc:
        for line in exc.errors:
            click.echo(line, err=True)
        sys.exit(mcpd_config.EXIT_CONFIG)


def _groups(user: str, given: tuple[str, ...]) -> frozenset[str]:
    return frozenset(given) if given else os_groups(user)


def _note_unknown(user: str) -> None:
    """Say on stderr when no OS account is named ``user``: grants are matched by account name, so
    an answer for a misspelt name would otherwise look like a real "no grants"."""
    import pwd

    try:
        pwd.getpwnam(user)
    except KeyError:
        click.echo(f"note: no OS account is named {user}: grants are matched by OS account name, so "
                   "this answer is about a user who cannot log in (check the spelling)", err=True)


def rule_to_dict(rule: Rule) -> dict[str, Any]:
    """The JSON shape of one rule (``allowed``, ``paths``, ``deny``, ``expires`` or null, ``line``)."""
    return {
        "allowed": rule.allowed,
        "paths": [e.text for e in rule.paths],
        "deny": [e.text for e in rule.deny],
        "expires": rule.expires.strftime(_FMT) if rule.expires else None,
        "line": rule.line,
    }


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """The JSON shape of a policy, mirroring the YAML file (SPEC §4.2)."""
    def subjects(table: dict[str, dict[str, Rule]]) -> dict[str, Any]:
        return {
            name: {"privileged": {"tools": {t: rule_to_dict(r) for t, r in sorted(rules.items())}}}
            for name, rules in sorted(table.items())
        }

    return {"users": subjects(policy.users), "groups": subjects(policy.groups)}


_file_option = click.option("--file", "grants_file", default=None, type=click.Path(dir_okay=False),
                            help="The grants file (default: from --config, else /etc/mcpd/mcp-sudo.yaml)")
_config_option = click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
                              help="mcpd.yaml, to find grants_file and audit_log")
_any_owner_option = click.option("--any-owner", is_flag=True,
                                 help="Accept a file owned by the current user (development mode)")


@click.group()
def grants() -> None:
    """Check, list, test and export privileged grants (mcp-sudo.yaml)."""


@grants.command()
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@_config_option
@_any_owner_option
def check(file: str | None, config_path: str | None, any_owner: bool) -> None:
    """Check FILE like `visudo -c`: exit 0 if it parses, 1 with file:line errors otherwise."""
    path = file or _defaults(config_path).grants_file
    try:
        policy = load_policy(path, _owner_uid(any_owner))
    except PolicyError as exc:
        for line in exc.errors:
            click.echo(line, err=True)
        sys.exit(1)
    for table in (policy.users, policy.groups):
        for rules in table.values():
            for rule in rules.values():
                for entry in (e for e in rule.paths if rule.allowed and entry_covers_root(e.parts)):
                    click.echo(f"warning: {path}:{entry.line}: {rule.subject} {rule.tool}: paths {entry.text} "
                               "grants every file on the system (/etc/shadow, SSH host keys, other users' "
                               "files); grant the folders really needed", err=True)
    click.echo(f"{path}: parsed OK")


@grants.command("list")
@click.option("--user", "user", required=True, help="OS user name")
@click.option("--group", "groups", multiple=True, help="Use these groups instead of the OS's (repeat)")
@_file_option
@_config_option
@_any_owner_option
def list_cmd(user: str, groups: tuple[str, ...], grants_file: str | None, config_path: str | None,
             any_owner: bool) -> None:
    """List every grant that applies to USER, like `sudo -l -U USER`."""
    policy = _load(grants_file, config_path, any_owner)
    member = _groups(user, groups)
    now = utcnow()
    sources = [(f"users.{user}", policy.users.get(user, {}))]
    sources += [(f"groups.{g}", policy.groups[g]) for g in sorted(member) if g in policy.groups]
    found = False
    click.echo(f"Grants for {user} (groups: {', '.join(sorted(member)) or 'none'}):")
    for subject, rules in sources:
        for tool in TOOLS:
            rule = rules.get(tool)
            if rule is None:
                continue
            found = True
            state = "allowed" if rule.allowed else "not allowed"
            if rule.allowed and rule.expired(now):
                state = "expired"
            expires = f", expires {rule.expires.strftime(_FMT)}" if rule.expires else ""
            click.echo(f"  {tool} via {subject} ({state}{expires}, {policy.source}:{rule.line})")
            for entry in rule.paths:
                click.echo(f"    path {entry.text} ({policy.source}:{entry.line})")
            for entry in rule.deny:
                click.echo(f"    deny {entry.text} ({policy.source}:{entry.line})")
    if not found:
        click.echo("  (no grants)")
    click.echo("Fixed deny (the daemon's own secrets, never served whatever a grant says):")
    for secret in policy.secrets:
        click.echo(f"  deny {secret}")
    _note_unknown(user)


@grants.command()
@click.option("--user", "user", required=True, help="OS user name")
@click.option("--tool", "tool", required=True, type=click.Choice(TOOLS), help="Tool name")
@click.option("--path", "path", required=True, help="Absolute path to test")
@click.option("--group", "groups", multiple=True, help="Use these groups instead of the OS's (repeat)")
@click.option("--now", "now_text", default=None, help="Judge at this ISO 8601 UTC time instead of now")
@_file_option
@_config_option
@_any_owner_option
def test(user: str, tool: str, path: str, groups: tuple[str, ...], now_text: str | None,
         grants_file: str | None, config_path: str | None, any_owner: bool) -> None:
    """Decide one call: exit 0 when allowed, 1 when denied; print the deciding rule and why."""
    policy = _load(grants_file, config_path, any_owner)
    now = utcnow()
    if now_text:
        try:
            now = datetime.datetime.fromisoformat(now_text)
        except ValueError:
            raise click.BadParameter("must be an ISO 8601 time", param_hint="--now") from None
        if now.tzinfo is None:
            raise click.BadParameter("must carry a UTC offset (Z)", param_hint="--now")
    d = decide(policy, user, _groups(user, groups), tool, path, now)
    click.echo(f"{'allowed' if d.allowed else 'denied'}: {d.reason}")
    click.echo(f"path: {d.resolved_path if d.resolved_path is not None else '(invalid)'}")
    click.echo(f"rule: {d.rule or '(none)'}")
    if d.note:
        click.echo(f"note: {d.note}")
    if d.covers_root:
        click.echo("symlinks: followed (the grant covers /)")
    _note_unknown(user)
    sys.exit(0 if d.allowed else 1)


@grants.command()
@click.option("--json", "as_json", is_flag=True, default=True, help="JSON output (the only format)")
@_file_option
@_config_option
@_any_owner_option
def export(as_json: bool, grants_file: str | None, config_path: str | None, any_owner: bool) -> None:
    """Print the whole policy as JSON."""
    policy = _load(grants_file, config_path, any_owner)
    click.echo(json.dumps(policy_to_dict(policy), indent=2, sort_keys=True))


@click.group()
def _main() -> None:
    """Stand-alone entry (``python -m mcpd.admin.grants_cli``) until ``mcpd.admin.cli`` registers the group."""


_main.add_command(grants)

if __name__ == "__main__":
    _main()
