"""`linuxctl login --oidc` against a real OpenID provider (NanoIDP, over TLS on loopback): the
device authorization grant end to end (the code shown, approved on the provider's page, the
token kept 0600 for the context and never printed, with the audience and scopes asked for), a
refusal, refreshing a stored token, the server's protected-resource metadata (and one that names
another server), an issuer whose metadata names another issuer, and the browser flow's state
check (docs/OAUTH.md, docs/REFERENCE.md §6)."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpd.client import oidc, tokenstore
from mcpd.client.errors import AuthError, ProtocolError, UsageError
from tests.support.https_files import Served, https_server
from tests.support.nanoidp import CLIENT_ID, RESOURCE, USER, Idp, nanoidp, user_code_of

LINUXCTL = str(Path(sys.executable).parent / "linuxctl")


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Idp]:
    with nanoidp(tmp_path_factory.mktemp("nanoidp")) as running:
        yield running


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Served]:
    """The server linuxctl is pointed at (here it only answers the metadata requests)."""
    with https_server(tmp_path / "server-pki") as served:
        yield served


def claims(token: str) -> dict[str, Any]:
    body = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))))


def login(idp: Idp, server: Served, home: Path, *extra: str, approve: bool | None = True,
          issuer: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `linuxctl login --oidc`, approve (or deny; None: neither) the code it shows on the provider's page."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(home), "HOME": str(home)}
    env.pop("MCP_TOKEN", None)
    args = [LINUXCTL, "--url", server.url, "--cacert", server.cafile, "login", "--oidc", "--client-id", CLIENT_ID,
            "--idp-cacert", idp.cafile, *(["--issuer", idp.issuer] if issuer else []), *extra]
    seen: list[str] = []
    out = ""
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stderr is not None and proc.stdout is not None
        try:
            for line in proc.stderr:
                seen.append(line)
                code = user_code_of(line)
                if code and approve is not None:
                    idp.decide(code, approve=approve)
            out = proc.stdout.read()
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return subprocess.CompletedProcess(args, proc.returncode, out, "".join(seen))


def test_device_grant_end_to_end_keeps_the_token_0600_never_printed(idp: Idp, server: Served, tmp_path: Path) -> None:
    proc = login(idp, server, tmp_path, "--resource", RESOURCE, "--privileged")
    assert proc.returncode == 0, proc.stderr
    assert "To log in, open " + idp.issuer + "/device and enter the code " in proc.stderr
    path = tmp_path / "linuxctl" / "tokens" / "default.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    record = json.loads(path.read_text(encoding="utf-8"))
    token = record["access_token"]
    assert token not in proc.stdout + proc.stderr and record["refresh_token"] not in proc.stderr
    got = claims(token)
    assert got["iss"] == idp.issuer and got["sub"] == USER and got["client_id"] == CLIENT_ID
    assert RESOURCE in ([got["aud"]] if isinstance(got["aud"], str) else got["aud"])
    assert set(got["scope"].split()) >= {"files:read", "files:privileged"}
    assert record["expires_at"] > time.time() + 60
    # later commands of the context use it: the stored token fills the missing one
    from mcpd.client.config import Settings, resolve

    os.environ["XDG_CONFIG_HOME"] = str(tmp_path)
    try:
        assert resolve(Settings(url=server.url, token=None, cacert=None, timeout=10))[1] == token
        # never sent to another server, even one reached through the same (default) context
        with pytest.raises(UsageError, match="no token"):
            resolve(Settings(url="https://127.0.0.1:1", token=None, cacert=None, timeout=10))
    finally:
        del os.environ["XDG_CONFIG_HOME"]


def test_refused_login_exits_3_and_stores_nothing(idp: Idp, server: Served, tmp_path: Path) -> None:
    proc = login(idp, server, tmp_path, "--resource", RESOURCE, approve=False)
    assert proc.returncode == 3, proc.stderr
    assert "AUTH_FAILED" in proc.stderr and "refused" in proc.stderr
    assert not (tmp_path / "linuxctl" / "tokens" / "default.json").exists()


def test_stored_token_is_refreshed_before_it_expires(idp: Idp, server: Served, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    proc = login(idp, server, tmp_path, "--resource", RESOURCE, "--scope", "files:read offline_access")
    assert proc.returncode == 0, proc.stderr
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    record = tokenstore.load(None)
    assert record is not None and record["refresh_token"], record and list(record)
    tokenstore.save(None, {**record, "expires_at": time.time() + 5})  # due for renewal
    fresh = tokenstore.usable_token(None, server.url, timeout=20)
    assert fresh and fresh != record["access_token"]
    after = tokenstore.load(None)
    assert after is not None and after["access_token"] == fresh and after["expires_at"] > time.time() + 60
    tokenstore.save(None, {**after, "expires_at": time.time() - 1, "refresh_token": "forged-refresh-token"})
    assert tokenstore.usable_token(None, server.url, timeout=20) is None  # refused at the IdP: forgotten, log in again
    assert tokenstore.load(None) is None


def test_token_file_open_to_others_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    path = tokenstore.save("prod", {"access_token": "x", "expires_at": 0})
    path.chmod(0o644)
    with pytest.raises(UsageError, match="chmod 600"):
        tokenstore.load("prod")
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(UsageError, match="cannot read"):
        tokenstore.load("prod")
    with pytest.raises(UsageError, match="cannot name a token file"):
        tokenstore.token_path("../../etc/x")


def test_resource_and_issuer_come_from_the_servers_metadata(idp: Idp, server: Served, tmp_path: Path) -> None:
    """RFC 9728 document at the path-inserted location: linuxctl needs only the server's URL."""
    resource = server.url + "/mcp"
    server.routes["/.well-known/oauth-protected-resource/mcp"] = (200, json.dumps(
        {"resource": resource, "authorization_servers": [idp.issuer], "scopes_supported": ["files:read"],
         "bearer_methods_supported": ["header"]}).encode())
    proc = login(idp, server, tmp_path, issuer=False)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "linuxctl" / "tokens" / "default.json").read_text(encoding="utf-8"))
    assert record["resource"] == resource and record["issuer"] == idp.issuer
    assert server.requests[0] == "/.well-known/oauth-protected-resource/mcp"


