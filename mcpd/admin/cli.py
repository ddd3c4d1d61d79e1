"""The ``mcpd`` command: ``serve``, ``dev``, ``certs``, ``users`` and ``helper``.

Other command groups live in their own modules and are registered at the bottom of this file
with ``main.add_command(...)``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import pwd
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from mcpd.admin import certs
from mcpd.common import identity
from mcpd.common.printable import printable

DEFAULT_USERS_FILE = "/etc/mcpd/users.yaml"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mcpd", prog_name="mcpd", message="%(prog)s %(version)s")
def main() -> None:
    """mcpd: serve this server's files to MCP agents over TLS."""


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="The daemon configuration (mcpd.yaml)")
def serve(config_path: str) -> None:
    """Run the front in the foreground, as the service user: it refuses to start as root (run the
    root helper with `mcpd helper` as root, and this as the service user). Exit 78 when the
    configuration is broken or when started as root."""
    from mcpd.front.server import serve as run_server

    sys.exit(run_server(config_path))


@main.command()
@click.option("--state-dir", default="./dev-state", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the CA, certificates, config and users file")
@click.option("--port", default=9091, show_default=True, type=click.IntRange(1, 65535),
              help="TCP port on 127.0.0.1")
@click.option("--new-token", is_flag=True, help="Revoke the dev token and issue a fresh one (default: keep it)")
@click.option("--metrics-port", default=0, type=click.IntRange(0, 65535),
              help="Serve /metrics and /healthz on 127.0.0.1 at this port (plain HTTP) [default: off]")
def dev(state_dir: str, port: int, new_token: bool, metrics_port: int) -> None:
    """Development mode: private CA, a `dev` user and its token, server on 127.0.0.1.

    The token stays the same across restarts unless --new-token. A second `mcpd dev` on a port or
    state folder in use refuses (exit 75) and leaves the running one alone. As root, privileged
    calls are on (the root helper runs, restarted if it dies); otherwise they are off. Ctrl-C,
    SIGTERM or a closed terminal stop it (also when started in the background); however it ends,
    nothing it started outlives it and the port is free again."""
    from mcpd.admin import devmode

    sys.exit(devmode.run(Path(state_dir), port, new_token, metrics_port))


SERVICE_GROUP = "mcpd"  # the service user's group (systemd/sysusers.d)


@main.command("certs")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="Folder for ca.crt, ca.key, server.crt, server.key")
@click.option("--host", "hosts", multiple=True, required=True, help="DNS name or IP for the certificate (repeat)")
@click.option("--days", default=825, show_default=True, type=click.IntRange(1, 825), help="Server certificate lifetime")
@click.option("--group", default=None,
              help=f"Group that may read server.key (0640) and enter the folder (0750): the service user's, so "
                   f"the front can load its key [default: {SERVICE_GROUP} when that group exists]; "
                   "--group '' keeps both private (0600, 0700). The CA key stays 0600 either way")
def certs_cmd(directory: str, hosts: tuple[str, ...], days: int, group: str | None) -> None:
    """Create a private CA (reused when present) and issue a server certificate for HOSTs."""
    gid = service_gid(group)
    pki = certs.make_pki(directory, list(hosts), days=days)
    if gid is not None:
        try:
            for path, mode in ((Path(directory), 0o750), (pki.server_key, 0o640)):
                os.chown(path, -1, gid)
                os.chmod(path, mode)
        except PermissionError:
            raise click.ClickException(f"cannot give {pki.server_key} to group {group or SERVICE_GROUP}: run as "
                                       "root, or pass --group ''") from None
    elif group is None:
        click.echo(f"note: no group {SERVICE_GROUP}: {pki.server_key} stays 0600, readable by you only; "
                   f"give it to the service user's group with --group NAME", err=True)
    for label, path in (("ca_cert", pki.ca_cert), ("ca_key", pki.ca_key),
                        ("server_cert", pki.server_cert), ("server_key", pki.server_key)):
        click.echo(f"{label}: {path.resolve()}")


def service_gid(group: str | None) -> int | None:
    """The gid that may read the server key: ``group``'s, or the service group's when ``group`` is
    None and that group exists; None for ``""`` or a missing default group.

    Raises:
        click.BadParameter: an explicitly named group does not exist (exit 2).
    """
    import grp

    try:
        return grp.getgrnam(group or SERVICE_GROUP).gr_gid if group != "" else None
    except KeyError:
        if group is None:
            return None
        raise click.BadParameter(f"no group {group}", param_hint="--group") from None


