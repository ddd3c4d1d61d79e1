"""``mcpd users``: principals (a name bound to an OS account) and their tokens in ``users.yaml``.

``add``, ``rotate``, ``remove``, ``redact`` and ``list`` edit or show the file under a lock on its folder;
``rotate`` and ``remove`` also revoke the account's password-login tokens when run as root. The
login-token commands of the group (``sessions``, ``unlock``) are :mod:`mcpd.admin.sessions_cli`'s;
:mod:`mcpd.admin.cli` adds them.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import pwd
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from mcpd.common import identity
from mcpd.common.printable import printable
from mcpd.common.redaction import RedactError, describe, parse_redact

DEFAULT_USERS_FILE = "/etc/mcpd/users.yaml"


def users_file_option(fn: Callable[..., None]) -> Callable[..., None]:
    """Add ``--file`` and ``--config`` to a users command and pass it the resolved ``users_file``:
    ``--file`` (or ``MCPD_USERS_FILE``) wins, else the ``users_file`` of ``--config``'s mcpd.yaml,
    else ``/etc/mcpd/users.yaml``."""

    @click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
                  help="mcpd.yaml, to find users_file")
    @click.option("--file", "users_file", default=None, envvar="MCPD_USERS_FILE", type=click.Path(dir_okay=False),
                  help=f"The users file [MCPD_USERS_FILE; default: from --config, else {DEFAULT_USERS_FILE}]")
    @functools.wraps(fn)
    def wrapper(*args: Any, config_path: str | None, users_file: str | None, **kwargs: Any) -> None:
        if users_file is None and config_path:
            from mcpd.common.config import EXIT_CONFIG, ConfigError, load

            try:
                users_file = load(config_path).users_file
            except ConfigError as exc:
                click.echo(f"error: {exc}", err=True)
                sys.exit(EXIT_CONFIG)
        fn(*args, users_file=users_file or DEFAULT_USERS_FILE, **kwargs)

    return wrapper


@contextlib.contextmanager
def locked_users(path: str) -> Iterator[dict[str, identity.UserRecord]]:
    """Load ``users.yaml`` under an exclusive lock on its folder; save on a clean exit.

    Raises:
        click.ClickException: the file is malformed (exit 1).
    """
    folder = Path(path).resolve().parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            users = identity.load_users(path)
        except identity.UsersFileError as exc:
            raise click.ClickException(str(exc)) from None
        yield users
        identity.save_users(path, users)
    finally:
        os.close(fd)


def check_os_user(name: str) -> None:
    """Refuse a principal bound to an OS account that does not exist, or to root (uid 0 under any
    name): unprivileged calls run with the account's own rights, and the workers never run as root.

    Raises:
        click.BadParameter: a malformed name, no such account, or uid 0 (exit 2).
    """
    if not identity.NAME_RE.match(name):
        raise click.BadParameter(f"invalid account name {name!r}", param_hint="--os-user")
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        raise click.BadParameter(f"no such OS account: {name}", param_hint="--os-user") from None
    if uid == 0:
        raise click.BadParameter(
            f"{name} is root (uid 0): a principal's calls run with its account's rights, never root's; "
            "map it to an unprivileged account and grant root-only files in mcp-sudo.yaml",
            param_hint="--os-user")


def issue_token(users: dict[str, identity.UserRecord], name: str, os_user: str) -> str:
    """Replace ``name``'s tokens with one fresh token (its ``redact`` kept); return the plain token (to print once)."""
    token, record = identity.new_token()
    old = users.get(name)
    users[name] = identity.UserRecord(name=name, os_user=os_user, tokens=[record],
                                      redact=old.redact if old is not None else ())
    return token


@click.group()
def users() -> None:
    """Manage principals (a name bound to an OS account) and their tokens in users.yaml."""


