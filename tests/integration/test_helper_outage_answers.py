"""Say what is wrong: while the root helper and its policy process are down, a
token the front cannot check is answered ``503`` with ``Retry-After``, never ``401`` (the client
must not be told its token is bad), the front's log gives that reason, not "invalid token"; a
session whose token was already checked gets ``HELPER_UNAVAILABLE`` for what needs the helper; and
``/healthz`` answers ``503`` naming what is missing while ``mcpd_helper_up`` is 0, ``200 ok``
again once the helper is back. Root only: the real helper, killed for real (root itself, or its
policy process, after which root ends too)."""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from mcpd.client.api import Client
from mcpd.common.config import POLICY_USER
from tests.support.metrics import samples
from tests.support.net import free_port
from tests.support.osaccounts import AccountFactory
from tests.support.privsep_fixture import PrivsepDaemon, children, start_privsep, stop_privsep

pytestmark = pytest.mark.root
DEADLINE = 30.0
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


def wait_for(what: Callable[[], Any], seconds: float = DEADLINE) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def answers(d: PrivsepDaemon, token: str) -> list[tuple[str, int, str | None, str]]:
    """``(route, status, Retry-After, body)`` of opening ``/sse`` and of ``initialize`` on ``/mcp``."""
    out = []
    with httpx.Client(verify=ssl.create_default_context(cafile=d.cacert), timeout=10) as c:
        auth = {"Authorization": f"Bearer {token}"}
        with c.stream("GET", d.url + "/sse", headers=auth) as resp:
            body = resp.read().decode() if resp.status_code != 200 else ""
            out.append(("sse", resp.status_code, resp.headers.get("retry-after"), body))
        resp = c.post(d.url + "/mcp", json=INIT, headers={**auth, "Accept": "application/json, text/event-stream"})
        out.append(("mcp", resp.status_code, resp.headers.get("retry-after"), resp.text))
    return out


def health(port: int) -> tuple[int, str | None, str, float]:
    """``(status, Retry-After, body)`` of ``/healthz`` and ``mcpd_helper_up``."""
    with httpx.Client(timeout=10) as c:
        resp = c.get(f"http://127.0.0.1:{port}/healthz")
        up = samples(c.get(f"http://127.0.0.1:{port}/metrics").text)[("mcpd_helper_up", ())]
    return resp.status_code, resp.headers.get("retry-after"), resp.text, up


def kill_policy(d: PrivsepDaemon) -> None:
    """SIGKILL the policy process; root sees it end and exits (reaped here, bounded)."""
    found = children(d.helper_pid, pwd.getpwnam(POLICY_USER).pw_uid)
    assert len(found) == 1, found
    os.kill(found[0], signal.SIGKILL)
    assert d.helper is not None
    d.helper.wait(timeout=DEADLINE)


@pytest.fixture
def metrics_daemon() -> Iterator[tuple[PrivsepDaemon, int]]:
    if os.geteuid() != 0:
        pytest.skip("needs root: starts the root helper and creates OS accounts")
    port = free_port()
    factory = AccountFactory()
    d = start_privsep(factory, metrics_listen=f"127.0.0.1:{port}")
    try:
        assert wait_for(lambda: health(port)[0] == 200)
        yield d, port
    finally:
        stop_privsep(d)
        factory.cleanup()


def kill(d: PrivsepDaemon, victim: str) -> None:
    d.kill_helper(signal.SIGKILL) if victim == "root" else kill_policy(d)


