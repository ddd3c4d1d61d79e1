"""Calling and cancelling in a loop does not make the daemon fork without end (docs/REFERENCE.md §1.4, §1.7).

With ``workers.cancel_grace_seconds: 0`` each cancelled call kills its worker, as the contract
wants (the job stops), and the next call needs a new one: the worst case the bucket bounds (a
cancel during a worker's start, or a slow op outlasting the grace, costs a worker the same way).
The attacks here post batches of call-and-cancel pairs, as fast as the server
takes them, over real TLS: the workers started for one principal stay within its bucket
(``workers.spawn_burst`` at once, then ``workers.spawns_per_second``), the calls past it are
``RATE_LIMITED``, another principal is served meanwhile, and once the bucket has refilled the
principal is served again. Counted with what the daemon itself reports: ``mcpd_workers_started_total``
on the metrics listener (development front), the helper's audit ``spawn`` records (root helper).

With the cancel grace (the default), a client that cancels quick calls as fast (one searching as
its user types) keeps its workers: their replies are read and discarded, nothing is started and
nothing is ``RATE_LIMITED``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from tests.conftest import Daemon, SseSession
from tests.support.metrics import samples
from tests.support.net import free_port
from tests.support.osaccounts import AccountFactory
from tests.support.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep
from tests.support.root_channels import as_front
from tests.support.shared_folder import shared_folder  # noqa: F401  (fixture)
from tests.support.workers import slow_file

pytestmark = pytest.mark.anyio

BURST = 4  # workers.spawn_burst of these daemons (= per_account: an account's first parallel calls)
RATE = 0.25  # workers.spawns_per_second: a worker every 4 s once the burst is spent
WORKERS = {"per_account": BURST, "spawn_burst": BURST, "spawns_per_second": RATE, "timeout_seconds": 10,
           "cancel_grace_seconds": 0}  # every cancel costs a worker: what the bucket must bound
GRACE = 2.0  # workers.cancel_grace_seconds of the grace test (a quick read needs milliseconds of it)
POSTS = 15  # batches of call-and-cancel pairs
PAIRS = 4  # pairs per batch


def churn_batch(first_id: int, path: str) -> list[dict[str, Any]]:
    """``PAIRS`` calls of files/read, each followed by its notifications/cancelled."""
    batch: list[dict[str, Any]] = []
    for rid in range(first_id, first_id + PAIRS):
        batch.append({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                      "params": {"name": "files/read", "arguments": {"path": path}}})
        batch.append({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": rid}})
    return batch


def codes(messages: list[Any]) -> list[str]:
    """The error codes of the tool results among ``messages`` (stream messages or batch answers)."""
    found = []
    for m in messages:
        for item in m if isinstance(m, list) else [m]:
            result = item.get("result") if isinstance(item, dict) else None
            if isinstance(result, dict) and result.get("isError"):
                found.append(result["structuredContent"]["error"]["code"])
    return found


class Metrics:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/metrics"

    def get(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return samples(httpx.get(self.base, timeout=10).text)

    def started(self) -> float:
        return self.get()[("mcpd_workers_started_total", ())]

    def settle(self) -> None:
        """Wait (bounded, not a timing assertion) until no call holds or waits for a worker."""
        for _ in range(400):
            m = self.get()
            if m[("mcpd_workers_busy", ())] == 0 and m[("mcpd_pool_queued", ())] == 0:
                return
            time.sleep(0.05)
        raise AssertionError("calls still running 20 s after the churn")


async def drain(s: SseSession, seconds: float) -> list[Any]:
    """Every message the stream delivers within ``seconds``."""
    seen: list[Any] = []
    end = asyncio.get_running_loop().time() + seconds
    while (left := end - asyncio.get_running_loop().time()) > 0:
        try:
            seen.append(await s.next_message(timeout=left))
        except TimeoutError:
            break
    return seen


async def answered(s: SseSession, rid: str) -> bool:
    """Whether the reply to ``rid`` has come (waits at most 0.05 s for one more message)."""
    try:
        m = await s.next_message(timeout=0.05)
    except TimeoutError:
        pass
    else:
        if isinstance(m, dict) and "id" in m:
            s.pending[json.dumps(m["id"])] = m
    return json.dumps(rid) in s.pending


async def refused_then_refilled(s: SseSession, slow: Path, ok_path: str, busy: Callable[[], float]) -> dict[str, Any]:
    """Run slow calls and cancel each once it holds a worker, until one is refused (the bucket is
    empty and no idle worker is left); return that refusal's error after checking that a call made
    ``retry_after_seconds`` later (and nothing else waited for) is served."""
    for n in range(BURST + 8):
        rid = f"slow-{n}"
        assert (await s.post({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                              "params": {"name": "files/read",
                                         "arguments": {"path": str(slow), "start_line": 3}}})).status_code == 202
        for _ in range(400):  # until it runs in a worker or is answered (bounded)
            if await answered(s, rid) or busy():
                break
        if await answered(s, rid):
            reply = await s.reply(rid)
            assert reply["result"]["isError"], reply
            error: dict[str, Any] = reply["result"]["structuredContent"]["error"]
            assert error["code"] == "RATE_LIMITED", error
            await asyncio.sleep(error["details"]["retry_after_seconds"] + 0.1)
            after = await s.request("tools/call", {"name": "files/read", "arguments": {"path": ok_path}})
            assert not after["result"].get("isError"), after
            return error
        assert (await s.post({"jsonrpc": "2.0", "method": "notifications/cancelled",
                              "params": {"requestId": rid}})).status_code == 202
        for _ in range(400):
            if not busy():
                break
            await asyncio.sleep(0.05)
    raise AssertionError("no call was refused: workers were started past the bucket")


# ------------------------------------------------------------------ development front (LocalSpawner)


@pytest.fixture
def churned(daemon_factory: Callable[..., Daemon]) -> Iterator[tuple[Daemon, Metrics]]:
    port = free_port()
    d = daemon_factory(metrics_listen=f"127.0.0.1:{port}", workers=WORKERS)
    yield d, Metrics(port)


async def test_call_and_cancel_loop_starts_workers_only_within_the_bucket(
        churned: tuple[Daemon, Metrics], tmp_path: Path) -> None:
    d, metrics = churned
    target = tmp_path / "f.txt"
    target.write_text("x\n" * 1000)
    slow = slow_file(tmp_path)
    async with SseSession(d) as s:
        await s.initialize("2025-03-26")  # (its batches end with 2025-06-18)
        started0, t0 = metrics.started(), time.monotonic()
        first = await s.request("tools/call", {"name": "files/read", "arguments": {"path": str(target)}})
        assert not first["result"].get("isError")
        answers = []
        for r in range(POSTS):
            res = await s.post(churn_batch(1000 + r * PAIRS, str(target)))
            assert res.status_code == 202
        answers += await drain(s, 2.0)
        metrics.settle()
        spawned = metrics.started() - started0
        bound = BURST + RATE * (time.monotonic() - t0)
        assert spawned <= bound + 1e-9, f"{spawned} workers started for {POSTS * PAIRS} cancelled calls (bound {bound:.1f})"
        assert "RATE_LIMITED" in codes(answers)  # the calls past the bucket are told so
        assert set(codes(answers)) == {"RATE_LIMITED"}
        assert metrics.get()[("mcpd_limits_hit_total", (("limit", "worker_spawns"),))] >= 1

        before_bob = metrics.started()
        async with SseSession(d, token=d.other_token) as bob:  # another principal: a bucket of its own
            await bob.initialize("2025-03-26")  # (its batches end with 2025-06-18)
            got = await bob.request("tools/call", {"name": "files/read", "arguments": {"path": str(target)}})
            assert not got["result"].get("isError"), got
        bobs = metrics.started() - before_bob
        assert bobs == 1

        def busy() -> float:
            return metrics.get()[("mcpd_workers_busy", ())]

        error = await refused_then_refilled(s, slow, str(target), busy)
        assert error["details"]["limit"] == BURST and 0 < error["details"]["retry_after_seconds"] <= 1 / RATE
        total = metrics.started() - started0 - bobs
        assert total <= BURST + RATE * (time.monotonic() - t0) + 1e-9, total


async def cancelled_reads_keep_their_workers(s: SseSession, metrics: Metrics, target: Path) -> None:
    """Start the account's ``BURST`` workers with one batch, then post 40 quick reads of ``target``,
    each cancelled right after it (batches of call-and-cancel pairs), and check that none is
    RATE_LIMITED and no worker is started or lost: each cancelled read's worker finished within
    its grace and was kept."""
    warm = [{"jsonrpc": "2.0", "id": f"warm-{n}", "method": "tools/call",
             "params": {"name": "files/read", "arguments": {"path": str(target)}}} for n in range(BURST)]
    assert (await s.post(warm)).status_code == 202  # run together: one worker each, the whole burst
    warmed = await s.next_message()  # the batch's answer: one array
    assert len(warmed) == BURST and not any(m["result"].get("isError") for m in warmed), warmed
    metrics.settle()
    started0 = metrics.started()
    assert metrics.get()[("mcpd_workers", ())] == BURST
    answers: list[Any] = []
    for r in range(40 // PAIRS):
        assert (await s.post(churn_batch(1000 + r * PAIRS, str(target)))).status_code == 202
        answers += await drain(s, 0.05)
    answers += await drain(s, 2 * GRACE)
    metrics.settle()
    assert "RATE_LIMITED" not in codes(answers), codes(answers)
    assert metrics.started() == started0  # every cancelled read's worker was kept
    assert metrics.get()[("mcpd_workers", ())] == BURST
    got = await s.request("tools/call", {"name": "files/read", "arguments": {"path": str(target)}})
    assert not got["result"].get("isError") and metrics.started() == started0, got


async def test_cancelling_quick_reads_in_a_burst_keeps_the_workers_with_the_cancel_grace(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """docs/REFERENCE.md §1.4 with the cancel grace: 40 quick reads, each cancelled right after it is posted, on
    an account whose workers are started, start no worker and none is RATE_LIMITED (with
    ``cancel_grace_seconds: 0`` the first cancels spend the bucket and the rest are refused)."""
    port = free_port()
    d = daemon_factory(metrics_listen=f"127.0.0.1:{port}", workers=dict(WORKERS, cancel_grace_seconds=GRACE))
    target = tmp_path / "f.txt"
    target.write_text("x\n" * 1000)
    async with SseSession(d) as s:
        await s.initialize("2025-03-26")  # (its batches end with 2025-06-18)
        await cancelled_reads_keep_their_workers(s, Metrics(port), target)


# ------------------------------------------------------------------ root helper (production spawner)


def audit_spawns(path: Path, principal: str, since: int) -> int:
    """The helper's ``spawn`` records for ``principal`` after the first ``since`` lines."""
    lines = path.read_text().splitlines()[since:]
    return sum(1 for line in lines if (r := json.loads(line)).get("event") == "spawn" and r.get("user") == principal)


