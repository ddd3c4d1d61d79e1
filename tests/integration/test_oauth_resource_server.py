"""mcpd as an OAuth 2.1 resource server (docs/REFERENCE.md §5.4), the real daemon: helper, policy
process and front as in production, tokens from a real OpenID provider on loopback
(``oidc-provider-mock``) and from an issuer of our own keys; static tokens and password logins
keep working beside them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.client.auth.utils import (
    extract_field_from_www_auth,
    extract_resource_metadata_from_www_auth,
    extract_scope_from_www_auth,
    handle_protected_resource_response,
)

from mcpd.client import login as login_client
from mcpd.client.api import Client, ssl_context, text_of
from mcpd.common import identity
from tests.support.jwtkeys import ISSUER, TestIssuer
from tests.support.oidcmock import fetch_jwks, id_token, running_provider, set_user
from tests.support.osaccounts import Account, AccountFactory, ensure_user, pam_service
from tests.support.privsep_calls import wait_for
from tests.support.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep
from tests.support.streamable import INIT

pytestmark = pytest.mark.root

CLIENT_ID = "mcpd-test-client"
V = "2025-06-18"


class OAuthSetup:
    d: PrivsepDaemon
    idp: TestIssuer
    provider: str
    carol: Account
    carol_password: str
    resource: str


@pytest.fixture(scope="module")
def setup() -> Iterator[OAuthSetup]:
    if os.geteuid() != 0:
        pytest.skip("needs root: root helper, OS accounts, PAM")
    factory = AccountFactory()
    jwks_dir = Path(f"/tmp/mcpd-jwks-{secrets.token_hex(4)}")
    jwks_dir.mkdir(mode=0o755)
    os.chmod(jwks_dir, 0o755)
    s = OAuthSetup()
    d: PrivsepDaemon | None = None
    with running_provider() as provider, pam_service() as service:
        try:
            s.carol_password = secrets.token_urlsafe(12)
            s.carol = factory.user(password=s.carol_password)
            ensure_user(s.carol.name, password=s.carol_password)
            s.idp = TestIssuer(jwks_dir / "corp.json")
            fetch_jwks(provider, jwks_dir / "mock.json")
            s.provider = provider
            s.resource = "https://files.test.example:9091/mcp"  # the canonical name clients know it by
            s.idp.audience = s.resource
            oauth = {"resource": s.resource, "leeway_seconds": 5, "issuers": [
                {"name": "corp", "issuer": ISSUER, "jwks_file": str(jwks_dir / "corp.json"),
                 "audiences": [s.resource], "accounts": [s.carol.name, "root"], "groups_claim": "groups"},
                {"name": "mock", "issuer": provider, "jwks_file": str(jwks_dir / "mock.json"),
                 "audiences": [CLIENT_ID], "account_claim": "account", "accounts": ["mcpdt*"]}]}
            d = start_privsep(factory, oauth=oauth,
                              login={"pam_service": service, "answer_seconds": 0.2})
            grants = d.default_grants()
            grants["users"][s.carol.name] = grants["users"][d.accounts["alice"].name]
            d.write_grants(grants)
            users = identity.load_users(d.state_dir / "users.yaml")  # carol may also log in with her password
            users["carol"] = identity.UserRecord(name="carol", os_user=s.carol.name, tokens=[])
            identity.save_users(d.state_dir / "users.yaml", users)
            s.d = d

            def answering() -> bool:  # the TLS port opens before the policy process answers (503 until then)
                with _http(d) as c:
                    return c.post("/mcp", json=INIT, headers=_h(d.tokens["alice"])).status_code == 200

            wait_for(answering, 60)
            yield s
        finally:
            if d is not None:
                stop_privsep(d)
            factory.cleanup()
            shutil.rmtree(jwks_dir, ignore_errors=True)


def _http(d: PrivsepDaemon) -> httpx.Client:
    return httpx.Client(verify=ssl_context(d.cacert), timeout=30, base_url=d.url)


def _h(token: str | None, sid: str | None = None) -> dict[str, str]:
    h = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    if sid is not None:
        h.update({"Mcp-Session-Id": sid, "MCP-Protocol-Version": V})
    return h


def _session(c: httpx.Client, token: str) -> str:
    r = c.post("/mcp", json=INIT, headers=_h(token))
    assert r.status_code == 200, (r.status_code, r.headers, r.text)
    sid = r.headers["mcp-session-id"]
    assert c.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                  headers=_h(token, sid)).status_code == 202
    return sid


def _read(d: PrivsepDaemon, token: str, path: str, privileged: bool = False) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with Client(d.url, token, d.cacert, timeout=30) as c:
            return await c.call_tool("files/read", {"path": path, "privileged": privileged}, check=False)

    return asyncio.run(go())


def test_metadata_is_served_at_both_paths_and_nothing_else_under_well_known(setup: OAuthSetup) -> None:
    with _http(setup.d) as c:
        for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
            r = c.get(path)
            assert r.status_code == 200, path
            assert r.json() == {"resource": setup.resource, "authorization_servers": [ISSUER, setup.provider],
                                "scopes_supported": ["files:read", "files:privileged"],
                                "bearer_methods_supported": ["header"]}
            prm = asyncio.run(handle_protected_resource_response(r))  # the MCP SDK's own parser
            assert prm is not None and str(prm.resource) == setup.resource
        assert c.get("/.well-known/openid-configuration").status_code == 404
        assert c.get("/.well-known/oauth-protected-resource/other").status_code == 404


def test_every_401_names_the_metadata_and_the_scope(setup: OAuthSetup) -> None:
    meta = setup.resource.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    with _http(setup.d) as c:
        for token in (None, "mcpd_000000000000_" + "a" * 43, setup.idp.token(setup.carol.name, aud="https://x/mcp")):
            r = c.post("/mcp", json=INIT, headers=_h(token))
            assert r.status_code == 401
            challenge = r.headers["www-authenticate"]
            assert challenge.startswith("Bearer ")
            assert f'resource_metadata="{meta}"' in challenge and 'scope="files:read"' in challenge
            assert ('error="invalid_token"' in challenge) == (token is not None)
            assert extract_resource_metadata_from_www_auth(r) == meta  # as the MCP SDK reads it


def test_an_oauth_token_runs_as_its_account_with_the_person_in_the_records(setup: OAuthSetup) -> None:
    d, carol = setup.d, setup.carol
    Path(carol.home, "notes.txt").write_text("carol's notes\n")
    os.chown(Path(carol.home, "notes.txt"), carol.uid, carol.gid)
    token = setup.idp.token(carol.name, jti="jti-read-1", act={"sub": "agent-9"})
    res = _read(d, token, f"{carol.home}/notes.txt")
    assert not res.get("isError") and text_of(res) == "carol's notes\n", res
    alice = d.accounts["alice"]
    private = Path(alice.home, "private.txt")
    private.write_text("alice's\n")
    os.chown(private, alice.uid, alice.gid)
    os.chmod(private, 0o600)
    alice_only = _read(d, token, str(private))  # the kernel decides, as carol
    assert alice_only.get("isError")
    lines = [json.loads(x) for x in d.access_path.read_text().splitlines()]
    mine = [r for r in lines if r.get("jti") == "jti-read-1" and r.get("event") == "access"]
    assert mine and mine[0]["user"] == f"corp:u-{carol.name}" and mine[0]["os_user"] == carol.name
    assert (mine[0]["iss"], mine[0]["sub"], mine[0]["client"], mine[0]["act"]) == (
        ISSUER, f"u-{carol.name}", "agent-client", "agent-9")


def test_an_oauth_tokens_worker_lives_while_its_token_does(setup: OAuthSetup) -> None:
    """The policy process's sweep of revoked tokens' workers (twice a second) keeps an OAuth
    token's worker until the token's exp: calls a few seconds apart reuse it, nothing is killed."""
    d, carol = setup.d, setup.carol
    token = setup.idp.token(carol.name, sub="u-sweep")

    async def go() -> list[dict[str, Any]]:
        async with Client(d.url, token, d.cacert, timeout=30) as c:
            out = []
            for _ in range(3):
                out.append(await c.call_tool("files/read", {"path": "/etc/hostname"}, check=False))
                await asyncio.sleep(1.5)
            return out

    assert not any(r.get("isError") for r in asyncio.run(go()))
    assert not [r for r in d.audit() if r.get("event") == "kill" and r.get("user") == "corp:u-sweep"]


def test_a_privileged_call_without_its_scope_is_403_with_the_scopes_it_needs(setup: OAuthSetup) -> None:
    d = setup.d
    token = setup.idp.token(setup.carol.name)  # files:read only
    with _http(d) as c:
        sid = _session(c, token)
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "files/read", "arguments": {"path": str(d.app / "log.txt"), "privileged": True}}}
        r = c.post("/mcp", json=call, headers=_h(token, sid))
        assert r.status_code == 403
        challenge = r.headers["www-authenticate"]
        assert 'error="insufficient_scope"' in challenge
        assert 'scope="files:read files:privileged"' in challenge and "resource_metadata=" in challenge
        # and the MCP SDK's OAuth client reads it as a step-up (its own parsers, on this answer)
        assert extract_field_from_www_auth(r, "error") == "insufficient_scope"
        assert extract_scope_from_www_auth(r) == "files:read files:privileged"
        no_read = setup.idp.token(setup.carol.name, scope="openid")
        r = c.post("/mcp", json=INIT, headers=_h(no_read))
        assert r.status_code == 403 and 'scope="files:read"' in r.headers["www-authenticate"]
    # stepped up: the same call with files:privileged is decided by the grants, and granted
    up = setup.idp.token(setup.carol.name, scope="files:read files:privileged", jti="jti-priv-1")
    res = _read(d, up, str(d.app / "log.txt"), privileged=True)
    assert not res.get("isError"), res
    rec = [r for r in d.audit() if r.get("jti") == "jti-priv-1" and r.get("route") == "privileged"]
    assert rec and rec[-1]["decision"] == "accept" and rec[-1]["iss"] == ISSUER
    denied = _read(d, up, str(d.srv / "secret"), privileged=True)  # the grant still decides
    assert denied.get("isError")


@pytest.mark.parametrize("forge", ["alg none", "hs256 with the public key", "wrong iss", "no aud", "expired",
                                   "nbf future", "unknown kid", "colon in principal", "control in principal",
                                   "account root", "16 KiB"])
def test_forged_tokens_are_401_through_the_daemon(setup: OAuthSetup, forge: str) -> None:
    idp, name = setup.idp, setup.carol.name
    token = {"alg none": lambda: idp.unsigned(name),
             "hs256 with the public key": lambda: idp.hs256_with_public_key(name),
             "wrong iss": lambda: idp.token(name, iss="https://evil.example"),
             "no aud": lambda: idp.token(name, aud=None),
             "expired": lambda: idp.token(name, exp=int(time.time()) - 60),
             "nbf future": lambda: idp.token(name, nbf=int(time.time()) + 600),
             "unknown kid": lambda: idp.token(name, headers={"kid": "rotated-away"}),
             "colon in principal": lambda: idp.token(name, sub="alice:x"),
             "control in principal": lambda: idp.token(name, sub="alice\u0007"),
             "account root": lambda: idp.token("root"),
             "16 KiB": lambda: idp.token(name, pad="x" * 16384)}[forge]()  # (64 KiB: 431, past the header cap)
    with _http(setup.d) as c:
        r = c.post("/mcp", json=INIT, headers=_h(token))
        assert r.status_code == 401, (forge, r.status_code, r.text)
        assert c.get("/mcp", params={"access_token": idp.token(name)}, headers=_h(None)).status_code == 401


def test_a_token_from_the_real_provider_is_accepted(setup: OAuthSetup) -> None:
    """oidc-provider-mock signs a JWT after an authorization-code flow (its aud: the client id, as
    Entra's is); the daemon verifies it against the key set fetched from the provider."""
    sub = f"p-{secrets.token_hex(3)}"
    set_user(setup.provider, sub, {"account": setup.carol.name, "scope": "files:read"})
    token = id_token(setup.provider, CLIENT_ID, sub)
    Path(setup.carol.home, "mock.txt").write_text("from the mock\n")
    os.chown(Path(setup.carol.home, "mock.txt"), setup.carol.uid, setup.carol.gid)
    res = _read(setup.d, token, f"{setup.carol.home}/mock.txt")
    assert not res.get("isError") and text_of(res) == "from the mock\n", res
    other = id_token(setup.provider, "another-client", sub)  # a token for another audience
    with _http(setup.d) as c:
        assert c.post("/mcp", json=INIT, headers=_h(other)).status_code == 401


def test_static_tokens_and_password_logins_still_work(setup: OAuthSetup) -> None:
    d = setup.d
    res = _read(d, d.tokens["alice"], str(d.app / "log.txt"), privileged=True)
    assert not res.get("isError"), res
    login_token = str(login_client.login(d.url, setup.carol.name, setup.carol_password, d.cacert)["token"])
    res = _read(d, login_token, str(d.app / "log.txt"), privileged=True)
    assert not res.get("isError"), res


def test_a_privileged_message_on_sse_without_its_scope_is_403(setup: OAuthSetup) -> None:
    """The HTTP+SSE transport answers the same 403 on POST /message; nothing of it reaches the stream."""
    d = setup.d
    token = setup.idp.token(setup.carol.name)

    async def go() -> None:
        async with httpx.AsyncClient(verify=ssl_context(d.cacert), timeout=20) as c:
            auth = {"Authorization": f"Bearer {token}"}
            async with c.stream("GET", d.url + "/sse", headers=auth) as s:
                endpoint, lines = "", s.aiter_lines()  # (held: the stream stays open)
                async for line in lines:
                    if line.startswith("data:"):
                        endpoint = line.split(":", 1)[1].strip()
                        break
                call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                        "params": {"name": "files/read", "arguments": {"path": "/etc/hostname", "privileged": True}}}
                r = await c.post(d.url + endpoint, json=call, headers=auth)
                assert r.status_code == 403, (endpoint, r.text)
                assert 'error="insufficient_scope"' in r.headers["www-authenticate"]

    asyncio.run(go())


