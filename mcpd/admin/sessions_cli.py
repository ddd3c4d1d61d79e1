"""``mcpd users sessions`` (list and revoke login tokens) and ``mcpd users unlock``
(docs/REFERENCE.md §5.2, §5.3). Root only.

Both work on the policy process's state folder (``helper_state_dir``, :mod:`mcpd.policy.login`): a
login token is one file there, so revoking deletes it and the helper refuses the token on its next
check (the front closes its sessions within a second); ``unlock`` edits ``lockout.json`` under the
lock the helper takes for every attempt, like ``faillock --reset``.
"""

from __future__ import annotations

import datetime
import os
import pwd

import click

from mcpd.common.folders import safe_folder
from mcpd.common.printable import printable
from mcpd.policy.login import Store, unlock


def _state_folder(config_path: str) -> int:
    """The policy process's state folder of ``config_path``'s mcpd.yaml, opened as it does."""
    from mcpd.common.config import POLICY_USER, ConfigError, load

    if os.geteuid() != 0:
        raise click.ClickException("must run as root (the policy process's state is its own and root's)")
    try:
        return safe_folder(load(config_path).helper_state_dir, owner=pwd.getpwnam(POLICY_USER).pw_uid, create=False)
    except (ConfigError, OSError, KeyError) as exc:
        raise click.ClickException(str(exc)) from None


_CONFIG = click.option("--config", "config_path", default="/etc/mcpd/mcpd.yaml", show_default=True,
                       type=click.Path(dir_okay=False), help="The daemon configuration (its helper_state_dir)")


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@click.command("sessions")
@_CONFIG
@click.option("--revoke", "revoke_id", metavar="ID", help="Revoke the login token with this id")
@click.option("--revoke-user", metavar="OS_USER", help="Revoke every login token of this OS account")
def sessions(config_path: str, revoke_id: str | None, revoke_user: str | None) -> None:
    """List login tokens (id, OS account, login time, expiry, address; tab-separated, escaped), or
    revoke some."""
    store = Store(_state_folder(config_path))
    if revoke_id:
        if not store.revoke(revoke_id):
            raise click.ClickException(printable(f"no login token {revoke_id}"))
        click.echo(printable(f"revoked {revoke_id}"))
        return
    if revoke_user:
        click.echo(printable(f"revoked {store.revoke_user(revoke_user)} login token(s) of {revoke_user}"))
        return
    for rec in store.records():  # the address and account name came from a client: escaped
        fields = (rec.id, rec.os_user, f"login {_when(rec.login_time)}", f"expires {_when(rec.expires)}",
                  f"from {rec.peer}")
        click.echo("\t".join(printable(f) for f in fields))


@click.command("unlock")
@click.argument("os_user")
@_CONFIG
def unlock_cmd(os_user: str, config_path: str) -> None:
    """Clear the login lockout and failure count of OS account OS_USER (like faillock --reset)."""
    try:
        found = unlock(_state_folder(config_path), os_user)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"lockout state unreadable: {exc}") from None
    click.echo(printable(f"unlocked {os_user}" if found else f"{os_user} had no login failures recorded"))
