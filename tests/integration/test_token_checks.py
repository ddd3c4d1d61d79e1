"""The front's token checks (docs/REFERENCE.md §1.3, §5): a client holding no valid token must get
a 401 for a bad token and nothing else: it may not take the root helper's capacity for token
checks from the holders of valid ones (their sessions must live, their tokens must be accepted),
nor make the policy process raise an alert as for a compromised front."""

from __future__ import annotations

import asyncio
import ssl
import time

import httpx
import pytest

from tests.conftest import EVENT_TIMEOUT, SseSession
from tests.support.floods import ForgedTokenFlood, random_token
from tests.support.privsep_fixture import PrivsepDaemon, privsep_daemon  # noqa: F401  (fixture)
from tests.support.streamable import as_daemon


@pytest.mark.root
def test_a_forged_token_flood_never_closes_a_valid_session_nor_refuses_a_valid_token(
        privsep_daemon: PrivsepDaemon) -> None:
    """docs/REFERENCE.md §1.3 (401 only for no or a bad token), §1.5, §5.3 (what is in flight at the helper
    never takes capacity from token checks): a client holding no token floods POSTs with forged
    tokens from 200 connections for up to 10 s (stopped early once the flaw shows). Bob's
    session must live through it, every POST with his valid token must be accepted, and every
    stream alice opens with hers (a fresh token check each) must open."""
    pd = privsep_daemon
    bob_d = as_daemon(pd, "bob", "alice")
    host, port = bob_d.host_port
    ctx = ssl.create_default_context(cafile=pd.cacert)
    closed_before = pd.log("front.log").count("its token is no longer valid")

    async def go() -> list[int]:
        statuses: list[int] = []
        async with SseSession(bob_d) as bob:
            assert (await bob.request("ping", req_id="before"))["result"] == {}
            async with ForgedTokenFlood(host, port, ctx, connections=200, seconds=10, token=random_token) as flood, \
                    httpx.AsyncClient(verify=ctx, timeout=EVENT_TIMEOUT) as c:
                while time.monotonic() < flood.until:
                    statuses.append((await bob.post({"jsonrpc": "2.0", "id": len(statuses), "method": "ping"})).status_code)
                    async with c.stream("GET", f"{pd.url}/sse", headers={"Authorization": f"Bearer {pd.tokens['alice']}"}) as r:
                        statuses.append(r.status_code + 1)  # (alice's streams: 201 when opened)
                    if set(statuses) != {202, 201}:
                        break
                    await asyncio.sleep(0.1)
            statuses.append((await bob.post({"jsonrpc": "2.0", "id": "after", "method": "ping"})).status_code)
        return statuses

    statuses = asyncio.run(go())
    assert pd.log("front.log").count("its token is no longer valid") == closed_before
    assert set(statuses) <= {202, 201}, statuses  # never 401 (402 for a stream) nor 503 for a valid token


@pytest.mark.root
def test_an_overlong_bearer_token_is_a_plain_401_and_no_alert(privsep_daemon: PrivsepDaemon) -> None:
    """docs/REFERENCE.md §1.3: a bad token is 401, and nothing else happens. A client with no valid token
    sends a 300-character bearer token: 401, and the policy process sees no malformed request
    (no audit alert; its connections to the front, shared with other clients' requests, stay
    up: before the front checked the token's form, the policy shut the connection down and a
    concurrent valid call on it failed HELPER_UNAVAILABLE)."""
    pd = privsep_daemon
    alerts = len([r for r in pd.audit() if r.get("event") == "alert"])
    with httpx.Client(verify=ssl.create_default_context(cafile=pd.cacert), timeout=EVENT_TIMEOUT) as c:
        for n in (257, 300, 4000):
            r = c.post(f"{pd.url}/message?session_id={'0' * 32}", content=b"{}",
                       headers={"Authorization": "Bearer mcpd_" + "A" * n, "Content-Type": "application/json"})
            assert r.status_code == 401
    time.sleep(1)
    assert [r for r in pd.audit() if r.get("event") == "alert"][alerts:] == []