def test_a_tokens_groups_count_for_grants_as_issuer_groups(setup: OAuthSetup) -> None:
    """A grant to ``groups: {corp:auditors}`` lets a token carrying group ``auditors`` of issuer
    corp read, and no one else: not the same account with a token without it."""
    d, idp, name = setup.d, setup.idp, setup.carol.name
    grants = d.default_grants()
    grants["users"][name] = grants["users"][d.accounts["alice"].name]
    grants["groups"] = {"corp:auditors": {"privileged": {"tools": {
        "files/read": {"allowed": True, "paths": [str(d.srv / "secret")]}}}}}
    d.write_grants(grants)
    member = idp.token(name, scope="files:read files:privileged", groups=["auditors"])
    other = idp.token(name, scope="files:read files:privileged", groups=["staff"])
    deadline = time.monotonic() + 15
    while _read(d, member, str(d.srv / "secret"), privileged=True).get("isError"):
        assert time.monotonic() < deadline, "the group grant never applied"
        time.sleep(0.3)
    assert _read(d, other, str(d.srv / "secret"), privileged=True).get("isError")


def test_a_key_removed_from_the_set_is_refused_and_an_expiring_token_ends_its_session(setup: OAuthSetup) -> None:
    """Rotation both ways: a new key is taken on its first token; once the file no longer holds it,
    its tokens are refused within the reload time. A session whose token expires is closed by the
    once-a-second re-check (after the leeway): the next request is refused."""
    d, idp, name = setup.d, setup.idp, setup.carol.name
    idp.add_rsa("rsa3")
    token = idp.token(name, kid="rsa3")
    with _http(d) as c:
        assert c.post("/mcp", json=INIT, headers=_h(token)).status_code == 200
        idp.write(kids=["rsa1", "ec1"])  # rsa3 removed
        deadline = time.monotonic() + 10
        while c.post("/mcp", json=INIT, headers=_h(token)).status_code != 401:
            assert time.monotonic() < deadline, "a removed key still verifies"
            time.sleep(0.3)
        short = idp.token(name, exp=int(time.time()) + 1)  # + leeway_seconds 5
        sid = _session(c, short)
        deadline = time.monotonic() + 20
        ping = {"jsonrpc": "2.0", "id": 9, "method": "ping"}
        while c.post("/mcp", json=ping, headers=_h(short, sid)).status_code == 200:
            assert time.monotonic() < deadline, "an expired token's session lives on"
            time.sleep(0.5)
        assert c.post("/mcp", json=ping, headers=_h(short, sid)).status_code in (401, 404)