def test_metadata_naming_another_server_is_refused(idp: Idp, server: Served, tmp_path: Path) -> None:
    """A document that claims another server's resource would get a token for that server: refused."""
    server.routes["/.well-known/oauth-protected-resource/mcp"] = (200, json.dumps(
        {"resource": "https://victim.example:9091/mcp", "authorization_servers": [idp.issuer]}).encode())
    proc = login(idp, server, tmp_path, approve=None)
    assert proc.returncode == 1 and "describes another server" in proc.stderr, proc.stderr
    server.routes["/.well-known/oauth-protected-resource/mcp"] = (200, json.dumps(
        {"resource": server.url + "/mcp", "authorization_servers": ["https://other-idp.example"]}).encode())
    proc = login(idp, server, tmp_path, approve=None)
    assert proc.returncode == 2 and "does not trust the issuer" in proc.stderr, proc.stderr


def test_issuer_metadata_naming_another_issuer_is_refused(server: Served) -> None:
    server.routes["/.well-known/openid-configuration"] = (200, json.dumps(
        {"issuer": "https://evil.example", "token_endpoint": server.url + "/token"}).encode())
    with pytest.raises(ProtocolError, match="names the issuer"):
        oidc.discover(server.url, server.cafile, 10)
    server.routes["/.well-known/openid-configuration"] = (200, json.dumps(
        {"issuer": server.url, "token_endpoint": "http://127.0.0.1:9/token"}).encode())
    with pytest.raises(ProtocolError, match="not an https URL"):
        oidc.discover(server.url, server.cafile, 10)


def test_browser_flow_refuses_a_redirect_with_a_wrong_state() -> None:
    """Another page sending the loopback listener a code of its own (login CSRF) is refused."""
    provider = oidc.Provider("https://idp.example", "https://idp.example/token", "", "https://idp.example/authorize")
    seen: dict[str, str] = {}

    def forged_redirect(url: str) -> None:
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
        seen.update(query)
        answer = httpx.get(query["redirect_uri"], params={"code": "attacker-code", "state": "guessed"})
        assert answer.status_code == 400

    with pytest.raises(AuthError, match="wrong state"):
        oidc.browser_login(provider, oidc.Request(CLIENT_ID, "files:read", RESOURCE), None, forged_redirect,
                           wait_seconds=20)
    assert seen["code_challenge_method"] == "S256" and len(seen["code_challenge"]) == 43
    assert seen["redirect_uri"].startswith("http://127.0.0.1:") and seen["resource"] == RESOURCE


def test_browser_flow_with_pkce_end_to_end(idp: Idp) -> None:
    """--browser's flow against the provider: the person logs in on its page, the redirect reaches
    the one-time loopback listener, the code is redeemed with the PKCE verifier."""
    import re
    import ssl

    provider = oidc.discover(idp.issuer, idp.cafile, 10)

    def person_at_browser(url: str) -> None:
        with httpx.Client(verify=ssl.create_default_context(cafile=idp.cafile), timeout=20) as browser:
            page = browser.get(url)
            assert page.status_code == 200, page.text[:300]
            form = {"username": idp.user, "password": idp.password}
            found = re.search(r'name="transaction_id" value="([^"]+)"', page.text)
            if found:
                form["transaction_id"] = found.group(1)
            answer = browser.post(url, data=form)
            assert answer.status_code in (302, 303), answer.text[:500]
            assert answer.headers["location"].startswith("http://127.0.0.1:")
            assert httpx.get(answer.headers["location"]).status_code == 200  # the listener's "you may close"

    tokens = oidc.browser_login(provider, oidc.Request(CLIENT_ID, "files:read", RESOURCE), idp.cafile,
                                person_at_browser, timeout=20, wait_seconds=30)
    got = claims(tokens.access_token)
    assert got["sub"] == USER and got["iss"] == idp.issuer and "files:read" in got["scope"].split()


