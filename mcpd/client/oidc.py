"""Getting an OAuth access token for an mcpd server from its identity provider, as ``linuxctl login
--oidc`` does: discovery, the device authorization grant (RFC 8628), the authorization code flow
with PKCE and a loopback redirect (RFC 7636, RFC 8252), and refreshing.

- :func:`resource_metadata`: the server's protected-resource metadata (RFC 9728), tried at the
  path-inserted ``/.well-known/oauth-protected-resource/…/mcp`` and then the bare form; its
  ``resource`` must name the server it was fetched from (same scheme, host and port).
- :func:`discover`: the issuer's endpoints from ``/.well-known/openid-configuration`` or
  ``/.well-known/oauth-authorization-server``; the document's ``issuer`` must be the one asked
  for, every endpoint ``https``.
- :func:`device_login`, :func:`browser_login`, :func:`refresh`: a :class:`Tokens`.

Every request goes over verified TLS (:func:`mcpd.client.endpoints.ssl_context`), redirects are not
followed, and no token is ever put in a message. Errors are the client's family: the IdP refused
(:class:`AuthError`, exit 3), it cannot be reached (:class:`ConnectError`, 4), it answered
something unusable (:class:`ProtocolError`, 1), bad input (:class:`UsageError`, 2).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import httpx

from mcpd.client.endpoints import endpoints, ssl_context
from mcpd.client.errors import AuthError, ConnectError, ProtocolError, UsageError

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
MAX_DOCUMENT_BYTES = 256 * 1024
MAX_INTERVAL = 60.0  # seconds between polls, whatever slow_down asks


@dataclass(frozen=True)
class Provider:
    """An issuer's endpoints (``device_authorization_endpoint`` and ``authorization_endpoint`` may be "")."""

    issuer: str
    token_endpoint: str
    device_authorization_endpoint: str = ""
    authorization_endpoint: str = ""


@dataclass(frozen=True)
class Tokens:
    """What a token endpoint issued: the access token, when it expires (UNIX seconds, 0: not said),
    the refresh token ("" for none) and the granted scope."""

    access_token: str
    expires_at: float
    refresh_token: str = ""
    scope: str = ""


@dataclass(frozen=True)
class Request:
    """What to ask for: the public ``client_id``, the space-separated ``scope``, the ``resource``
    (RFC 8707; "" to send none) and an ``audience`` for IdPs that take one instead (Auth0; "")."""

    client_id: str
    scope: str
    resource: str = ""
    audience: str = ""

    def params(self) -> dict[str, str]:
        extra = {k: v for k, v in (("resource", self.resource), ("audience", self.audience)) if v}
        return {"client_id": self.client_id, "scope": self.scope, **extra}


def _send(client: httpx.Client, method: str, url: str, **kwargs: Any) -> tuple[int, bytes]:
    """``(status, body)`` of one request, reading at most :data:`MAX_DOCUMENT_BYTES` + 1 bytes of
    the body (a hostile endpoint's endless answer is not read).

    Raises:
        ConnectError: the endpoint cannot be reached.
    """
    try:
        with client.stream(method, url, headers={"Accept": "application/json"}, **kwargs) as resp:
            body = b""
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > MAX_DOCUMENT_BYTES:
                    break
            return resp.status_code, body
    except httpx.HTTPError as exc:
        raise ConnectError(f"cannot reach {url}: {type(exc).__name__}: {exc}") from None


def _json_object(body: bytes) -> dict[str, Any] | None:
    """``body`` as a JSON object; None when too large, not JSON, or not an object."""
    if len(body) > MAX_DOCUMENT_BYTES:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _https(url: str, what: str) -> str:
    u = urllib.parse.urlsplit(url)
    if u.scheme != "https" or not u.hostname:
        raise ProtocolError(f"{what} is not an https URL: {url[:200]!r}")
    return url


def _get_json(client: httpx.Client, url: str) -> dict[str, Any] | None:
    """The JSON object at ``url``; None for a 404 (or 400/405: no such document)."""
    status, body = _send(client, "GET", url)
    if status in (400, 404, 405):
        return None
    if status != 200:
        raise ProtocolError(f"{url} answered {status}")
    doc = _json_object(body)
    if doc is None:
        raise ProtocolError(f"{url} is not a JSON object of at most {MAX_DOCUMENT_BYTES} bytes")
    return doc


def _client(cafile: str | None, timeout: float) -> httpx.Client:
    return httpx.Client(verify=ssl_context(cafile), timeout=timeout, follow_redirects=False)


def resource_metadata(server_url: str, cafile: str | None, timeout: float = 30.0) -> dict[str, Any] | None:
    """The server's protected-resource metadata, or None when it serves none.

    Raises:
        ProtocolError: a document whose ``resource`` names another server, or that is unusable.
        ConnectError: the server cannot be reached.
    """
    mcp = httpx.URL(endpoints(server_url)[0])
    origin = f"{mcp.scheme}://{mcp.netloc.decode('ascii')}"
    with _client(cafile, timeout) as client:
        for url in (f"{origin}/.well-known/oauth-protected-resource{mcp.path}",
                    f"{origin}/.well-known/oauth-protected-resource"):
            doc = _get_json(client, url)
            if doc is None:
                continue
            resource = doc.get("resource")
            if not isinstance(resource, str):
                raise ProtocolError(f"{url} names no resource")
            r = httpx.URL(resource)
            if (r.scheme, r.host, r.port) != (mcp.scheme, mcp.host, mcp.port):
                raise ProtocolError(f"{url} describes another server ({resource[:200]}); refusing it")
            return doc
    return None