# --- users --------------------------------------------------------------------------------

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
    """Replace ``name``'s tokens with one fresh token; return the plain token (to print once)."""
    token, record = identity.new_token()
    users[name] = identity.UserRecord(name=name, os_user=os_user, tokens=[record])
    return token


@main.group()
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
        click.echo("\t".join(printable(f) for f in (name, f"os_user={rec.os_user}", f"tokens: {tokens or 'none'}")))


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="The daemon configuration (mcpd.yaml)")
def helper(config_path: str) -> None:
    """Run the root helper and its policy process (token checks, grants, logins, audit, account
    workers). Root only.

    First makes the policy process's state and audit folders when they are missing (0700, owned
    by the mcpd-policy account, in folders only root can change: what systemd-tmpfiles does for
    the service), then replaces this process with the helper's own small entry point
    (``python -I -m mcpd.helper``), so the root side never holds the CLI's libraries."""
    from mcpd.common.config import POLICY_USER, ConfigError, load
    from mcpd.common.folders import safe_folder

    if os.geteuid() == 0:
        try:
            cfg, policy = load(config_path), pwd.getpwnam(POLICY_USER)
            for folder in (cfg.helper_state_dir, os.path.dirname(cfg.audit_log)):
                os.close(safe_folder(folder, owner=policy.pw_uid))
        except (ConfigError, KeyError, OSError) as exc:
            raise click.ClickException(f"cannot prepare the policy process's folders: {exc}") from None
    os.execv(sys.executable, [sys.executable, "-I", "-m", "mcpd.helper", "--config", os.path.abspath(config_path)])


@main.command("install-systemd")
@click.option("--root", "root_dir", default=None, type=click.Path(file_okay=False),
              help="Install into this folder instead of / (a staging root: nothing is run, no systemctl)")
@click.option("--host", "hosts", multiple=True,
              help="Also make a private CA and a TLS certificate for HOST (repeat) in /etc/mcpd/tls, when none "
                   "is there yet")
@click.option("--enable", is_flag=True, help="Then enable and start the service (systemctl enable --now)")
def install_systemd(root_dir: str | None, hosts: tuple[str, ...], enable: bool) -> None:
    """Install the systemd units, sysusers and tmpfiles files, PAM service, example configuration
    and docs where the units expect them, with ExecStart= pointing at this installation.

    Your existing configuration and PAM service are kept. Without --root (as root) it then creates
    the service accounts and folders and reloads systemd."""
    from mcpd.admin import install

    live = root_dir is None
    if live and os.geteuid() != 0:
        raise click.ClickException("installing into / needs root; or stage the files with --root DIR")
    if enable and not live:
        raise click.BadParameter("--enable acts on the running system; it cannot go with --root", param_hint="--enable")
    root = Path(root_dir or "/").resolve()
    for problem in install.prefix_warnings():
        click.echo(f"warning: {problem}", err=True)
    try:
        for what, target in install.install(root):
            click.echo(f"{what}: {target}")
        if live:
            install.activate()
            click.echo("created the service accounts and folders; reloaded systemd")
    except install.InstallError as exc:
        raise click.ClickException(str(exc)) from None
    tls = root / "etc" / "mcpd" / "tls"
    if hosts and not (tls / "server.crt").exists():
        pki = certs.make_pki(tls, list(hosts))
        gid = service_gid(None) if live else None
        if gid is not None:
            os.chown(tls, -1, gid)
            os.chmod(tls, 0o750)
            os.chown(pki.server_key, -1, gid)
            os.chmod(pki.server_key, 0o640)
        click.echo(f"made a TLS certificate for {', '.join(hosts)}: {pki.server_cert} (clients trust {pki.ca_cert})")
    if enable:
        proc = subprocess.run(["systemctl", "enable", "--now", "mcpd-helper.socket", "mcpd.service"],
                              capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise click.ClickException(f"systemctl enable --now failed: {proc.stderr.strip()}; see "
                                       "`journalctl -u mcpd -u mcpd-helper`")
        click.echo("enabled and started mcpd-helper.socket and mcpd.service")
    elif live:
        click.echo("next: check /etc/mcpd/mcpd.yaml, then `systemctl enable --now mcpd-helper.socket mcpd.service`")


# Other command groups live in their own modules.
from mcpd.admin.audit_cli import audit  # noqa: E402
from mcpd.admin.grants_cli import grants  # noqa: E402

main.add_command(grants)
main.add_command(audit)

from mcpd.admin.sessions_cli import sessions, unlock_cmd  # noqa: E402

users.add_command(sessions)
users.add_command(unlock_cmd)


if __name__ == "__main__":  # pragma: no cover
    main()