def _device_provider(server: Served) -> oidc.Provider:
    server.posts["/device"] = [(200, json.dumps({"device_code": "dc", "user_code": "ABCD-EFGH", "interval": 1,
                                                 "expires_in": 60, "verification_uri": server.url + "/dev"}).encode())]
    return oidc.Provider(server.url, server.url + "/token", server.url + "/device")


def test_device_polling_honours_interval_and_slow_down(server: Served) -> None:
    """A provider that answers pending, then slow_down twice, then the token: each slow_down adds
    5 s to the wait between polls (here counted, not slept)."""
    provider = _device_provider(server)
    answers = [(400, {"error": "authorization_pending"}), (400, {"error": "slow_down"}),
               (400, {"error": "slow_down"}), (200, {"access_token": "a.b.c", "token_type": "Bearer",
                                                     "expires_in": 300})]
    server.posts["/token"] = [(status, json.dumps(body).encode()) for status, body in answers]
    waits: list[float] = []
    shown: list[str] = []
    tokens = oidc.device_login(provider, oidc.Request(CLIENT_ID, "files:read", RESOURCE), server.cafile,
                               lambda uri, code, _complete: shown.append(code), timeout=10, sleep=waits.append)
    assert tokens.access_token == "a.b.c" and tokens.expires_at > time.time() + 200
    assert shown == ["ABCD-EFGH"]
    assert waits == [1.0, 1.0, 6.0, 11.0]


@pytest.mark.parametrize(("error", "needle"), [("access_denied", "refused at the identity provider"),
                                               ("expired_token", "expired before it was approved"),
                                               ("invalid_grant", "refused the token: invalid_grant")])
def test_device_polling_stops_on_a_refusal(server: Served, error: str, needle: str) -> None:
    provider = _device_provider(server)
    server.posts["/token"] = [(400, json.dumps({"error": error}).encode())]
    with pytest.raises(AuthError, match=needle):
        oidc.device_login(provider, oidc.Request(CLIENT_ID, "files:read"), server.cafile,
                          lambda *_: None, timeout=10, sleep=lambda _s: None)


def test_device_token_answer_without_a_bearer_token_is_refused(server: Served) -> None:
    provider = _device_provider(server)
    server.posts["/token"] = [(200, json.dumps({"access_token": "x", "token_type": "mac"}).encode())]
    with pytest.raises(ProtocolError, match="no bearer access token"):
        oidc.device_login(provider, oidc.Request(CLIENT_ID, "files:read"), server.cafile,
                          lambda *_: None, timeout=10, sleep=lambda _s: None)


def test_oversize_documents_are_refused(server: Served) -> None:
    """A metadata document or a token answer past the cap is refused without being read whole."""
    big = json.dumps({"issuer": server.url, "token_endpoint": server.url + "/token",
                      "pad": "x" * oidc.MAX_DOCUMENT_BYTES}).encode()
    server.routes["/.well-known/openid-configuration"] = (200, big)
    with pytest.raises(ProtocolError, match="not a JSON object of at most"):
        oidc.discover(server.url, server.cafile, 10)
    provider = _device_provider(server)
    server.posts["/token"] = [(200, big)]
    with pytest.raises(ProtocolError, match="without a JSON object"):
        oidc.device_login(provider, oidc.Request(CLIENT_ID, "files:read"), server.cafile,
                          lambda *_: None, timeout=10, sleep=lambda _s: None)


@pytest.mark.parametrize("no_resource", [False, True])
def test_resource_parameter_is_sent_unless_told_not_to(server: Served, tmp_path: Path, no_resource: bool) -> None:
    """--no-resource (Entra's v2 endpoints refuse the parameter) sends none; otherwise the device
    authorization request carries the server's resource, the scope and the client id."""
    server.routes["/.well-known/openid-configuration"] = (200, json.dumps(
        {"issuer": server.url, "token_endpoint": server.url + "/token",
         "device_authorization_endpoint": server.url + "/device"}).encode())
    _device_provider(server)
    server.posts["/token"] = [(200, json.dumps({"access_token": "h.p.s", "token_type": "Bearer"}).encode())]
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path)}
    args = [LINUXCTL, "--url", server.url, "--cacert", server.cafile, "login", "--oidc", "--client-id", CLIENT_ID,
            "--idp-cacert", server.cafile, "--issuer", server.url, "--resource", RESOURCE,
            *(["--no-resource"] if no_resource else [])]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    sent = dict(urllib.parse.parse_qsl(server.bodies[0].decode()))
    assert sent["client_id"] == CLIENT_ID and sent["scope"] == "files:read"
    assert ("resource" in sent) is not no_resource and sent.get("resource", RESOURCE) == RESOURCE