class _Front:
    """What :class:`SseSession` needs of a daemon, for the root helper's front."""

    def __init__(self, d: PrivsepDaemon) -> None:
        self.url, self.cacert, self.token, self.other_token = d.url, d.cacert, d.tokens["alice"], d.tokens["bob"]

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.cacert)

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}


@contextlib.contextmanager
def privsep_with(workers: dict[str, float]) -> Iterator[tuple[PrivsepDaemon, Metrics]]:
    """The root helper and its front with these ``workers`` settings and a metrics listener."""
    if os.geteuid() != 0:
        pytest.skip("needs root: starts the root helper and creates OS accounts")
    port = free_port()
    factory = AccountFactory()
    d: PrivsepDaemon | None = None
    try:
        d = start_privsep(factory, workers=workers, metrics_listen=f"127.0.0.1:{port}")
        yield d, Metrics(port)
    finally:
        if d is not None:
            stop_privsep(d)
        factory.cleanup()


@pytest.fixture(scope="module")
def privsep_churned() -> Iterator[tuple[PrivsepDaemon, Metrics]]:
    with privsep_with(WORKERS) as started:
        yield started


@pytest.mark.root
async def test_call_and_cancel_loop_through_the_root_helper_stays_within_the_bucket(
        privsep_churned: tuple[PrivsepDaemon, Metrics], shared_folder: Path) -> None:
    """The production spawner: every worker is a spawn_worker request the policy process serves
    and audits; the churn writes spawn records only within alice's bucket."""
    d, metrics = privsep_churned
    front = cast(Daemon, _Front(d))
    target = shared_folder / "f.txt"
    target.write_text("x\n" * 1000)
    target.chmod(0o644)
    slow = slow_file(shared_folder)
    slow.chmod(0o644)
    since = len(d.audit_path.read_text().splitlines())
    async with SseSession(front) as s:
        await s.initialize("2025-03-26")  # (its batches end with 2025-06-18)
        t0 = time.monotonic()
        first = await s.request("tools/call", {"name": "files/read", "arguments": {"path": str(target)}})
        assert not first["result"].get("isError"), first
        for r in range(POSTS):
            assert (await s.post(churn_batch(1000 + r * PAIRS, str(target)))).status_code == 202
        answers = await drain(s, 2.0)
        metrics.settle()
        spawned = audit_spawns(d.audit_path, "alice", since)
        bound = BURST + RATE * (time.monotonic() - t0)
        assert spawned <= bound + 1e-9, f"{spawned} spawn records for {POSTS * PAIRS} cancelled calls (bound {bound:.1f})"
        assert "RATE_LIMITED" in codes(answers)

        async with SseSession(front, token=d.tokens["bob"]) as bob:
            await bob.initialize("2025-03-26")  # (its batches end with 2025-06-18)
            got = await bob.request("tools/call", {"name": "files/read", "arguments": {"path": str(target)}})
            assert not got["result"].get("isError"), got

        def busy() -> float:
            return metrics.get()[("mcpd_workers_busy", ())]

        error = await refused_then_refilled(s, slow, str(target), busy)
        assert error["details"]["limit"] == BURST
        assert audit_spawns(d.audit_path, "alice", since) <= BURST + RATE * (time.monotonic() - t0) + 1e-9