@users.command("add")
@click.argument("name")
@click.option("--os-user", help="OS account whose rights the principal uses [default: NAME]")
@users_file_option
def users_add(name: str, os_user: str | None, users_file: str) -> None:
    """Add principal NAME and print its token (shown only this once)."""
    if not identity.NAME_RE.match(name):
        raise click.BadParameter(f"invalid principal name {name!r}", param_hint="NAME")
    account = os_user or name
    check_os_user(account)
    with locked_users(users_file) as table:
        if name in table:
            raise click.ClickException(f"principal {name} exists; use `mcpd users rotate {name}`")
        token = issue_token(table, name, account)
    click.echo(token)


def end_logins(os_user: str) -> None:
    """After ``users rotate`` or ``remove``: revoke the OS account's login tokens in the root
    helper's state (root only; the folder comes from ``--config``, else /etc/mcpd/mcpd.yaml), so
    the helper refuses them at their next check and the front closes their sessions. Says on
    stderr what it did, or why it could not."""
    from mcpd.admin.sessions_cli import _state_folder
    from mcpd.policy.login import Store

    config_path = click.get_current_context().params.get("config_path") or "/etc/mcpd/mcpd.yaml"
    if os.geteuid() != 0 or not os.path.exists(config_path):
        click.echo(f"note: login tokens of {os_user} not revoked (needs root and {config_path}); "
                   f"run: mcpd users sessions --revoke-user {os_user}", err=True)
        return
    try:
        count = Store(_state_folder(config_path)).revoke_user(os_user)
    except click.ClickException as exc:
        click.echo(f"note: login tokens of {os_user} not revoked: {exc.message}", err=True)
        return
    click.echo(f"revoked {count} login token(s) of {os_user}", err=True)


@users.command("rotate")
@click.argument("name")
@users_file_option
def users_rotate(name: str, users_file: str) -> None:
    """Revoke NAME's tokens and print a fresh one (shown only this once)."""
    with locked_users(users_file) as table:
        if name not in table:
            raise click.ClickException(f"no principal {name}")
        token = issue_token(table, name, table[name].os_user)
        os_user = table[name].os_user
    click.echo(token)
    end_logins(os_user)


@users.command("remove")
@click.argument("name")
@users_file_option
def users_remove(name: str, users_file: str) -> None:
    """Remove principal NAME and all its tokens."""
    with locked_users(users_file) as table:
        removed = table.pop(name, None)
        if removed is None:
            raise click.ClickException(f"no principal {name}")
    click.echo(f"removed {name}")
    end_logins(removed.os_user)


@users.command("list")
@users_file_option
def users_list(users_file: str) -> None:
    """List principals: name, OS account, token ids with creation and expiry (never digests).

    One line a principal, tab-separated; text from the file is escaped (mcpd.common.printable)."""
    try:
        table = identity.load_users(users_file)
    except identity.UsersFileError as exc:
        raise click.ClickException(str(exc)) from None
    if not table:
        click.echo(printable(f"no principals in {users_file}; add one with `mcpd users add NAME`"), err=True)
        return
    for name, rec in sorted(table.items()):  # the file is hand-editable: every field escaped
        tokens = ", ".join(
            f"{t.id} (created {t.created}{', expires ' + t.expires if t.expires else ''})" for t in rec.tokens
        )
        fields = [name, f"os_user={rec.os_user}", f"tokens: {tokens or 'none'}"]
        fields += [f"redact: {describe(rec.redact)}"] if rec.redact else []
        click.echo("\t".join(printable(f) for f in fields))


@users.command("redact")
@click.argument("name")
@click.argument("detectors", nargs=-1, required=True)
@users_file_option
def users_redact(name: str, detectors: tuple[str, ...], users_file: str) -> None:
    """Have NAME's answers redacted: DETECTORS is `secrets` (all), `none`, or detector names
    (private-key cloud-key token url-password shadow-hash assignment); docs/REFERENCE.md §3."""
    try:
        chosen = () if detectors == ("none",) else parse_redact(list(detectors))
    except RedactError as exc:
        raise click.BadParameter(str(exc), param_hint="DETECTORS") from None
    with locked_users(users_file) as table:
        if name not in table:
            raise click.ClickException(f"no principal {name}")
        table[name].redact = chosen
    click.echo(printable(f"{name}: redact {describe(chosen)}"))
