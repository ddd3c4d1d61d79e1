"""``linuxctl login --oidc``: find the server's resource and issuer, get a token from the identity
provider (:mod:`mcpd.client.oidc`), keep it for the context (:mod:`mcpd.client.tokenstore`).

What it prints goes to stderr: the verification URL and user code (device grant) or the URL to
open (``--browser``), then who is logged in and until when. The token itself is never printed.
"""

from __future__ import annotations

import datetime

import click

from mcpd.client import oidc, tokenstore
from mcpd.client.config import Settings, config_path, load_config_file, resolve
from mcpd.client.errors import MCPClientError, UsageError
from mcpd.client.linuxctl.calls import fail
from mcpd.common.printable import printable

SCOPE_READ, SCOPE_PRIVILEGED = "files:read", "files:privileged"


def _choose_issuer(metadata: dict[str, object] | None, issuer: str | None) -> str:
    servers = metadata.get("authorization_servers") if metadata else None
    listed = [s for s in servers if isinstance(s, str)] if isinstance(servers, list) else []
    if issuer:
        if listed and issuer not in listed:
            raise UsageError(f"the server does not trust the issuer {issuer} (it names: {', '.join(listed)})")
        return issuer
    if len(listed) == 1:
        return listed[0]
    if not listed:
        raise UsageError("the server names no authorization server: give --issuer")
    raise UsageError(f"the server trusts several issuers, choose one with --issuer: {', '.join(listed)}")


def _show_code(uri: str, user_code: str, complete: str) -> None:
    click.echo(printable(f"To log in, open {uri} and enter the code {user_code}"), err=True)
    if complete:
        click.echo(printable(f"(or open {complete})"), err=True)
    click.echo("waiting for the approval ...", err=True)


def _open_browser(url: str) -> None:
    import webbrowser

    click.echo(printable(f"Open this URL to log in (trying your browser): {url}"), err=True)
    try:
        webbrowser.open(url)
    except Exception:  # noqa: BLE001 (no browser is fine: the URL is printed)
        pass


def oidc_login(settings: Settings, *, browser: bool, issuer: str | None, client_id: str | None,
               resource: str | None, send_resource: bool, privileged: bool, scope: str | None,
               audience: str | None, idp_cafile: str | None) -> None:
    """Run the login and store the tokens; exits with the client's status on failure."""
    try:
        if not client_id:
            raise UsageError("--oidc needs the public client id registered for linuxctl: --client-id "
                             "(or MCPD_OIDC_CLIENT_ID)")
        url, _token, cacert = resolve(settings, need_token=False)
        metadata = oidc.resource_metadata(url, cacert, settings.timeout)
        chosen = _choose_issuer(metadata, issuer)
        named = metadata.get("resource") if metadata else None
        resource = resource or (named if isinstance(named, str) else None)
        if not resource:
            raise UsageError("the server publishes no resource metadata: give --resource (its canonical URI)")
        wanted = scope or " ".join([SCOPE_READ] + ([SCOPE_PRIVILEGED] if privileged else []))
        provider = oidc.discover(chosen, idp_cafile, settings.timeout)
        request = oidc.Request(client_id, wanted, resource if send_resource else "", audience or "")
        if browser:
            tokens = oidc.browser_login(provider, request, idp_cafile, _open_browser, settings.timeout)
        else:
            tokens = oidc.device_login(provider, request, idp_cafile, _show_code, settings.timeout)
        context = settings.context or load_config_file(config_path()).current
        path = tokenstore.save(context, {
            "access_token": tokens.access_token, "expires_at": tokens.expires_at,
            "refresh_token": tokens.refresh_token, "scope": tokens.scope or wanted, "issuer": provider.issuer,
            "token_endpoint": provider.token_endpoint, "client_id": client_id, "resource": resource,
            "audience": audience or "", "idp_cafile": idp_cafile or "", "server": tokenstore.server_key(url)})
    except MCPClientError as exc:
        fail(exc)
    until = (datetime.datetime.fromtimestamp(tokens.expires_at).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
             if tokens.expires_at else "the provider did not say")
    renew = "; renewed with its refresh token" if tokens.refresh_token else ""
    click.echo(printable(f"logged in at {provider.issuer} (scope: {tokens.scope or wanted}); token kept in "
                         f"{path}, valid until {until}{renew}"), err=True)