def discover(issuer: str, cafile: str | None, timeout: float = 30.0) -> Provider:
    """The endpoints of ``issuer`` (OpenID Connect discovery, then RFC 8414's path-inserted form).

    Raises:
        ProtocolError: no metadata, an ``issuer`` other than the one asked for, an endpoint that is
            not https, or no token endpoint.
        ConnectError: the issuer cannot be reached.
    """
    _https(issuer, "the issuer")
    u = urllib.parse.urlsplit(issuer)
    path = u.path.rstrip("/")
    candidates = (f"{issuer.rstrip('/')}/.well-known/openid-configuration",
                  f"{u.scheme}://{u.netloc}/.well-known/oauth-authorization-server{path}",
                  f"{u.scheme}://{u.netloc}/.well-known/openid-configuration{path}")
    with _client(cafile, timeout) as client:
        for url in candidates:
            doc = _get_json(client, url)
            if doc is not None:
                break
        else:
            raise ProtocolError(f"{issuer} publishes no OpenID or OAuth metadata")
    if doc.get("issuer") != issuer:
        raise ProtocolError(f"{url} names the issuer {str(doc.get('issuer'))[:200]!r}, not {issuer!r}; refusing it")
    names = ("token_endpoint", "device_authorization_endpoint", "authorization_endpoint")
    found: dict[str, str] = {n: v for n in names if isinstance(v := doc.get(n), str) and v}
    if "token_endpoint" not in found:
        raise ProtocolError(f"{issuer} has no token endpoint")
    for name, value in found.items():
        _https(value, f"the issuer's {name}")
    return Provider(issuer, **found)


