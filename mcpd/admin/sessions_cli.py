"""``mcpd users sessions``: list and revoke login tokens (SPEC §5.2; issue 5). Root only.

It reads the root helper's store (``<helper_state_dir>/issued-tokens.json``, :mod:`mcpd.helper.issued`)
under the same lock the helper uses; the helper notices the change on the next request, and the
front closes the sessions of a revoked token within a second.
"""

from __future__ import annotations

import datetime
import os

import click

from mcpd.helper.issued import IssuedStore, StoreError, store_path


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@click.command("sessions")
@click.option("--config", "config_path", default="/etc/mcpd/mcpd.yaml", show_default=True,
              type=click.Path(dir_okay=False), help="The daemon configuration (its helper_state_dir holds the store)")
@click.option("--revoke", "revoke_id", metavar="ID", help="Revoke the login token with this id")
@click.option("--revoke-user", metavar="OS_USER", help="Revoke every login token of this OS account")
def sessions(config_path: str, revoke_id: str | None, revoke_user: str | None) -> None:
    """List login tokens (id, OS account, login time, expiry, address), or revoke some."""
    from mcpd.common.config import ConfigError, load

    if os.geteuid() != 0:
        raise click.ClickException("must run as root (the store is root-only)")
    try:
        cfg = load(config_path)
        store = IssuedStore(store_path(cfg.helper_state_dir))
    except (ConfigError, StoreError) as exc:
        raise click.ClickException(str(exc)) from None
    if revoke_id:
        if not store.revoke(revoke_id):
            raise click.ClickException(f"no login token {revoke_id}")
        click.echo(f"revoked {revoke_id}")
        return
    if revoke_user:
        click.echo(f"revoked {store.revoke_user(revoke_user)} login token(s) of {revoke_user}")
        return
    for rec in store.records():
        click.echo(f"{rec.id}\t{rec.os_user}\tlogin {_when(rec.login_time)}\texpires {_when(rec.expires)}\tfrom {rec.peer}")
