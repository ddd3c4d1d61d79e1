"""The ``mcpd`` command: ``serve``, ``dev``, ``certs``, ``helper``, ``install-systemd`` and ``status``.

The other command groups live in their own modules (``users``: :mod:`mcpd.admin.users_cli` with
:mod:`mcpd.admin.sessions_cli`; ``grants``: :mod:`mcpd.admin.grants_cli` with ``grants at`` from
:mod:`mcpd.admin.audit.commands`; ``audit``; ``config check`` and ``users check``:
:mod:`mcpd.admin.check_cli`; ``jwks fetch``: :mod:`mcpd.admin.jwks`) and are registered at the bottom of this file.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import stat
import subprocess
import sys
from pathlib import Path

import click

from mcpd.admin import certs
from mcpd.admin.audit.commands import audit, grants_at
from mcpd.admin.check_cli import config, users_check
from mcpd.admin.grants_cli import grants
from mcpd.admin.jwks import jwks
from mcpd.admin.sessions_cli import sessions, unlock_cmd
from mcpd.admin.users_cli import users


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


@main.group("certs", invoke_without_command=True)
@click.option("--dir", "directory", default=None, type=click.Path(file_okay=False),
              help="Folder for ca.crt, ca.key, server.crt, server.key")
@click.option("--host", "hosts", multiple=True, help="DNS name or IP for the certificate (repeat)")
@click.option("--days", default=825, show_default=True, type=click.IntRange(1, 825), help="Server certificate lifetime")
@click.option("--group", default=None,
              help=f"Group that may read server.key (0640) and enter the folder (0750): the service user's, so "
                   f"the front can load its key [default: {SERVICE_GROUP} when that group exists]; "
                   "--group '' keeps both private (0600, 0700). The CA key stays 0600 either way")
@click.pass_context
def certs_cmd(ctx: click.Context, directory: str | None, hosts: tuple[str, ...], days: int, group: str | None) -> None:
    """With --dir and --host: create a private CA (reused when present) and issue a server
    certificate for HOSTs. `mcpd certs fingerprint` prints what clients pin; `mcpd certs check`
    checks a pair as the front would."""
    if ctx.invoked_subcommand is not None:
        return
    if not directory or not hosts:
        raise click.UsageError("--dir and --host are required (or a subcommand: mcpd certs fingerprint, "
                               "mcpd certs check)")
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


@certs_cmd.command("fingerprint")
@click.argument("cert", required=False, type=click.Path(dir_okay=False))
@click.option("--config", "config_path", default="/etc/mcpd/mcpd.yaml", show_default=True,
              type=click.Path(dir_okay=False), help="Without CERT: the certificate of this configuration (tls.cert)")
def certs_fingerprint(cert: str | None, config_path: str) -> None:
    """Print the SHA-256 fingerprint of CERT (PEM, the first certificate in it) and the pin of
    its public key, the values a client pins."""
    from mcpd.common.printable import printable

    if cert is None:
        from mcpd.common.config import ConfigError, load

        try:
            cert = load(config_path).tls.cert
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
    if not os.path.lexists(cert):
        raise click.ClickException(printable(missing_certificate(cert)))
    try:
        facts = certs.describe(Path(cert).read_bytes())
    except OSError as exc:
        raise click.ClickException(printable(f"cannot read the certificate {cert}: {exc.strerror}")) from None
    except ValueError:
        raise click.ClickException(printable(f"{cert} holds no PEM certificate")) from None
    click.echo(f"sha256 fingerprint: {facts.fingerprint}")
    click.echo(f"public key pin: sha256//{facts.spki_pin}")
    click.echo(f"subject: {printable(facts.subject)}")
    click.echo(f"valid until: {facts.not_after.isoformat()}")


@certs_cmd.command("check")
@click.option("--cert", default=None, type=click.Path(dir_okay=False), help="The certificate chain (PEM, leaf first)")
@click.option("--key", default=None, type=click.Path(dir_okay=False), help="Its private key (PEM)")
@click.option("--config", "config_path", default="/etc/mcpd/mcpd.yaml", show_default=True,
              type=click.Path(dir_okay=False), help="Without --cert and --key: this configuration's tls.cert and tls.key")
def certs_check(cert: str | None, key: str | None, config_path: str) -> None:
    """Check a certificate and key exactly as the front checks them before it uses them (the files'
    kind, size and modes, both parse, the key is the certificate's, the certificate is valid now,
    OpenSSL takes them), without binding anything: exit 0 with the certificate's facts, 1 with the
    reason. certs/install-pair.sh runs it before it installs a pair."""
    from mcpd.common.printable import printable
    from mcpd.front.tls import PairError, context_for, read_pair

    if (cert is None) != (key is None):
        raise click.UsageError("give both --cert and --key, or neither (then tls.cert and tls.key of --config)")
    import pwd

    from mcpd.common.config import ConfigError, load

    service_user = "mcpd"
    if cert is None or key is None:
        try:
            cfg = load(config_path)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
        cert, key, service_user = cfg.tls.cert, cfg.tls.key, cfg.service_user
    try:
        owners: tuple[int, ...] = (pwd.getpwnam(service_user).pw_uid,)  # (the front's: it may own the key)
    except KeyError:
        owners = ()
    for path in (cert, key):
        if not os.path.lexists(path):
            raise click.ClickException(printable(missing_certificate(path)))
    try:
        pair = read_pair(cert, key, owners=owners)
        context_for(pair)
    except PairError as exc:
        raise click.ClickException(printable(f"the front would refuse this pair: {exc}")) from None
    click.echo(printable(f"{cert}, {key}: the front would use this pair"))
    click.echo(printable(f"subject: {pair.subject}"))
    click.echo(f"sha256 fingerprint: {pair.fingerprint}")
    click.echo(f"valid until: {pair.not_after.isoformat()}")


def missing_certificate(path: str) -> str:
    """What to say of a certificate or key file ``path`` that does not exist: which, and the
    command that makes a pair there."""
    return (f"no file {path}: make a certificate and key with `mcpd certs --dir {os.path.dirname(path) or '.'} "
            "--host NAME` (or install an ACME pair with install-pair.sh, certs/README.md)")


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


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="The daemon configuration (mcpd.yaml)")
def helper(config_path: str) -> None:
    """Run the root helper and its policy process (token checks, grants, logins, audit, account
    workers). Root only.

    First does what systemd does for the service: makes the policy process's state and audit
    folders when they are missing (0700, owned by the mcpd-policy account, in folders only root can
    change: systemd-tmpfiles' part) and the helper's listening socket (:func:`helper_socket`:
    ``mcpd-helper.socket``'s part), then replaces this process with the helper's own small entry
    point (``python -I -m mcpd.helper``), which takes the socket as systemd hands it over (fd 3,
    ``LISTEN_PID`` and ``LISTEN_FDS=1``), so the root side never holds the CLI's libraries and
    binds nothing itself."""
    from mcpd.common.config import POLICY_USER, ConfigError, load
    from mcpd.common.folders import safe_folder

    if os.geteuid() == 0:
        try:
            cfg, policy = load(config_path), pwd.getpwnam(POLICY_USER)
            for folder in (cfg.helper_state_dir, os.path.dirname(cfg.audit_log)):
                os.close(safe_folder(folder, owner=policy.pw_uid))
        except (ConfigError, KeyError, OSError) as exc:
            raise click.ClickException(f"cannot prepare the policy process's folders: {exc}") from None
        if not cfg.helper_socket:
            raise click.ClickException(f"{config_path}: helper_socket is empty: this configuration has no root helper")
        try:
            sock = helper_socket(cfg.helper_socket, pwd.getpwnam(cfg.service_user).pw_gid)
        except (KeyError, OSError) as exc:
            raise click.ClickException(f"cannot make the helper socket {cfg.helper_socket}: {exc}") from None
        if sock.fileno() != 3:
            os.dup2(sock.fileno(), 3)  # (inheritable)
        os.set_inheritable(3, True)
        os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")  # this pid: the exec keeps it
    os.execv(sys.executable, [sys.executable, "-I", "-m", "mcpd.helper", "--config", os.path.abspath(config_path)])


def helper_socket(path: str, gid: int) -> socket.socket:
    """The root helper's listening socket at ``path``, as ``systemd/mcpd-helper.socket`` makes it:
    owner root, group ``gid`` (the service user's), mode 0660, listening; its folder is made (0755)
    when missing, and a socket an earlier helper left there is replaced. The socket gets its group
    as it is created (bound by a child whose effective gid is ``gid``, without ``CAP_CHOWN``'s
    window), and this process keeps its own ids, so its parent-death signal (``mcpd dev``'s) stays
    in force. Raises ``OSError``: ``path`` is something else than a socket, or cannot be bound."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise OSError(f"{path} exists and is not a socket")
        os.unlink(path)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # binds the socket both processes hold, then ends
        code = 1
        try:
            os.umask(0o117)
            os.setegid(gid)
            sock.bind(path)
            code = 0
        except OSError as exc:
            code = exc.errno or 1
        finally:
            os._exit(code)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code != 0:
        sock.close()
        raise OSError(code, os.strerror(code) if code > 0 else "the binding child was killed", path)
    sock.listen(64)
    return sock


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


@main.command("status")
@click.option("--config", "config_path", default="/etc/mcpd/mcpd.yaml", show_default=True,
              type=click.Path(dir_okay=False), help="The daemon configuration (mcpd.yaml)")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of lines")
def status_cmd(config_path: str, as_json: bool) -> None:
    """What runs on this host: version, listener and the certificate it serves, the TLS files and
    their last reload, sessions and workers (from the metrics endpoint), helper, grants and users
    files, the audit chains' heads. Run as root to see everything. Exit 0 when nothing needs
    looking at, 1 when something does (listed under problems)."""
    import json

    from mcpd.admin import status
    from mcpd.common.config import ConfigError

    try:
        facts = status.gather(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(facts, indent=2) if as_json else "\n".join(status.render(facts)))
    sys.exit(1 if facts["problems"] else 0)


@click.command("approve", context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def approve(args: tuple[str, ...]) -> None:
    """Approve (or --deny) a privileged call waiting for an approver: ``linuxctl approve ID``,
    with the server and token ``linuxctl`` uses (MCP_URL, MCP_TOKEN, its config file)."""
    from mcpd.client.linuxctl import main as linuxctl

    linuxctl.main(["approve", *args], prog_name="mcpd")


grants.add_command(grants_at)  # `mcpd grants at TIME`: the grants in force then, from the audit log
main.add_command(grants)
main.add_command(approve)
main.add_command(audit)
main.add_command(users)
main.add_command(jwks)  # `mcpd jwks fetch`: the OAuth issuers' key sets
main.add_command(config)  # `mcpd config check FILE`; `mcpd users check FILE` below
users.add_command(users_check)
users.add_command(sessions)
users.add_command(unlock_cmd)


if __name__ == "__main__":  # pragma: no cover
    main()
