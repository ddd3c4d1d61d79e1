"""Logins tried as an attacker would (docs/REFERENCE.md §5.3), with real PAM and real OS accounts.

The root helper and the front run as in production (``privsep_fixture``). The PAM service is
real (``pam_unix`` auth and account) but asks a 0.3 s failure delay (``pam_faildelay``; libpam
randomises it to 0.15-0.45 s) instead of pam_unix's 2 s, so the answer floor
(``login.answer_seconds``) can be 0.8 s and the module stays fast; the shipped service and its
default floor are the same mechanism with larger numbers.

Shown here: answer times that do not depend on the password or the kind of account (timing);
concurrent guesses that neither reach PAM more than ``max_failures`` times nor win (slot first);
a login flood from many addresses that leaves token checks, privileged calls and later logins
working (bounded logins); ``reauth_after: 0`` admitting one call of a batch of 20; a lockout that
survives a helper restart and that ``mcpd users unlock`` clears.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mcpd.client.api import Client, ssl_context
from tests.support.osaccounts import AccountFactory, ensure_user, pam_service, unique_name
from tests.support.pam_login import FAST_PAM, enroll
from tests.support.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep

pytestmark = pytest.mark.root

ANSWER_SECONDS = 0.8
MAX_FAILURES = 3
TRIES = 10


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrivsepDaemon, AccountFactory, str]]:
    """The privsep daemon with the fast PAM service; alice's account gets a password (returned)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: PAM service, OS accounts, root helper")
    fast = tmp_path_factory.mktemp("pam") / "fast"
    fast.write_text(FAST_PAM)
    factory = AccountFactory()
    d: PrivsepDaemon | None = None
    with pam_service(fast) as service:
        try:
            # every one of a batch of 20 privileged calls must reach the helper's reauth check
            d = start_privsep(factory, max_privileged_per_principal=32, login={
                "pam_service": service, "answer_seconds": ANSWER_SECONDS, "free_failures": 2,
                "base_delay_seconds": 0.1, "max_delay_seconds": 0.4, "max_failures": MAX_FAILURES,
                "lockout_seconds": 30, "token_ttl_seconds": 3600, "in_flight": 32, "in_flight_per_address": 2})
            password = secrets.token_urlsafe(12)
            ensure_user(d.accounts["alice"].name, password=password)
            yield d, factory, password
        finally:
            if d is not None:
                stop_privsep(d)
            factory.cleanup()


def post_login(d: PrivsepDaemon, user: str, password: str, source: str = "127.0.0.1") -> tuple[int, float, Any]:
    """``POST /login`` from the loopback address ``source``: ``(status, seconds, JSON body)``."""
    transport = httpx.HTTPTransport(local_address=source, verify=ssl_context(d.cacert))
    with httpx.Client(transport=transport, timeout=60) as c:
        start = time.monotonic()
        resp = c.post(d.url + "/login", json={"user": user, "password": password})
        return resp.status_code, time.monotonic() - start, resp.json()


def login_records(d: PrivsepDaemon, user: str) -> list[dict[str, Any]]:
    return [r for r in d.audit() if r.get("tool") == "login" and r.get("os_user") == user]