def _token_request(client: httpx.Client, provider: Provider, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
    status, raw = _send(client, "POST", provider.token_endpoint, data=form)
    body = _json_object(raw)
    if body is None:
        raise ProtocolError(f"the token endpoint answered {status} without a JSON object")
    return status, body


def _tokens(body: dict[str, Any]) -> Tokens:
    token, kind = body.get("access_token"), body.get("token_type")
    if not isinstance(token, str) or not token or not isinstance(kind, str) or kind.lower() != "bearer":
        raise ProtocolError("the token endpoint issued no bearer access token")
    expires_in = body.get("expires_in")
    seconds = float(expires_in) if isinstance(expires_in, int | float) and expires_in > 0 else 0.0
    refresh_token = body.get("refresh_token")
    scope = body.get("scope")
    return Tokens(token, time.time() + seconds if seconds else 0.0,
                  refresh_token if isinstance(refresh_token, str) else "", scope if isinstance(scope, str) else "")


def _refusal(body: dict[str, Any]) -> str:
    error, text = body.get("error"), body.get("error_description")
    said = str(error) if isinstance(error, str) else "refused"
    return said + (f": {text[:300]}" if isinstance(text, str) and text else "")


Show = Callable[[str, str, str], None]  # (verification_uri, user_code, verification_uri_complete or "")


def device_login(provider: Provider, request: Request, cafile: str | None, show: Show, timeout: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep) -> Tokens:
    """The device authorization grant: ask for a user code, ``show`` it, poll until approved.

    Polls every ``interval`` seconds (5 unless the IdP says), 5 s slower after each ``slow_down``
    (at most :data:`MAX_INTERVAL`), and gives up at ``expires_in``.

    Raises:
        UsageError: the issuer has no device authorization endpoint.
        AuthError: refused (``access_denied``), the code expired, or another refusal.
        ConnectError, ProtocolError: as the module says.
    """
    if not provider.device_authorization_endpoint:
        raise UsageError(f"{provider.issuer} offers no device authorization grant: use --browser")
    with _client(cafile, timeout) as client:
        status, raw = _send(client, "POST", provider.device_authorization_endpoint, data=request.params())
        grant = _json_object(raw)
        if grant is None:
            raise ProtocolError(f"the device authorization endpoint answered {status} without a JSON object")
        if status != 200:
            raise AuthError(f"the identity provider refused the device authorization: {_refusal(grant)}")
        code, user_code, uri = grant.get("device_code"), grant.get("user_code"), grant.get("verification_uri")
        if not all(isinstance(v, str) and v for v in (code, user_code, uri)):
            raise ProtocolError("the device authorization answer lacks device_code, user_code or verification_uri")
        assert isinstance(code, str) and isinstance(user_code, str) and isinstance(uri, str)
        complete = grant.get("verification_uri_complete")
        show(uri, user_code, complete if isinstance(complete, str) else "")
        interval = float(grant.get("interval") or 5) if isinstance(grant.get("interval"), int | float) else 5.0
        expires_in = grant.get("expires_in")
        deadline = time.monotonic() + (float(expires_in) if isinstance(expires_in, int | float) else 600.0)
        form = {"grant_type": DEVICE_GRANT, "device_code": code, "client_id": request.client_id}
        while True:
            sleep(min(max(interval, 1.0), MAX_INTERVAL))
            if time.monotonic() > deadline:
                raise AuthError("the user code expired before it was approved; run the login again")
            status, body = _token_request(client, provider, form)
            if status == 200:
                return _tokens(body)
            error = body.get("error")
            if error == "authorization_pending":
                continue
            if error == "slow_down":
                interval = min(interval + 5.0, MAX_INTERVAL)
                continue
            if error == "expired_token":
                raise AuthError("the user code expired before it was approved; run the login again")
            if error == "access_denied":
                raise AuthError("the login was refused at the identity provider")
            raise AuthError(f"the identity provider refused the token: {_refusal(body)}")


def refresh(provider: Provider, request: Request, refresh_token: str, cafile: str | None,
            timeout: float = 30.0) -> Tokens:
    """Exchange ``refresh_token`` for a new access token (the old refresh token is kept when the
    IdP issues no new one).

    Raises:
        AuthError: the IdP refused (the refresh token expired or was revoked).
    """
    form = {"grant_type": "refresh_token", "refresh_token": refresh_token, **request.params()}
    with _client(cafile, timeout) as client:
        status, body = _token_request(client, provider, form)
    if status != 200:
        raise AuthError(f"the identity provider refused the refresh: {_refusal(body)}")
    tokens = _tokens(body)
    return tokens if tokens.refresh_token else Tokens(tokens.access_token, tokens.expires_at, refresh_token, tokens.scope)


def pkce_pair() -> tuple[str, str]:
    """``(code_verifier, S256 code_challenge)`` (RFC 7636): 64 random URL-safe characters."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode("ascii")).digest()).rstrip(b"=").decode()
    return verifier, challenge


def browser_login(provider: Provider, request: Request, cafile: str | None, open_url: Callable[[str], None],
                  timeout: float = 30.0, wait_seconds: float = 300.0) -> Tokens:
    """The authorization code flow with PKCE: listen on ``127.0.0.1`` (a random port) for one
    redirect, ``open_url`` the authorization URL, check the ``state``, redeem the code.

    Raises:
        UsageError: the issuer has no authorization endpoint.
        AuthError: refused at the IdP, a wrong ``state``, or no answer within ``wait_seconds``.
    """
    if not provider.authorization_endpoint:
        raise UsageError(f"{provider.issuer} has no authorization endpoint")
    verifier, challenge = pkce_pair()
    state = secrets.token_urlsafe(24)
    got: dict[str, str] = {}
    done = threading.Event()

    class Callback(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            query = urllib.parse.urlsplit(self.path)
            if query.path != "/callback" or done.is_set():
                self.send_error(404)
                return
            params = {k: v[0] for k, v in urllib.parse.parse_qs(query.query).items() if v}
            if not hmac.compare_digest(params.get("state", ""), state):
                self.send_error(400, "wrong state")
                got["error"] = "the redirect carried a wrong state (another page tried to log you in)"
            else:
                got.update(params)
                body = b"mcpd: login complete; you may close this window.\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            done.set()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = HTTPServer(("127.0.0.1", 0), Callback)
    redirect_uri = f"http://127.0.0.1:{server.server_address[1]}/callback"
    thread = threading.Thread(target=lambda: _serve_until(server, done, wait_seconds), daemon=True)
    thread.start()
    try:
        query = {**request.params(), "response_type": "code", "redirect_uri": redirect_uri, "state": state,
                 "code_challenge": challenge, "code_challenge_method": "S256"}
        sep = "&" if "?" in provider.authorization_endpoint else "?"
        open_url(provider.authorization_endpoint + sep + urllib.parse.urlencode(query))
        if not done.wait(wait_seconds):
            raise AuthError(f"no answer from the browser within {wait_seconds:.0f} s")
    finally:
        done.set()
        thread.join(5)
        server.server_close()
    if "error" in got:
        raise AuthError(f"the login was refused: {_refusal(got)}" if "state" in got else got["error"])
    if not got.get("code"):
        raise AuthError("the redirect carried no authorization code")
    form = {"grant_type": "authorization_code", "code": got["code"], "redirect_uri": redirect_uri,
            "code_verifier": verifier, "client_id": request.client_id,
            **({"resource": request.resource} if request.resource else {})}
    with _client(cafile, timeout) as client:
        status, body = _token_request(client, provider, form)
    if status != 200:
        raise AuthError(f"the identity provider refused the code: {_refusal(body)}")
    return _tokens(body)


def _serve_until(server: HTTPServer, done: threading.Event, seconds: float) -> None:
    server.timeout = 0.2
    deadline = time.monotonic() + seconds
    while not done.is_set() and time.monotonic() < deadline:
        server.handle_request()
