"""``linuxctl login``, ``logout`` and ``contexts``: the token in use and the servers the config
file names. The HTTP side of logins is :mod:`mcpd.client.login`.
"""

from __future__ import annotations

import datetime
import sys

import click

from mcpd.client.config import Settings, config_path, load_config_file, resolve
from mcpd.client.errors import MCPClientError
from mcpd.client.linuxctl.calls import fail
from mcpd.common.printable import printable


@click.command("contexts")
def contexts_cmd() -> None:
    """List the config file's contexts (* marks current-context) with their URLs."""
    try:
        file = load_config_file(config_path())
    except MCPClientError as exc:
        fail(exc)
    if not file.contexts:
        click.echo(f"no contexts in {config_path()}", err=True)
        return
    for name in sorted(file.contexts):
        mark = "*" if name == file.current else " "
        click.echo(f"{mark} {name}\t{file.contexts[name].get('url', file.top.get('url', ''))}")


@click.command("login")
@click.option("--user", "user", help="OS account to log in as [default: the current user]")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input (first line)")
@click.option("--oidc", is_flag=True, help="Log in at the organisation's identity provider (OAuth) instead of "
              "with an OS password: the device authorization grant, or --browser")
@click.option("--browser", is_flag=True, help="With --oidc: authorization code + PKCE in a browser, redirected "
              "to 127.0.0.1")
@click.option("--issuer", default=None, help="With --oidc: the issuer URL [default: the server's only "
              "authorization server]")
@click.option("--client-id", envvar="MCPD_OIDC_CLIENT_ID", default=None,
              help="With --oidc: the public client id registered for linuxctl [MCPD_OIDC_CLIENT_ID]")
@click.option("--resource", default=None, help="With --oidc: the server's resource URI [default: from its "
              "protected-resource metadata]")
@click.option("--no-resource", is_flag=True, help="With --oidc: send no resource parameter (Entra ID's v2 "
              "endpoints refuse it)")
@click.option("--privileged", is_flag=True, help="With --oidc: ask for files:privileged too")
@click.option("--scope", default=None, help="With --oidc: the whole scope to ask for instead (Entra: "
              "'api://GUID/files:read')")
@click.option("--audience", default=None, help="With --oidc: an audience parameter too (Auth0: the API identifier)")
@click.option("--idp-cacert", default=None, type=click.Path(dir_okay=False),
              help="With --oidc: PEM CA file to trust for the identity provider [default: the system's CAs]")
@click.pass_obj
def login_cmd(settings: Settings, user: str | None, password_stdin: bool, oidc: bool, browser: bool,
              issuer: str | None, client_id: str | None, resource: str | None, no_resource: bool, privileged: bool,
              scope: str | None, audience: str | None, idp_cacert: str | None) -> None:
    """Log in with your OS password; prints `export MCP_TOKEN=...` (use: eval "$(linuxctl login)").

    The token expires (8 h by default) and is printed only, never written to disk by linuxctl.

    With --oidc: get an access token from the identity provider instead; it is never printed, but
    kept for the context (~/.config/linuxctl/tokens/CONTEXT.json, 0600) and used by later commands
    of that context, refreshed before it expires when the provider gave a refresh token.
    """
    if oidc:
        from mcpd.client.linuxctl.oidc_login import oidc_login

        oidc_login(settings, browser=browser, issuer=issuer, client_id=client_id, resource=resource,
                   send_resource=not no_resource, privileged=privileged, scope=scope, audience=audience,
                   idp_cafile=idp_cacert)
        return
    import getpass

    from mcpd.client import login as login_client

    name = user or getpass.getuser()
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    elif not sys.stdin.isatty():
        raise click.UsageError("no terminal to ask for the password on: "
                               "give it on standard input with --password-stdin")
    else:
        password = getpass.getpass(f"password for {name}: ")
    try:
        url, cacert = _server(settings)
        answer = login_client.login(url, name, password, cacert, timeout=max(settings.timeout, 60.0))
    except MCPClientError as exc:
        fail(exc)
    click.echo(f"export MCP_TOKEN={answer['token']}")
    expires = datetime.datetime.fromtimestamp(int(answer.get("expires") or 0)).astimezone()
    click.echo(f"logged in as {answer.get('user')}; token expires {expires:%Y-%m-%d %H:%M:%S %Z}", err=True)


@click.command("logout")
@click.option("--oidc", is_flag=True, help="Forget the context's tokens from `login --oidc` (the identity "
              "provider's session is not ended)")
@click.pass_obj
def logout_cmd(settings: Settings, oidc: bool) -> None:
    """Revoke the login token in use (MCP_TOKEN, --token or the config file)."""
    from mcpd.client import login as login_client

    if oidc:
        from mcpd.client.tokenstore import forget

        try:
            context = settings.context or load_config_file(config_path()).current
            click.echo("forgot the stored tokens" if forget(context) else "no stored tokens", err=True)
        except MCPClientError as exc:
            fail(exc)
        return

    try:
        url, token, cacert = resolve(settings)
        login_client.logout(url, token, cacert, timeout=settings.timeout)
    except MCPClientError as exc:
        fail(exc)
    click.echo("logged out", err=True)


@click.command("approve")
@click.argument("confirm_id")
@click.option("--deny", is_flag=True, help="Deny the call instead")
@click.pass_obj
def approve_cmd(settings: Settings, confirm_id: str, deny: bool) -> None:
    """Approve (or --deny) a privileged call waiting for an approver: CONFIRM_ID is the last part
    of its confirmation page's address. Acts as the token's principal (MCP_TOKEN, --token or the
    config file), which the call's grant must name in approve.by."""
    from mcpd.client import login as login_client

    try:
        url, token, cacert = resolve(settings)
        answer = login_client.approve(url, token, confirm_id, cacert, deny, timeout=settings.timeout)
    except MCPClientError as exc:
        fail(exc)
    view = answer.get("view") or {}
    said = " ".join(printable(str(view.get(k))) for k in ("principal", "op", "path"))  # the agent chose the path
    if view.get("resolves_to") and view["resolves_to"] != view.get("path"):  # through a symlink: what is read
        said += f" (resolves to {printable(str(view['resolves_to']))})"
    click.echo(f"{printable(str(answer.get('message')))}: {said}", err=True)


def _server(settings: Settings) -> tuple[str, str | None]:
    """``(url, cacert)`` from the flags, environment or config file (no token needed)."""
    url, _token, cacert = resolve(settings, need_token=False)
    return url, cacert