def test_answer_time_tells_nothing_about_password_or_account(limited: Any) -> None:
    """Enrolled, unenrolled and a uid-0 account, 10 right and 10 wrong passwords each, answered
    from distinct addresses (so no address delay): per account the medians of right and wrong
    stay within 20 %, and only the enrolled account's right password gets a token."""
    d, factory, _ = limited
    enrolled, enrolled_pw = enroll(d, factory)
    unenrolled_pw = secrets.token_urlsafe(12)
    unenrolled = factory.user(password=unenrolled_pw)
    root_alias, root_pw = unique_name(), secrets.token_urlsafe(16)  # uid 0 with a password we know
    subprocess.run(["useradd", "-o", "-u", "0", "-g", "0", "-M", "-N", "-d", "/nonexistent", "-s",
                    "/usr/sbin/nologin", root_alias], check=True, capture_output=True, timeout=60)
    try:
        subprocess.run(["chpasswd"], input=f"{root_alias}:{root_pw}\n", text=True, check=True, timeout=60)
        cases = {"enrolled": (enrolled.name, enrolled_pw), "unenrolled": (unenrolled.name, unenrolled_pw),
                 "uid 0": (root_alias, root_pw)}
        results: dict[str, list[tuple[bool, int, float]]] = {name: [] for name in cases}

        def run(index: int, name: str) -> None:
            user, password = cases[name]
            for i in range(2 * TRIES):
                right = i % 2 == 1
                status, seconds, _ = post_login(d, user, password if right else "wrong-" + password,
                                                f"127.0.{10 + index}.{i + 1}")
                results[name].append((right, status, seconds))

        threads = [threading.Thread(target=run, args=(i, name)) for i, name in enumerate(cases)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        subprocess.run(["userdel", "--force", root_alias], capture_output=True, timeout=60)
    for name, got in results.items():
        right = [s for r, _, s in got if r]
        wrong = [s for r, _, s in got if not r]
        mr, mw = statistics.median(right), statistics.median(wrong)
        print(f"{name:10s} median right {mr:.3f} s, wrong {mw:.3f} s (floor {ANSWER_SECONDS} s)")
        assert len(right) == len(wrong) == TRIES
        assert abs(mr - mw) <= 0.2 * max(mr, mw), (name, mr, mw)
        statuses = [(r, status) for r, status, _ in got]
        expected = [(r, 200 if name == "enrolled" and r else 401) for r, _ in statuses]
        assert statuses == expected, name
    for user in (unenrolled.name, root_alias):
        assert not any("pam_code" in r for r in login_records(d, user))  # refused before PAM


def test_concurrent_guesses_reach_pam_at_most_max_failures_times_and_never_win(limited: Any) -> None:
    """30 logins at once from 30 addresses, the right password last: no token, and at most
    ``max_failures`` attempts reach PAM (the audit records PAM's code only when PAM ran)."""
    d, factory, _ = limited
    acct, password = enroll(d, factory)
    answers: list[int] = []
    gate = threading.Barrier(29)

    def guess(i: int) -> None:
        gate.wait()
        answers.append(post_login(d, acct.name, f"guess-{i}", f"127.0.20.{i + 1}")[0])

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(29)]
    for t in threads:
        t.start()
    time.sleep(0.3)  # the guesses are in flight
    last = post_login(d, acct.name, password, "127.0.20.100")
    for t in threads:
        t.join(120)
    assert last[0] == 401 and sorted(set(answers)) == [401]
    records = login_records(d, acct.name)
    reached_pam = [r for r in records if "pam_code" in r]
    print(f"30 concurrent guesses: {len(reached_pam)} reached PAM; reasons "
          f"{sorted({str(r['reason']) for r in records})}")
    assert len(records) == 30 and 1 <= len(reached_pam) <= MAX_FAILURES
    assert not any(r["decision"] == "accept" for r in records)  # none won


async def _flood(d: PrivsepDaemon, addresses: int, per_address: int, rounds: int, stop: asyncio.Event) -> list[int]:
    """``addresses`` x ``per_address`` clients, each sending at most ``rounds`` logins for unknown
    accounts (a ``429`` is followed by a 0.5 s pause) until ``stop`` is set."""
    statuses: list[int] = []

    async def one(client: httpx.AsyncClient) -> None:
        for _ in range(rounds):
            if stop.is_set():
                return
            resp = await client.post(d.url + "/login", json={"user": unique_name(), "password": "x"})
            statuses.append(resp.status_code)
            if resp.status_code == 429:
                assert int(resp.headers["retry-after"]) >= 1
                await asyncio.sleep(0.5)

    clients = [httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=f"127.0.30.{i + 1}",
                                                                     verify=ssl_context(d.cacert)), timeout=60)
               for i in range(addresses)]
    try:
        await asyncio.gather(*(one(c) for c in clients for _ in range(per_address)))
    finally:
        for c in clients:
            await c.aclose()
    return statuses


