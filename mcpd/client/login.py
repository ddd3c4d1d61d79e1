"""Client side of password logins (docs/REFERENCE.md §5.2, §6): ``POST /login`` and ``POST /logout``.

Used by ``linuxctl login`` / ``linuxctl logout`` and by tests. Errors are the client's exception
family (:mod:`mcpd.client.errors`), so ``linuxctl`` exits 3 for a refused login and 4 when the server
cannot be reached, is not trusted, or cannot check passwords now (no helper unit, or its policy
process down).
"""

from __future__ import annotations

from typing import Any

import httpx

from mcpd.client.endpoints import sse_url, ssl_context
from mcpd.client.errors import AuthError, ConnectError, ProtocolError, UsageError
from mcpd.client.refusal import retry_after, server_message


def route_url(url: str, route: str) -> str:
    """``https://host:port[/base]/ROUTE`` for a server URL as ``linuxctl`` takes it (with or without ``/sse``)."""
    return sse_url(url)[: -len("/sse")] + "/" + route


def _post(url: str, route: str, cafile: str | None, timeout: float, **kwargs: Any) -> httpx.Response:
    try:
        with httpx.Client(verify=ssl_context(cafile), timeout=timeout) as client:
            return client.post(route_url(url, route), **kwargs)
    except httpx.HTTPError as exc:
        raise ConnectError(f"cannot reach {url}: {type(exc).__name__}: {exc}") from None


def login(url: str, user: str, password: str, cafile: str | None, timeout: float = 60.0) -> dict[str, Any]:
    """Log in with an OS password; return ``{"token", "expires" (UNIX seconds), "user"}``.

    Raises:
        AuthError: refused (wrong password, locked or expired account, lockout): exit 3.
        ConnectError: unreachable, untrusted, or the server cannot check passwords (503): exit 4.
        UsageError: bad URL or CA file.
    """
    if not user or not password:
        raise UsageError("user and password must not be empty")
    resp = _post(url, "login", cafile, timeout, json={"user": user, "password": password})
    if resp.status_code == 401:
        raise AuthError("authentication failed")
    if resp.status_code == 503:
        raise ConnectError(_unavailable(resp))
    if resp.status_code != 200:
        raise ProtocolError(f"login answered {resp.status_code}: {server_message(resp.content)}")
    data = resp.json()
    if not isinstance(data, dict) or not isinstance(data.get("token"), str):
        raise ProtocolError("login answer has no token")
    return data


def logout(url: str, token: str, cafile: str | None, timeout: float = 30.0) -> None:
    """Revoke the login ``token`` on the server.

    Raises:
        AuthError: the token is already invalid (exit 3).
        UsageError: it is a static token, which ``mcpd users rotate`` changes instead (exit 2).
        ConnectError: unreachable, or the server cannot check tokens now (503): exit 4.
    """
    resp = _post(url, "logout", cafile, timeout, headers={"Authorization": f"Bearer {token}"})
    if resp.status_code == 401:
        raise AuthError("token is not valid (already logged out or expired)")
    if resp.status_code == 400:
        raise UsageError(server_message(resp.content))
    if resp.status_code == 503:
        raise ConnectError(_unavailable(resp))
    if resp.status_code != 200:
        raise ProtocolError(f"logout answered {resp.status_code}")


def approve(url: str, token: str, confirm_id: str, cafile: str | None, deny: bool = False,
            timeout: float = 30.0) -> dict[str, Any]:
    """Approve (or, ``deny``, deny) the waiting privileged call ``confirm_id`` as the token's
    principal (``linuxctl approve``); return ``{"message", "view"}`` (who asked for what).

    Raises:
        AuthError: the token is not valid (exit 3), or the approval was refused (not an approver
            of the grant, one's own request): exit 3.
        UsageError: an unknown, used or expired id (exit 2).
        ConnectError: unreachable, or the policy process is down (503): exit 4.
    """
    resp = _post(url, f"approve/{confirm_id}", cafile, timeout, headers={"Authorization": f"Bearer {token}"},
                 json={"decision": "deny" if deny else "approve"})
    if resp.status_code in (401, 403):
        raise AuthError(server_message(resp.content) if resp.status_code == 403 else "token is not valid")
    if resp.status_code in (400, 404):
        raise UsageError(server_message(resp.content))
    if resp.status_code == 503:
        raise ConnectError(_unavailable(resp))
    if resp.status_code != 200:
        raise ProtocolError(f"approve answered {resp.status_code}")
    data = resp.json()
    return data if isinstance(data, dict) else {}


def _unavailable(resp: httpx.Response) -> str:
    """A ``503``'s text: the server's message, and its ``Retry-After`` when it sent one (its policy
    process is restarting) rather than none (it has no helper unit at all)."""
    seconds = retry_after(resp.headers)
    return server_message(resp.content) + ("" if seconds is None else f" (retry after {seconds} s)")
