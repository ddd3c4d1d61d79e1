"""Attack 13c on this morning's bounds: the worker-start bound, the outgoing byte budgets, the
revocation sweep (SPEC §1.4, §1.7, §5.3, §7; docs/PRIVSEP.md §2, §7).

Each test plays the attacker (or the honest client the bound must not hurt) for real over TLS and
checks the rule. Fixed flaws are plain tests; the ones left open are strict xfails that name the
rule they break and its severity.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpd.client.api import Client
from tests.conftest import Daemon, slow_read
from tests.support.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep
from tests.support.net import free_port
from tests.support.budgets import MIB, answer_ends, bob_is_served, daemon_with_metrics, read_call, session_of, stall, stateless_read
from tests.support.shared_folder import shared_folder  # noqa: F401  (fixture)
from tests.support.streams import Raw, reads_done, server_connections, until
from tests.support.streamable import headers as modern_headers
from tests.support.streamable import request as modern_request
from tests.support.osaccounts import AccountFactory
from tests.support.budgets import add_dev_principals

PER_ACCOUNT = 4


@pytest.fixture(scope="module")
def privsep13c() -> Iterator[PrivsepDaemon]:
    """The privsep daemon (root helper, policy process, front as the service user)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: root helper and OS accounts")
    factory = AccountFactory()
    d: PrivsepDaemon | None = None
    try:
        d = start_privsep(factory, workers={"per_account": PER_ACCOUNT, "timeout_seconds": 20})
        yield d
    finally:
        if d is not None:
            stop_privsep(d)
        factory.cleanup()


@pytest.fixture
def readable_file(shared_folder: Path) -> Path:
    """A small file every account may read."""
    target = shared_folder / "f.txt"
    target.write_text("line\n" * 100)
    target.chmod(0o644)
    return target


def share_account(d: PrivsepDaemon, names: list[str], os_user: str) -> dict[str, str]:
    """Bind new principals ``names`` to ``os_user`` in users.yaml (seen within a second, as
    ``mcpd users add NAME --os-user OS_USER`` does): their tokens by name."""
    from mcpd.common import identity

    path = d.state_dir / "users.yaml"
    users = identity.load_users(path)
    tokens = {}
    for name in names:
        tokens[name], rec = identity.new_token()
        users[name] = identity.UserRecord(name=name, os_user=os_user, tokens=[rec])
    identity.save_users(path, users)
    time.sleep(1.5)
    return tokens


async def parallel_reads(d: PrivsepDaemon, token: str, path: Path, n: int) -> list[dict[str, Any]]:
    """``n`` reads of ``path`` at once in one session (each needs a worker of its own while the
    first ones start): their results."""
    async with Client(d.url, token, d.cacert, timeout=60) as c:
        return list(await asyncio.gather(*(c.call_tool("files/read", {"path": str(path)}, check=False)
                                           for _ in range(n))))


@pytest.mark.root
def test_principals_sharing_an_account_do_not_lock_out_another_one(
        privsep13c: PrivsepDaemon, readable_file: Path) -> None:
    """SPEC §1.4/§5 (several principals may be bound to one OS account, each served with its own
    quotas) and "a legitimate client is never locked out in normal use", medium: the policy
    process refused a new worker once the *account* had 4 x per_account workers alive, but the
    front keeps up to per_account idle workers per *principal* for ever. Four principals of one
    account that each once made per_account calls at once left 16 idle workers, and every other
    principal of that account (a fifth static one, or the account's password logins) got
    HELPER_UNAVAILABLE "this account has too many workers" on each call, for as long as the front
    ran. Fixed: the bound counts the principal's own workers."""
    d = privsep13c
    os_user = d.accounts["alice"].name
    names = [f"share{i}" for i in range(5)]
    tokens = share_account(d, names, os_user)
    for name in names[:4]:
        results = asyncio.run(parallel_reads(d, tokens[name], readable_file, PER_ACCOUNT))
        assert not any(r.get("isError") for r in results), results
    last = asyncio.run(parallel_reads(d, tokens[names[4]], readable_file, 1))[0]
    assert not last.get("isError"), last


# -- outgoing bytes: answers of up to one piece, unread ------------------------------------------------


SMALL_ANSWER = 250 * 1024  # bytes of text: the answer stays under one piece (256 KiB)