def test_login_flood_leaves_tokens_calls_and_later_logins_working(limited: Any) -> None:
    """300 logins in flight at once from 30 addresses (10 each, at most 5 rounds, ~6 s): meanwhile a static
    token still reads and a privileged call succeeds; 10 s after, a correct login from one of the
    flooding addresses works."""
    d, _, password = limited
    alice = d.accounts["alice"].name

    async def go() -> tuple[list[int], float]:
        stop = asyncio.Event()
        flood = asyncio.create_task(_flood(d, 30, 10, 5, stop))
        await asyncio.sleep(1.0)  # the flood is on
        start = time.monotonic()
        async with Client(d.url, d.tokens["alice"], d.cacert, 30) as c:
            plain = await c.call_tool("files/read", {"path": "/etc/passwd"})
            privileged = await c.call_tool("files/read", {"path": str(d.log_file), "privileged": True})
        took = time.monotonic() - start
        assert "root:" in plain["content"][0]["text"]
        assert privileged["content"][0]["text"].startswith("app log line 1")
        assert not flood.done(), "the flood ended before the calls: make it longer"
        await asyncio.sleep(5.0)
        stop.set()
        return await flood, took

    alerts_before = len([r for r in d.audit() if r.get("event") == "alert"])
    statuses, took = asyncio.run(go())
    alerts = [r for r in d.audit() if r.get("event") == "alert"][alerts_before:]
    by_reason: dict[str, int] = {}
    for r in alerts:
        by_reason[str(r.get("reason"))] = by_reason.get(str(r.get("reason")), 0) + 1
    assert all(n <= 11 for n in by_reason.values()), by_reason  # at most 10 per reason a minute, + a summary
    print(f"flood: {len(statuses)} logins, {statuses.count(401)} x 401, {statuses.count(429)} x 429; "
          f"read + privileged call during it: {took:.2f} s")
    assert set(statuses) <= {401, 429} and statuses.count(401) > 0 and statuses.count(429) > 0
    time.sleep(10.0)
    status, seconds, body = post_login(d, alice, password, "127.0.30.1")
    print(f"login 10 s after the flood: {status} in {seconds:.2f} s")
    assert status == 200 and body["token"].startswith("mcpd_"), str(login_records(d, alice)[-1])


def test_overlong_user_name_is_refused_at_the_front_without_an_alert(limited: Any) -> None:
    """A user name longer than the helper's schema allows would make the helper drop the front's
    connection (an alert), failing the requests multiplexed on it: the front refuses it first."""
    d, _, _ = limited
    alerts = sum(r["event"] == "alert" for r in d.audit())
    status, _, body = post_login(d, "a" * 65, "x")
    assert status == 400 and "64" in body["error"]
    assert post_login(d, "a" * 64, "x")[0] == 401
    assert sum(r["event"] == "alert" for r in d.audit()) == alerts


def test_reauth_zero_admits_exactly_one_call_of_a_batch_of_twenty(limited: Any) -> None:
    d, _, password = limited
    alice = d.accounts["alice"].name
    grants = d.default_grants()
    grants["users"][alice]["privileged"]["tools"]["files/read"]["reauth_after"] = "0"
    d.write_grants(grants)
    try:
        time.sleep(1.0)  # SIGHUP reload
        status, _, body = post_login(d, alice, password)
        assert status == 200

        async def batch() -> list[dict[str, Any]]:
            async with Client(d.url, body["token"], d.cacert, 60) as c:
                loop = asyncio.get_running_loop()
                msgs, futures = [], []
                for i in range(1000, 1020):
                    msgs.append({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
                        "name": "files/read", "arguments": {"path": str(d.log_file), "privileged": True}}})
                    futures.append(c._pending.setdefault(i, loop.create_future()))
                # one POST each, all at once (the client's 2025-06-18 session takes no batch)
                await asyncio.gather(*(c._post(m) for m in msgs))
                return list(await asyncio.wait_for(asyncio.gather(*futures), 60))

        replies = asyncio.run(batch())
    finally:
        d.write_grants(d.default_grants())
        time.sleep(1.0)
    ok = [r for r in replies if "result" in r and not r["result"].get("isError")]
    refused = [r["result"]["structuredContent"]["error"]["details"].get("reason") for r in replies if r not in ok]
    print(f"batch of 20 under reauth_after 0: {len(ok)} succeeded; refusals {sorted(set(map(str, refused)))}")
    assert len(ok) == 1 and ok[0]["result"]["content"][0]["text"].startswith("app log line 1")
    assert refused == ["reauthentication required"] * 19


def test_lockout_survives_a_helper_restart_and_users_unlock_clears_it(limited: Any) -> None:
    d, factory, _ = limited
    acct, password = enroll(d, factory)
    for _ in range(MAX_FAILURES):
        assert post_login(d, acct.name, "wrong")[0] == 401
    d.restart_helper()
    assert post_login(d, acct.name, password)[0] == 401
    assert login_records(d, acct.name)[-1]["reason"] == "locked out after repeated failures"
    out = subprocess.run([sys.executable, "-m", "mcpd.admin.cli", "users", "unlock", acct.name,
                          "--config", str(d.config_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and f"unlocked {acct.name}" in out.stdout, out.stderr
    status, _, body = post_login(d, acct.name, password)
    assert status == 200 and body["token"].startswith("mcpd_")
