"""A login acts as an identity, and loses it completely (docs/REFERENCE.md §5.3): real PAM, real
accounts, the root helper and the front as in production.

- A login principal is the static principal its OS account is bound to, never a principal that
  merely carries the account's name: no POST into another principal's session.
- ``mcpd users remove`` / ``rotate`` and ``usermod -L`` / ``chage -E`` end the login: the next
  call is refused, the stream closes and the principal's workers are gone within seconds.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mcpd.client import login as login_client
from mcpd.client.api import ssl_context
from mcpd.common import identity
from tests.support.osaccounts import AccountFactory, ensure_user, expire_user, lock_user, pam_service
from tests.support.pam_login import status_of_sse
from tests.support.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep

pytestmark = pytest.mark.root

GONE_WITHIN = 2.0  # seconds (docs/REFERENCE.md §5.3 "within seconds": 2 s): the re-check runs every second


# only the principal "quota-p" (test_quotas_hold_across_a_login) has a quota
QUOTA_LIMITS = {"tiers": {"small": {"requests_per_day": 3, "max_file_bytes": 0}}, "users": {"quota-p": "small"}}


@pytest.fixture()
def loginable() -> Iterator[tuple[PrivsepDaemon, AccountFactory]]:
    if os.geteuid() != 0:
        pytest.skip("needs root: PAM service, OS accounts, root helper")
    factory = AccountFactory()
    d: PrivsepDaemon | None = None
    with pam_service() as service:
        try:
            d = start_privsep(factory, login={"pam_service": service, "answer_seconds": 0.2}, limits=QUOTA_LIMITS)
            yield d, factory
        finally:
            if d is not None:
                stop_privsep(d)
            factory.cleanup()


def bind(d: PrivsepDaemon, principal: str, os_user: str) -> str:
    """Add principal ``principal`` bound to ``os_user`` in users.yaml; return its static token."""
    users = identity.load_users(d.state_dir / "users.yaml")
    token, rec = identity.new_token()
    users[principal] = identity.UserRecord(name=principal, os_user=os_user, tokens=[rec])
    identity.save_users(d.state_dir / "users.yaml", users)
    return token


def account_with_password(factory: AccountFactory) -> tuple[str, str]:
    import secrets

    password = secrets.token_urlsafe(12)
    acct = factory.user(password=password)
    ensure_user(acct.name, password=password)
    return acct.name, password


def login(d: PrivsepDaemon, user: str, password: str) -> str:
    return str(login_client.login(d.url, user, password, d.cacert)["token"])


def read_as(d: PrivsepDaemon, token: str, path: str = "/etc/hostname") -> tuple[int, Any]:
    """One MCP session: (HTTP status of the stream, the files/read result or None)."""
    from mcpd.client.api import Client, MCPClientError

    async def go() -> tuple[int, Any]:
        try:
            async with Client(d.url, token, d.cacert, timeout=20) as c:
                return 200, await c.call_tool("files/read", {"path": path}, check=False)
        except MCPClientError as exc:
            return 401 if "auth" in type(exc).__name__.lower() or "401" in str(exc) else 0, None

    return asyncio.run(go())


def test_a_login_never_acts_as_the_principal_named_like_its_account(
        loginable: tuple[PrivsepDaemon, AccountFactory]) -> None:
    d, factory = loginable
    victim_os = d.accounts["alice"].name
    attacker_os, password = account_with_password(factory)
    victim_token = bind(d, attacker_os, victim_os)  # a static principal NAMED like the attacker's account
    bind(d, "ops-" + attacker_os[-6:], attacker_os)  # the principal the attacker's account is bound to
    attacker = login(d, attacker_os, password)

    async def go() -> None:
        async with httpx.AsyncClient(verify=ssl_context(d.cacert), timeout=20) as c:
            async with c.stream("GET", d.url + "/sse", headers={"Authorization": f"Bearer {victim_token}"}) as s:
                lines = s.aiter_lines()
                endpoint = ""
                async for line in lines:
                    if line.startswith("data:"):
                        endpoint = line.split(":", 1)[1].strip()
                        break
                assert "session_id=" in endpoint
                body = {"jsonrpc": "2.0", "id": "injected", "method": "ping"}
                r = await c.post(d.url + endpoint, json=body, headers={"Authorization": f"Bearer {attacker}"})
                assert r.status_code == 404, r.text
                seen: list[str] = []

                async def collect() -> None:
                    async for line in lines:
                        seen.append(line)

                try:
                    await asyncio.wait_for(collect(), 1.5)
                except TimeoutError:
                    pass
                assert not [line for line in seen if "injected" in line], seen

    asyncio.run(go())
    # and the login acts as the principal its account is bound to, with that account's rights
    status, res = read_as(d, attacker)
    assert status == 200 and not res.get("isError"), res


def helper_workers(d: PrivsepDaemon, os_user: str) -> list[int]:
    import pwd

    from tests.support.privsep_fixture import children

    uid = pwd.getpwnam(os_user).pw_uid
    return [w for fs in children(d.helper_pid, 0) for w in children(fs, uid)]


@pytest.mark.parametrize("how", ["users remove", "users rotate", "usermod -L", "chage -E 0"])
def test_revoking_the_principal_or_locking_the_account_ends_the_login(
        loginable: tuple[PrivsepDaemon, AccountFactory], how: str) -> None:
    d, factory = loginable
    os_user, password = account_with_password(factory)
    principal = "p-" + os_user[-8:]
    bind(d, principal, os_user)
    token = login(d, os_user, password)
    closed_at: list[float] = []

    async def go() -> None:
        from mcpd.client.api import Client, MCPClientError

        async with Client(d.url, token, d.cacert, timeout=20) as c:
            first = await c.call_tool("files/read", {"path": "/etc/hostname"}, check=False)
            assert not first.get("isError"), first
            assert helper_workers(d, os_user), "the login's worker runs as its account"
            if how.startswith("users"):
                verb = how.split()[1]
                res = subprocess.run([sys.executable, "-m", "mcpd.admin.cli", "users", verb, principal,
                                      "--config", str(d.config_path)], capture_output=True, text=True, timeout=60)
                assert res.returncode == 0, res.stderr
            elif how == "usermod -L":
                lock_user(os_user)
            else:
                expire_user(os_user)
            start = time.monotonic()
            try:
                while time.monotonic() - start < GONE_WITHIN:
                    await c.call_tool("files/read", {"path": "/etc/hostname"}, check=False)
                    await asyncio.sleep(0.2)
            except MCPClientError:
                closed_at.append(time.monotonic() - start)

    asyncio.run(go())
    assert closed_at, f"after {how} the session stayed open for {GONE_WITHIN} s"
    deadline = time.monotonic() + GONE_WITHIN
    while time.monotonic() < deadline and helper_workers(d, os_user):
        time.sleep(0.1)
    assert not helper_workers(d, os_user), f"after {how} the account's workers still run"
    assert status_of_sse(d, token) == 401


def test_quotas_hold_across_a_login(loginable: tuple[PrivsepDaemon, AccountFactory]) -> None:
    """A login acts as its account's principal, so it spends that principal's daily quota: two
    calls with the static token and one with a login token use up a quota of three."""
    d, factory = loginable
    os_user, password = account_with_password(factory)
    static = bind(d, "quota-p", os_user)
    codes = []
    for token in (static, static, None, None):
        status, res = read_as(d, token or login(d, os_user, password))
        assert status == 200, res
        codes.append(res["structuredContent"]["error"]["code"] if res.get("isError") else "ok")
    assert codes == ["ok", "ok", "ok", "RATE_LIMITED"], codes