def stalled_small_answer(d: Daemon, path: Path, rid: int) -> Raw:
    """A stateless ``POST /mcp`` read of ``path`` answered as JSON (under one piece), on a
    connection whose client reads nothing; returns once the read was answered."""
    message = modern_request("tools/call", {"name": "files/read", "arguments": {"path": str(path),
                                                                                  "limit": SMALL_ANSWER + 1024}}, rid)
    headers = {**modern_headers(d, message), "Accept": "application/json"}
    done = reads_done(d)
    raw = post_raw(d, message, headers, 4096)
    assert until(lambda: reads_done(d) > done, 30), "the read was not answered"
    return raw


def post_raw(d: Daemon, message: dict[str, Any] | list[Any], headers: dict[str, str], rcvbuf: int) -> Raw:
    """``POST /mcp`` ``message`` with ``headers`` on a new raw connection with a ``rcvbuf`` byte
    receive buffer; the connection (nothing read yet)."""
    raw = Raw(d, rcvbuf=rcvbuf)
    body = json.dumps(message).encode()
    fields = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    raw.send(f"POST /mcp HTTP/1.1\r\nHost: x\r\n{fields}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return raw


def test_unread_answers_under_a_piece_count_against_the_principals_budget(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """SPEC §1.7 (what the front holds for a client that stopped reading is bounded per principal
    by ``principal_queue_bytes`` and in all by ``total_queue_bytes``), medium: a ``/mcp`` answer
    of up to one piece (256 KiB) goes to the connection in one write and is never charged (only
    larger ones are, piece by piece, and only until their last piece was handed over), and once
    its response is complete the keep-alive timer's close waits to flush it: the connection, its
    answer and its TLS buffers (about 600 KiB in the front's RSS) stay for the TLS shutdown's
    30 s, then the client asks again. One principal with 1024 connections from one address (the
    per-address cap) held about 600 MiB against a budget of 128 MiB, four addresses about 2.4 GiB
    against a total of 512 MiB; ``mcpd_outgoing_bytes`` said 0.
    Fixed: an answer over 64 KiB, once written, is charged what its connection still holds (the
    kernel's send queue included) until it holds no more. Here: eight such answers with a budget
    of 1 MiB; past the budget's four, the connections must be dropped within seconds."""
    port = free_port()
    d = daemon_factory(metrics_listen=f"127.0.0.1:{port}", principal_queue_bytes=MIB,
                       connections={"idle_seconds": 1})
    folder = tmp_path / "files"
    folder.mkdir()
    path = folder / "quarter.txt"
    path.write_bytes((b"y" * 1023 + b"\n") * (SMALL_ANSWER // 1024))
    raws = []
    try:
        for i in range(8):
            raws.append(stalled_small_answer(d, path, i + 1))
        within = MIB // SMALL_ANSWER
        assert until(lambda: sum(server_connections(d, r.port) for r in raws) <= within, 10), \
            f"{sum(server_connections(d, r.port) for r in raws)} unread answers held, budget {within}"
    finally:
        for r in raws:
            r.sock.close()


def test_stalled_principals_filling_the_total_budget_do_not_cut_a_reading_client(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """SPEC §1.7 (a client that stops reading is disconnected; a client reading at a normal speed
    is served), medium: the total budget is four principals' budgets (128 MiB x 4 = 512 MiB by
    default). Four principals that each stalled one session just within their own budget filled
    it, and from then on every other principal's large answer, charged while its connection was
    behind, passed the total and was cut (``queue_bytes_total``), while the stalled sessions that
    held the bytes kept them, for as long as their clients liked.
    Fixed: past the total, the principal holding the most gives up what it holds, the one
    charging when none other holds more. Here at a 7 MiB / 28 MiB scale: alice, carol, dave
    and erin stall a 6 MiB answer each (about 6.5 MiB held each, 26 MiB in all); bob reads a
    4 MiB answer a second late (its connection holds all of it meanwhile, so the total is passed
    whatever the timing) and must get all of it, a staller being cut instead."""
    d, m, big, _small = daemon_with_metrics(daemon_factory, tmp_path, principal_queue_bytes=7 * MIB,
                                            total_queue_bytes=28 * MIB)
    tokens = {"alice": d.token, **add_dev_principals(d, ["carol", "dave", "erin"])}
    streams: list[Raw] = []
    with httpx.Client(verify=d.ssl_context(), timeout=60) as c:
        try:
            for name, token in tokens.items():
                s, _endpoint, statuses = stall(d, c, big, 1, token=token, m=m)
                streams.append(s)
                assert statuses == [202], (name, statuses)
            # (what is left of the total is well short of what bob's connection will hold)
            assert 28 * MIB - BOB_ANSWER + MIB // 2 < m.outgoing() <= 28 * MIB, m.outgoing()
            message, headers = stateless_read(d, big, 7, d.other_token)
            message["params"]["arguments"]["limit"] = BOB_ANSWER
            done = reads_done(d)
            bob = post_raw(d, message, headers, 64 * 1024)
            streams.append(bob)
            assert until(lambda: reads_done(d) > done, 30), "bob's read was not answered"
            time.sleep(1.0)  # bob reads a second late: his connection holds his answer meanwhile
            status, whole = answer_ends(bob)
            assert status == 200 and len(whole) > BOB_ANSWER, f"bob's answer cut at {len(whole)} bytes"
            assert m.hits("queue_bytes_total") >= 1, "no staller was cut"
        finally:
            for s in streams:
                s.close()


BOB_ANSWER = 4 * MIB  # bytes of text bob reads: less than a staller holds, more than the total leaves


# -- the revocation sweep ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def with_logins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrivsepDaemon, AccountFactory]]:
    """The privsep daemon with password logins and a 20 s deadline (the slow read outlives the sweep)."""
    from tests.support.workers import login_daemon

    with login_daemon(tmp_path_factory, 20, 0.2) as pair:
        yield pair


@pytest.mark.root
def test_a_logout_does_not_kill_the_worker_serving_the_principals_other_token(
        with_logins: tuple[PrivsepDaemon, AccountFactory], shared_folder: Path) -> None:
    """SPEC §5.3 (a login token ends with its logout; the principal's other tokens go on
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


# -- outgoing bytes: POST event streams their client left ------------------------------------------


def abandoned_post_stream(d: Daemon, sid: str, big: Path, k: int) -> None:
    """A session-era ``POST /mcp`` batch asking for progress (so answered as an event stream): a
    read that takes seconds, then a 6 MiB read; its client leaves once the stream's headers came,
    before the batch's one reply (about 6 MiB) is ready. Returns once both reads were answered."""
    slow = slow_read(big.parent, f"s{k}")
    slow["params"]["arguments"]["start_line"] = 3 * 10 ** 8  # (a second or so, not the full count)
    slow["params"]["_meta"] = {"progressToken": f"p{k}"}
    done = reads_done(d)
    raw = post_raw(d, [slow, read_call(big, k, progress=True)],
                   {"Authorization": f"Bearer {d.token}", "Accept": "text/event-stream",
                    "Content-Type": "application/json", "Mcp-Session-Id": sid}, 1 << 20)
    raw.until(b"\r\n\r\n")
    raw.sock.close()
    assert until(lambda: reads_done(d) >= done + 2, 120), "the batch's reads were not answered"


def test_a_post_stream_its_client_left_leaves_nothing_charged(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """SPEC §1.7 (outgoing budgets; nothing grows without bound), high: a session-era POST's
    event stream whose client leaves before its reply is released when the stream ends, but the
    request goes on (in that era leaving is no cancellation) and its reply, put into the ended
    stream, was charged again, and never released: every such POST left its answer's size
    charged to its principal and to the total for the front's life. About 21 abandoned 6 MiB
    answers filled a principal's 128 MiB for good (each of its sessions then cut at its next
    large answer) and about 85 the total 512 MiB, after which every principal's large answers
    were cut. Fixed: an ended stream takes nothing more."""
    d, m, big, small = daemon_with_metrics(daemon_factory, tmp_path)
    with httpx.Client(verify=d.ssl_context(), timeout=60) as c:
        sid = session_of(d, c)["Mcp-Session-Id"]
        for k in range(2):
            abandoned_post_stream(d, sid, big, k)
        assert until(lambda: m.outgoing() == 0, 5), f"{m.outgoing():.0f} bytes still charged for clients that left"
        bob_is_served(d, c, small)