def test_a_forged_jwt_flood_takes_no_capacity_from_valid_tokens(setup: OAuthSetup) -> None:
    """docs/REFERENCE.md §5.1, §5.4: forged access tokens of the right shape and kid, signed by
    an attacker's key (each one a full signature check in the policy process, never cached), sent
    from 100 connections for up to 8 s, while an OAuth session and a static token's streams go on:
    every valid request is served, no session is closed, no forged token leaves a record."""
    import ssl

    from tests.support.floods import ForgedTokenFlood
    from tests.support.jwtkeys import TestIssuer as Attacker

    d, carol = setup.d, setup.carol
    attacker = Attacker(d.state_dir / "attacker-jwks.json", audience=setup.resource)
    forged = [attacker.token(carol.name, jti=f"f-{i}") for i in range(300)]
    host, port = "127.0.0.1", int(d.url.rsplit(":", 1)[1])
    ctx = ssl.create_default_context(cafile=d.cacert)
    records_before = len(d.audit())

    async def go() -> list[int]:
        statuses: list[int] = []
        token = setup.idp.token(carol.name)
        async with httpx.AsyncClient(verify=ctx, timeout=20, base_url=d.url) as c:
            r = await c.post("/mcp", json=INIT, headers=_h(token))
            sid = r.headers["mcp-session-id"]
            async with ForgedTokenFlood(host, port, ctx, connections=100, seconds=8,
                                        token=lambda i: forged[i % len(forged)]) as flood:
                while time.monotonic() < flood.until:
                    ping = {"jsonrpc": "2.0", "id": len(statuses), "method": "ping"}
                    statuses.append((await c.post("/mcp", json=ping, headers=_h(token, sid))).status_code)
                    async with c.stream("GET", "/sse", headers={"Authorization": f"Bearer {d.tokens['alice']}"}) as s:
                        statuses.append(s.status_code + 1)
                    if set(statuses) != {200, 201}:
                        break
                    await asyncio.sleep(0.1)
        return statuses

    statuses = asyncio.run(go())
    assert statuses and set(statuses) <= {200, 201}, statuses
    # (an earlier test's short-lived token may still be re-checked, and refused as expired, meanwhile:
    # the forged tokens here are not expired, so any other refusal with a record is one of theirs)
    assert not [r for r in d.audit()[records_before:] if str(r.get("reason", "")).startswith("oauth")
                and r.get("reason") != "oauth: expired"]


def test_a_genuine_tokens_refusal_is_recorded_with_who(setup: OAuthSetup) -> None:
    """A signed token refused for its claims: its record names the token (token_id), its issuer,
    subject, client and jti (escaped); a bad time claim is a 401, never a 503."""
    d, idp = setup.d, setup.idp
    n0 = len(d.audit())
    root = idp.token("root", jti="J\x1b[2J\nINJECT", sub="u-root")
    huge = idp.token(setup.carol.name, exp=10**400, jti="jti-huge-exp")
    with _http(d) as c:
        for token in (root, huge):
            assert c.post("/mcp", json=INIT, headers=_h(token)).status_code == 401
    recs = [r for r in d.audit()[n0:] if str(r.get("reason", "")).startswith("oauth")]
    by_sub = {r.get("sub"): r for r in recs}
    rec = by_sub["u-root"]
    assert rec["iss"] == ISSUER and rec["client"] == "agent-client" and "INJECT" in rec["jti"]
    assert "\x1b" not in rec["jti"] and rec["token_id"] == hashlib.sha256(root.encode()).hexdigest()[:12]
    assert any(r.get("jti") == "jti-huge-exp" for r in recs)