@pytest.mark.root
async def test_cancelling_quick_reads_through_the_root_helper_writes_no_spawn_record(shared_folder: Path) -> None:
    """The production spawner with the cancel grace: the burst of cancelled quick reads keeps
    alice's workers, so the policy process is asked for none and audits no ``spawn``."""
    target = shared_folder / "f.txt"
    target.write_text("x\n" * 1000)
    target.chmod(0o644)
    with privsep_with(dict(WORKERS, cancel_grace_seconds=GRACE)) as (d, metrics):
        async with SseSession(cast(Daemon, _Front(d))) as s:
            await s.initialize("2025-03-26")  # (its batches end with 2025-06-18)
            since = len(d.audit_path.read_text().splitlines())
            await cancelled_reads_keep_their_workers(s, metrics, target)
            assert audit_spawns(d.audit_path, "alice", since) == BURST  # the warm-up's, and no more


@pytest.mark.root
def test_spawn_requests_straight_to_the_helper_socket_are_bounded_per_principal(
        privsep_churned: tuple[PrivsepDaemon, Metrics]) -> None:
    """A compromised front (code running as the service user) asks the policy process for bob's
    workers in a loop: it gets at most twice the front's burst, then RATE_LIMITED, and the
    refusals write no audit record each."""
    d, _ = privsep_churned
    since = len(d.audit_path.read_text().splitlines())
    asks = 3 * BURST + 4
    replies = as_front(d, [{"type": "spawn_worker", "id": i, "token": d.tokens["bob"]} for i in range(asks)])
    assert len(replies) == asks and not any(r.get("closed") for r in replies), replies
    started = [r for r in replies if r.get("ok")]
    refused = [r["error"] for r in replies if not r.get("ok")]
    assert 1 <= len(started) <= 2 * BURST, replies
    assert refused and all(e["code"] == "RATE_LIMITED" and e["details"]["retry_after_seconds"] > 0 for e in refused)
    assert audit_spawns(d.audit_path, "bob", since) == len(started)
    lines = d.audit_path.read_text().splitlines()[since:]
    assert len(lines) <= 3 * len(started) + 2, lines  # spawn, exit/kill per worker; nothing per refusal