@pytest.mark.parametrize("victim", ["root", "policy"])
def test_while_the_helper_is_down_a_token_it_cannot_check_gets_503_never_401(
        metrics_daemon: tuple[PrivsepDaemon, int], victim: str) -> None:
    d, _ = metrics_daemon

    async def go() -> None:
        async with Client(d.url, d.tokens["alice"], d.cacert, timeout=DEADLINE) as c:
            assert not (await c.call_tool("files/read", {"path": "/etc/hostname"}, check=False)).get("isError")
            kill(d, victim)
            # bob's token was never checked by this front: it cannot be now. A forged token of the
            # right shape cannot be refused either without the helper; a malformed one can.
            forged = "mcpd_0123456789ab_" + "x" * 43
            for token in (d.tokens["bob"], forged):
                for route, status, retry, body in answers(d, token):
                    assert (status, retry) == (503, "2"), (route, status, retry, body)
                    assert "policy process is not reachable" in body and "invalid" not in body, body
            assert [a[1] for a in answers(d, "not-an-mcpd-token")] == [401, 401]
            # alice's session was checked before: what needs the helper says so as a tool error
            res = await c.call_tool("files/read", {"path": "/etc/hostname"}, check=False)
            assert res["structuredContent"]["error"]["code"] == "HELPER_UNAVAILABLE", res

    asyncio.run(go())
    lines = d.log("front.log").splitlines()
    refusals = [line for line in lines if "refused 503" in line]
    assert len(refusals) == 4 and all("policy process is not reachable" in line for line in refusals), refusals
    assert not [line for line in lines if "refused 401" in line and "token id" in line], lines[-20:]
    d.start_helper()
    assert wait_for(lambda: [a[1] for a in answers(d, d.tokens["bob"])] == [200, 200])


@pytest.mark.parametrize("victim", ["root", "policy"])
def test_healthz_is_not_ready_while_the_helper_is_down(metrics_daemon: tuple[PrivsepDaemon, int], victim: str) -> None:
    d, port = metrics_daemon
    assert health(port)[1:] == (None, "ok\n", 1)
    kill(d, victim)
    got = wait_for(lambda: (h := health(port))[0] == 503 and h)
    assert got, f"/healthz still answers {health(port)} with the helper down"
    status, retry, body, up = got
    assert (status, retry, up) == (503, "2", 0), (status, retry, body, up)
    assert body.startswith("not ready: helper: the policy process does not answer"), body
    d.start_helper()
    assert wait_for(lambda: health(port)[0] == 200), health(port)
    assert health(port)[1:] == (None, "ok\n", 1)


def test_while_the_helper_is_down_login_says_retry_after_and_clients_show_the_servers_reason(
        metrics_daemon: tuple[PrivsepDaemon, int]) -> None:
    """With the root helper killed, ``POST /login`` cannot check a password now: ``503`` with
    ``Retry-After: 2`` (it is restarted), as a token the front cannot check gets. The clients say
    why: ``linuxctl`` (both transports) prints ``HTTP_503`` with the server's message and the wait
    it asked for, and ``linuxctl login``'s error carries them too."""
    from mcpd.client.api import ConnectError
    from mcpd.client.login import login
    from tests.support.linuxctl import linuxctl

    d, _ = metrics_daemon
    d.kill_helper(signal.SIGKILL)
    with httpx.Client(verify=ssl.create_default_context(cafile=d.cacert), timeout=10) as c:
        resp = c.post(d.url + "/login", json={"user": "alice", "password": "wrong"})
    assert (resp.status_code, resp.headers.get("retry-after")) == (503, "2"), (resp.status_code, resp.headers)
    assert "policy process" in resp.json()["error"], resp.text
    with pytest.raises(ConnectError) as refused:
        login(d.url, "alice", "wrong", d.cacert, timeout=10)
    assert "policy process" in refused.value.message and "retry after 2 s" in refused.value.message, refused.value
    for transport, method in (("http", b"POST"), ("sse", b"GET")):
        res = linuxctl("--url", d.url, "--token", d.tokens["bob"], "--cacert", str(d.cacert),
                       "--transport", transport, "get", "files", "/etc/hostname")
        err = res.stderr
        assert res.returncode == 1 and err.startswith(b"HTTP_503: " + method), err
        assert b"(retry after 2 s): the policy process is not reachable, so the token cannot be checked now" in err, err
