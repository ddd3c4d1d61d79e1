"""Password logins end to end with real PAM and real OS accounts (docs/REFERENCE.md §5.2).

The root helper and the front run as in production (``privsep_fixture``); the shipped PAM
service ``etc/pam.d/mcpd`` is installed under a unique name and named in ``login.pam_service``.
Accounts get real passwords (``chpasswd``), are locked with ``usermod -L`` and expired with
``chage -E 0``.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import secrets
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpd.client import login as login_client
from mcpd.client.api import AuthError, Client, ToolFailed, ssl_context
from mcpd.common import identity
from mcpd.common.config import POLICY_USER
from tests.conftest import slow_read
from tests.support.osaccounts import AccountFactory, ensure_user, expire_user, lock_user, pam_service
from tests.support.pam_login import enroll, status_of_sse
from tests.support.principals import parallel_reads, share_account
from tests.support.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep
from tests.support.shared_folder import shared_folder  # noqa: F401  (fixture)

pytestmark = pytest.mark.root

PAM_FILE = Path(__file__).resolve().parents[2] / "etc/pam.d/mcpd"
LOCK_SECONDS = 4.0
MAX_FAILURES = 3
REAUTH_SECONDS = 3


@pytest.fixture(scope="module")
def pamd() -> Iterator[tuple[PrivsepDaemon, AccountFactory, dict[str, str]]]:
    """The privsep daemon with a test PAM service, short lockout, and passwords for alice and bob."""
    if os.geteuid() != 0:
        pytest.skip("needs root: PAM service, OS accounts, root helper")
    factory = AccountFactory()
    d: PrivsepDaemon | None = None
    with pam_service(PAM_FILE) as service:
        try:
            d = start_privsep(factory, login={
                "pam_service": service, "free_failures": 1, "base_delay_seconds": 0.1, "max_delay_seconds": 0.5,
                "max_failures": MAX_FAILURES, "lockout_seconds": LOCK_SECONDS, "token_ttl_seconds": 3600,
                "answer_seconds": 0.0})  # timing: tests/integration/test_login_limits.py
            passwords = {}
            for name in ("alice", "bob"):
                passwords[name] = secrets.token_urlsafe(12)
                ensure_user(d.accounts[name].name, password=passwords[name])
            yield d, factory, passwords
        finally:
            if d is not None:
                stop_privsep(d)
            factory.cleanup()


def login(d: PrivsepDaemon, user: str, password: str) -> str:
    return str(login_client.login(d.url, user, password, d.cacert)["token"])


def read(d: PrivsepDaemon, token: str, path: str, privileged: bool = False) -> str:
    async def go() -> str:
        async with Client(d.url, token, d.cacert, 30) as c:
            args: dict[str, Any] = {"path": path}
            if privileged:
                args["privileged"] = True
            result = await c.call_tool("files/read", args)
            return str(result["content"][0]["text"])

    return asyncio.run(go())


def login_rejects(d: PrivsepDaemon, user: str) -> list[dict[str, Any]]:
    return [r for r in d.audit() if r.get("event") == "login" and r.get("decision") == "reject" and r.get("os_user") == user]


def test_pam_login_right_password_gives_a_token_that_works(pamd: Any) -> None:
    d, _, pw = pamd
    alice = d.accounts["alice"].name
    token = login(d, alice, pw["alice"])
    assert identity.TOKEN_RE.match(token)
    assert "root:" in read(d, token, "/etc/passwd")
    accepted = [r for r in d.audit() if r.get("event") == "login" and r.get("decision") == "accept" and r.get("os_user") == alice]
    assert accepted and pw["alice"] not in d.audit_text() and token not in d.audit_text()


def test_pam_login_wrong_password_is_generic_and_audited_with_pam_code(pamd: Any) -> None:
    d, factory, _ = pamd
    acct, _ = enroll(d, factory)
    with httpx.Client(verify=ssl_context(d.cacert), timeout=60) as c:
        resp = c.post(d.url + "/login", json={"user": acct.name, "password": "wrong-password"})
        unknown = c.post(d.url + "/login", json={"user": "nosuchuser" + secrets.token_hex(2), "password": "x"})
    assert (resp.status_code, resp.json()) == (401, {"error": "authentication failed"})
    assert (unknown.status_code, unknown.json()) == (401, {"error": "authentication failed"})
    rejects = login_rejects(d, acct.name)
    assert rejects and isinstance(rejects[-1].get("pam_code"), int) and rejects[-1]["pam_code"] != 0
    assert "wrong-password" not in d.audit_text()


def test_pam_login_locked_account_is_refused(pamd: Any) -> None:
    d, factory, _ = pamd
    acct, password = enroll(d, factory)
    lock_user(acct.name)
    with pytest.raises(AuthError):
        login(d, acct.name, password)
    assert login_rejects(d, acct.name)[-1].get("pam_code", 0) != 0, login_rejects(d, acct.name)[-1]["reason"]


def test_pam_login_expired_account_is_refused(pamd: Any) -> None:
    d, factory, _ = pamd
    acct, password = enroll(d, factory)
    expire_user(acct.name)
    with pytest.raises(AuthError):
        login(d, acct.name, password)
    assert login_rejects(d, acct.name)[-1].get("pam_code", 0) != 0, login_rejects(d, acct.name)[-1]["reason"]


def test_pam_login_unenrolled_account_is_refused(pamd: Any) -> None:
    d, factory, _ = pamd
    password = secrets.token_urlsafe(12)
    acct = factory.user(password=password)
    with pytest.raises(AuthError):
        login(d, acct.name, password)
    assert "not bound" in login_rejects(d, acct.name)[-1]["reason"]


def test_pam_login_lockout_after_repeated_failures_and_recovery(pamd: Any) -> None:
    d, factory, pw = pamd
    acct, password = enroll(d, factory)
    for _ in range(MAX_FAILURES):
        with pytest.raises(AuthError):
            login(d, acct.name, "wrong")
    with pytest.raises(AuthError):  # locked: even the right password is refused
        login(d, acct.name, password)
    assert "locked out" in login_rejects(d, acct.name)[-1]["reason"]
    # other users are unaffected meanwhile, from the same address
    assert identity.TOKEN_RE.match(login(d, d.accounts["bob"].name, pw["bob"]))
    time.sleep(LOCK_SECONDS + 0.5)
    assert identity.TOKEN_RE.match(login(d, acct.name, password))


def test_reauth_after_honoured_and_expiring(pamd: Any) -> None:
    d, _, pw = pamd
    alice = d.accounts["alice"].name
    grants = d.default_grants()
    grants["users"][alice]["privileged"]["tools"]["files/read"]["reauth_after"] = f"{REAUTH_SECONDS}s"
    d.write_grants(grants)
    try:
        time.sleep(1.0)  # SIGHUP reload
        with pytest.raises(ToolFailed) as info:
            read(d, d.tokens["alice"], str(d.log_file), privileged=True)
        assert info.value.code == "PERMISSION_DENIED"
        assert info.value.details["reason"] == "reauthentication required"
        assert "linuxctl login" in info.value.message
        token = login(d, alice, pw["alice"])
        try:
            text = read(d, token, str(d.log_file), privileged=True)
        except ToolFailed as exc:
            raise AssertionError(exc.details) from None
        assert text.startswith("app log line 1")
        time.sleep(REAUTH_SECONDS + 1)
        with pytest.raises(ToolFailed) as info:
            read(d, token, str(d.log_file), privileged=True)
        assert info.value.details["reason"] == "reauthentication required"
    finally:
        d.write_grants(d.default_grants())
        time.sleep(1.0)


async def _stream_ends_after(d: PrivsepDaemon, token: str, action: Any) -> bool:
    """Open /sse with ``token``, run ``action()`` once the endpoint arrived; True if the stream ends within 10 s."""
    async with httpx.AsyncClient(verify=ssl_context(d.cacert), timeout=30) as c:
        async with c.stream("GET", d.url + "/sse", headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status_code == 200
            lines = resp.aiter_lines()
            async for line in lines:
                if line.startswith("data: /message"):
                    break
            await asyncio.to_thread(action)
            try:
                async with asyncio.timeout(10):
                    async for _ in lines:
                        pass
            except TimeoutError:
                return False
            except httpx.RemoteProtocolError:
                return True  # cut mid-chunk: closed all the same
            return True


def test_revoked_token_stops_working_and_its_stream_is_closed(pamd: Any) -> None:
    d, _, pw = pamd
    token = login(d, d.accounts["alice"].name, pw["alice"])
    ended = asyncio.run(_stream_ends_after(d, token, lambda: login_client.logout(d.url, token, d.cacert)))
    assert ended
    assert status_of_sse(d, token) == 401


def test_revoked_by_mcpd_users_sessions_closes_the_stream(pamd: Any) -> None:
    d, _, pw = pamd
    token = login(d, d.accounts["bob"].name, pw["bob"])
    token_id = identity.TOKEN_RE.match(token).group(1)  # type: ignore[union-attr]
    listed = subprocess.run([sys.executable, "-m", "mcpd.admin.cli", "users", "sessions", "--config", str(d.config_path)],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert token_id in listed and token not in listed

    def revoke() -> None:
        subprocess.run([sys.executable, "-m", "mcpd.admin.cli", "users", "sessions", "--config", str(d.config_path),
                        "--revoke", token_id], capture_output=True, timeout=60, check=True)

    assert asyncio.run(_stream_ends_after(d, token, revoke))
    assert status_of_sse(d, token) == 401


def test_rotating_a_users_token_closes_its_open_sessions(pamd: Any) -> None:
    d, _, _ = pamd
    old = d.tokens["bob"]

    def rotate() -> None:
        out = subprocess.run([sys.executable, "-m", "mcpd.admin.cli", "users", "rotate", "bob",
                              "--file", str(d.state_dir / "users.yaml")],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        d.tokens["bob"] = out.strip()

    assert asyncio.run(_stream_ends_after(d, old, rotate))
    assert status_of_sse(d, old) == 401
    assert status_of_sse(d, d.tokens["bob"]) == 200


def test_issued_tokens_survive_a_helper_restart_stored_hashed_policy_only(pamd: Any) -> None:
    """Login tokens are files of the policy process's own (mcpd-policy, 0600, in its 0700
    folder), hashed, and a helper restart keeps them."""
    d, _, pw = pamd
    token = login(d, d.accounts["alice"].name, pw["alice"])
    d.restart_helper()
    assert "root:" in read(d, token, "/etc/passwd")
    store = d.state_dir / "helper" / f"token.{identity.TOKEN_RE.match(token).group(1)}"  # type: ignore[union-attr]
    st = os.stat(store)
    policy = pwd.getpwnam(POLICY_USER)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (policy.pw_uid, 0o600)
    folder = os.stat(store.parent)
    assert (folder.st_uid, stat.S_IMODE(folder.st_mode)) == (policy.pw_uid, 0o700)
    assert token.split("_", 2)[2] not in store.read_text()


def test_linuxctl_login_password_stdin_and_logout(pamd: Any) -> None:
    d, _, pw = pamd
    env = dict(os.environ, MCPD_URL=d.url, MCPD_CACERT=d.cacert)
    env.pop("MCP_TOKEN", None)
    out = subprocess.run([sys.executable, "-m", "mcpd.client.linuxctl", "login", "--user", d.accounts["alice"].name,
                          "--password-stdin"], input=pw["alice"] + "\n", capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("export MCP_TOKEN=mcpd_")
    token = out.stdout.strip().split("=", 1)[1]
    bad = subprocess.run([sys.executable, "-m", "mcpd.client.linuxctl", "login", "--user", d.accounts["alice"].name,
                          "--password-stdin"], input="wrong\n", capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 3 and "authentication failed" in bad.stderr
    env["MCP_TOKEN"] = token
    gone = subprocess.run([sys.executable, "-m", "mcpd.client.linuxctl", "logout"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert gone.returncode == 0, gone.stderr
    assert status_of_sse(d, token) == 401


def test_login_without_helper_answers_503(daemon: Any) -> None:
    with httpx.Client(verify=ssl_context(daemon.cacert), timeout=30) as c:
        resp = c.post(daemon.url + "/login", json={"user": "x", "password": "y"})
        logout = c.post(daemon.url + "/logout", headers={"Authorization": f"Bearer {daemon.token}"})
        no_bearer_logout = c.post(daemon.url + "/logout")
    assert resp.status_code == 503 and "root helper" in resp.json()["error"]
    assert "retry-after" not in resp.headers  # no helper unit at all: retrying cannot help
    assert logout.status_code == 503 and "retry-after" not in logout.headers
    assert no_bearer_logout.status_code == 401


@pytest.fixture(scope="module")
def with_logins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrivsepDaemon, AccountFactory]]:
    """The privsep daemon with password logins and a 20 s deadline (the slow read outlives the sweep)."""
    from tests.support.workers import login_daemon

    with login_daemon(tmp_path_factory, 20, 0.2) as pair:
        yield pair


@pytest.mark.root
def test_a_logout_does_not_kill_the_worker_serving_the_principals_other_token(
        with_logins: tuple[PrivsepDaemon, AccountFactory], shared_folder: Path) -> None:
    """docs/REFERENCE.md §5.3 (a login token ends with its logout; the principal's other tokens go on
    working), low: the front pools workers per principal and account, whichever token started
    them, but the policy process's sweep ends every worker started with a token that no longer
    authenticates. A user who logs out of one device (``linuxctl logout``) thereby kills the worker
    the principal's static token (or its other login) is using: that call fails "worker crashed"
    (INTERNAL_ERROR). Here: a login reads once (its worker is then the account's one idle worker),
    the static token's session starts a read that takes seconds (it ran on that worker), and the
    login logs out. Fixed: a call runs only on a worker its own token spawned (the front's pool
    tags each worker with its token), so the sweep ends only the logged-out token's worker."""
    from mcpd.client import login as login_client
    d, factory = with_logins
    password = "pw-" + os.urandom(6).hex()
    acct = factory.user(password=password)
    static = share_account(d, [acct.name], acct.name)[acct.name]
    small = shared_folder / "small.txt"
    small.write_text("hello\n")
    small.chmod(0o644)
    slow = slow_read(shared_folder, "slow")
    shared_folder.chmod(0o755)
    for f in shared_folder.iterdir():
        f.chmod(0o644)
    login_token = str(login_client.login(d.url, acct.name, password, d.cacert)["token"])
    assert not asyncio.run(parallel_reads(d, login_token, small, 1))[0].get("isError")

    async def slow_call_then_logout() -> dict[str, Any]:
        async with Client(d.url, static, d.cacert, timeout=60) as c:
            call = asyncio.ensure_future(c.call_tool("files/read", slow["params"]["arguments"], check=False))
            await asyncio.sleep(1.0)  # the read runs (before the fix: on the login's worker)
            assert not call.done()
            await asyncio.to_thread(login_client.logout, d.url, login_token, d.cacert)
            return await call

    result = asyncio.run(slow_call_then_logout())
    code = result.get("structuredContent", {}).get("error", {}).get("code")
    assert code != "INTERNAL_ERROR", (result, [r for r in d.audit() if r.get("event") == "kill"])
    # The login's worker, ended by the policy process's sweep, is let go by the front without a
    # kill_worker in the revoked token's name (each was refused and recorded "invalid token").
    time.sleep(2.0)
    assert not asyncio.run(parallel_reads(d, static, small, 2))[0].get("isError")
    assert not [r for r in d.audit() if r.get("tool") == "kill_worker" and r.get("reason") == "invalid token"]
