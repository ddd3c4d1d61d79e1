"""Worker processes and the worker pool, with real processes and real sockets (docs/PRIVSEP.md, the workers).

Rules covered (docs/REFERENCE.md): §2.5 TIMEOUT (a hung worker is killed, reaped, replaced; the call answers
TIMEOUT), §1.5 (a slow or hung request never delays another request or account), §1.4 (a
cancelled request stops its worker job), §3 (the read result comes back through the pool).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from mcpd.common import config, frames, identity
from mcpd.front.workers.pool import WorkerPool
from mcpd.front.workers.spawner import LocalSpawner
from mcpd.helper.wire import errors
from mcpd.helper.wire.errors import ToolError
from tests.support.workers import slow_file

HUNG_TIMEOUT = 1.0  # seconds: the deadline used for calls that are meant to hit a stopped worker


def make_cfg(per_account: int = 2, max_accounts: int = 4, timeout: float = 20.0) -> config.Config:
    return config.from_dict(
        {"workers": {"per_account": per_account, "max_accounts": max_accounts, "timeout_seconds": timeout}}
    )


@asynccontextmanager
async def open_pool(cfg: config.Config) -> AsyncIterator[tuple[WorkerPool, LocalSpawner]]:
    spawner = LocalSpawner(cfg.read)
    pool = WorkerPool(spawner, cfg)
    try:
        yield pool, spawner
    finally:
        await pool.close()


async def eventually(predicate: Callable[[], bool], what: str, tries: int = 1000) -> None:
    """Wait (up to ~10 s, not a timing assertion) until ``predicate()`` holds."""
    for _ in range(tries):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def is_reaped(pid: int) -> bool:
    """True once ``pid`` is neither running nor a zombie child of this process."""
    return not Path(f"/proc/{pid}").exists()


def children() -> set[int]:
    """This process's children, over all its threads (a thread that ends meanwhile has none)."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            text = (task / "children").read_text()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended while we looked
            continue
        pids.update(int(p) for p in text.split())
    return pids


def read_args(path: Path) -> dict[str, Any]:
    return {"path": str(path)}


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    p = tmp_path / "sample.txt"
    p.write_bytes(b"alpha\nbeta\r\ngamma")
    return p


async def warm(pool: WorkerPool, user: str, sample: Path, n: int) -> list[int]:
    """Make ``user`` have ``n`` live idle workers (n concurrent calls); return their pids."""
    await asyncio.gather(*(pool.call(user, "files/read", read_args(sample)) for _ in range(n)))
    pids = list(pool.workers(user))
    if len(pids) != n:
        raise AssertionError(f"expected {n} workers, got {pids}")
    return pids


# --------------------------------------------------------------------------- results


def test_call_returns_read_result(sample: Path) -> None:
    async def main() -> None:
        async with open_pool(make_cfg()) as (pool, _):
            result = await pool.call("nobody-in-dev", "files/read", read_args(sample))
            assert result["text"] == "alpha\nbeta\r\ngamma"

    asyncio.run(main())


def test_worker_error_becomes_tool_error_and_worker_is_kept(tmp_path: Path, sample: Path) -> None:
    async def main() -> None:
        async with open_pool(make_cfg(per_account=1)) as (pool, _):
            with pytest.raises(ToolError) as err:
                await pool.call("u", "files/read", read_args(tmp_path / "missing"))
            assert err.value.code == errors.FILE_NOT_FOUND
            (pid,) = pool.workers("u")
            await pool.call("u", "files/read", read_args(sample))
            assert list(pool.workers("u")) == [pid]

    asyncio.run(main())


def test_workers_are_reused_and_bounded_per_account(sample: Path) -> None:
    async def main() -> None:
        async with open_pool(make_cfg(per_account=3)) as (pool, spawner):
            seen: set[int] = set()
            for _ in range(5):
                results = await asyncio.gather(*(pool.call("u", "files/read", read_args(sample)) for _ in range(6)))
                assert all(r["text"] == "alpha\nbeta\r\ngamma" for r in results)
                seen.update(pool.workers("u"))
            assert len(seen) <= 3
            assert len(spawner.live_pids()) <= 3

    asyncio.run(main())


def test_parallel_calls_on_all_workers_are_all_answered(tmp_path: Path) -> None:
    files = []
    for i in range(16):
        p = tmp_path / f"f{i}.txt"
        p.write_text(f"file {i}\n")
        files.append(p)

    async def main() -> None:
        async with open_pool(make_cfg(per_account=4, max_accounts=2)) as (pool, _):
            calls = [pool.call(f"user{i % 2}", "files/read", read_args(p)) for i, p in enumerate(files)]
            results = await asyncio.gather(*calls)
            assert [r["text"] for r in results] == [f"file {i}\n" for i in range(16)]
            assert 1 <= len(pool.workers("user0")) <= 4

    asyncio.run(main())


def test_request_over_64k_is_invalid_argument_without_a_worker() -> None:
    async def main() -> None:
        async with open_pool(make_cfg()) as (pool, spawner):
            with pytest.raises(ToolError) as err:
                await pool.call("u", "files/read", {"path": "/" + "a" * (70 * 1024)})
            assert err.value.code == errors.INVALID_ARGUMENT
            assert spawner.live_pids() == []

    asyncio.run(main())


# --------------------------------------------------------------------------- docs/REFERENCE.md §2.5 TIMEOUT, §1.5


def test_timeout_hung_worker_is_killed_reaped_and_replaced(sample: Path) -> None:
    async def main() -> None:
        async with open_pool(make_cfg(per_account=2)) as (pool, spawner):
            hung, healthy = await warm(pool, "u", sample, 2)
            await warm(pool, "other", sample, 1)
            os.kill(hung, signal.SIGSTOP)
            outcomes = await asyncio.gather(
                pool.call("u", "files/read", read_args(sample), timeout=HUNG_TIMEOUT),
                pool.call("u", "files/read", read_args(sample), timeout=HUNG_TIMEOUT),
                pool.call("other", "files/read", read_args(sample)),
                return_exceptions=True,
            )
            timeouts = [o for o in outcomes if isinstance(o, ToolError)]
            answers = [o for o in outcomes if isinstance(o, dict)]
            assert len(timeouts) == 1 and timeouts[0].code == errors.TIMEOUT
            assert len(answers) == 2
            assert hung not in pool.workers("u")
            await eventually(lambda: hung not in spawner.live_pids() and is_reaped(hung), "hung worker reaped")
            await asyncio.gather(*(pool.call("u", "files/read", read_args(sample)) for _ in range(2)))
            workers = pool.workers("u")
            assert healthy in workers and len(workers) == 2 and hung not in workers

    asyncio.run(main())


def test_timeout_when_all_workers_stay_busy_queue_is_bounded(sample: Path) -> None:
    async def main() -> None:
        async with open_pool(make_cfg(per_account=1)) as (pool, _):
            (pid,) = await warm(pool, "u", sample, 1)
            os.kill(pid, signal.SIGSTOP)
            first = asyncio.create_task(pool.call("u", "files/read", read_args(sample), timeout=30))
            await eventually(lambda: pool.workers("u") == {pid: True}, "worker busy")
            with pytest.raises(ToolError) as err:
                await pool.call("u", "files/read", read_args(sample), timeout=HUNG_TIMEOUT)
            assert err.value.code == errors.TIMEOUT
            assert pool.workers("u") == {pid: True}  # the queued call did not touch the busy worker
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            await eventually(lambda: is_reaped(pid), "worker reaped")

    asyncio.run(main())


def test_crashed_worker_fails_only_its_request(sample: Path) -> None:
    async def main() -> None:
        async with open_pool(make_cfg(per_account=2)) as (pool, spawner):
            victim, survivor = await warm(pool, "u", sample, 2)
            os.kill(victim, signal.SIGSTOP)
            calls = [asyncio.create_task(pool.call("u", "files/read", read_args(sample))) for _ in range(2)]
            done, pending = await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1 and done.pop().result()["text"] == "alpha\nbeta\r\ngamma"
            os.kill(victim, signal.SIGKILL)
            with pytest.raises(ToolError) as err:
                await pending.pop()
            assert err.value.code == errors.INTERNAL_ERROR and err.value.message == "worker crashed"
            await eventually(lambda: is_reaped(victim), "crashed worker reaped")
            assert victim not in spawner.live_pids()
            results = await asyncio.gather(*(pool.call("u", "files/read", read_args(sample)) for _ in range(2)))
            assert all(r["text"] == "alpha\nbeta\r\ngamma" for r in results)
            assert survivor in pool.workers("u") and victim not in pool.workers("u")

    asyncio.run(main())


def test_worker_that_died_while_idle_is_replaced_without_failing_a_call(sample: Path) -> None:
    async def main() -> None:
        async with open_pool(make_cfg(per_account=1)) as (pool, spawner):
            (pid,) = await warm(pool, "u", sample, 1)
            os.kill(pid, signal.SIGKILL)
            await eventually(lambda: pid not in spawner.live_pids(), "dead idle worker reaped")
            result = await pool.call("u", "files/read", read_args(sample))
            assert result["text"] == "alpha\nbeta\r\ngamma"
            assert pid not in pool.workers("u")

    asyncio.run(main())


# --------------------------------------------------------------------------- docs/REFERENCE.md §1.4 cancellation


def test_cancelled_call_kills_its_worker_and_pool_keeps_serving(sample: Path) -> None:
    async def main() -> None:
        async with open_pool(make_cfg(per_account=1)) as (pool, spawner):
            (pid,) = await warm(pool, "u", sample, 1)
            os.kill(pid, signal.SIGSTOP)
            task = asyncio.create_task(pool.call("u", "files/read", read_args(sample)))
            await eventually(lambda: pool.workers("u") == {pid: True}, "worker busy")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await eventually(lambda: is_reaped(pid), "cancelled worker reaped")
            result = await pool.call("u", "files/read", read_args(sample))
            assert result["text"] == "alpha\nbeta\r\ngamma"
            assert pid not in pool.workers("u") and len(pool.workers("u")) == 1

    asyncio.run(main())


def grace_cfg(grace: float, per_account: int = 1, **workers: Any) -> config.Config:
    """A pool config with ``workers.cancel_grace_seconds = grace`` and a spawn bucket that does not
    refill during a test (``spawn_burst = per_account``)."""
    return config.from_dict({"workers": {"per_account": per_account, "spawn_burst": per_account,
                                         "spawns_per_second": 0.001, "timeout_seconds": 20,
                                         "cancel_grace_seconds": grace, **workers}})


def test_a_burst_of_cancelled_quick_reads_keeps_its_workers_and_is_never_rate_limited(sample: Path) -> None:
    """docs/REFERENCE.md §1.4 with the cancel grace: 40 quick reads, each cancelled as soon as it is sent (a client
    that searches as the user types), finish within the grace; their replies are discarded and their
    workers kept, so no call needs a worker past the account's first ones and none is RATE_LIMITED
    (with ``cancel_grace_seconds: 0`` each cancel kills a worker and the bucket runs dry)."""
    async def main() -> None:
        async with open_pool(grace_cfg(5.0, per_account=4)) as (pool, spawner):
            started = recording_spawner(spawner)
            await asyncio.gather(*(pool.call("u", "files/read", read_args(sample), owner="alice") for _ in range(4)))
            assert len(started) == 4  # the account's first workers: the whole burst
            outcomes: list[BaseException | dict[str, Any]] = []
            for _ in range(40):
                task = asyncio.create_task(pool.call("u", "files/read", read_args(sample), owner="alice"))
                for _ in range(2):  # the request is in the worker's socket after the first step
                    await asyncio.sleep(0)
                task.cancel()
                try:
                    outcomes.append(await task)
                except BaseException as exc:  # noqa: BLE001 - collected and checked below
                    outcomes.append(exc)
            errors_seen = [o for o in outcomes if isinstance(o, ToolError)]
            assert not errors_seen, errors_seen
            assert any(isinstance(o, asyncio.CancelledError) for o in outcomes)
            assert all(isinstance(o, asyncio.CancelledError) or o["text"] == "alpha\nbeta\r\ngamma"
                       for o in outcomes)
            assert len(started) == 4, started  # no worker past the account's first ones
            await eventually(lambda: not any(pool.workers("alice\nu").values()), "every grace over")
            assert set(pool.workers("alice\nu")) <= set(started)
            result = await pool.call("u", "files/read", read_args(sample), owner="alice")
            assert result["text"] == "alpha\nbeta\r\ngamma" and len(started) == 4

    asyncio.run(main())


def test_a_cancelled_slow_read_is_killed_when_its_grace_runs_out(tmp_path: Path, sample: Path) -> None:
    """docs/REFERENCE.md §1.4: the job is stopped: a read that is still running when the grace ends is killed
    and reaped (its worker pid is gone), and the next call gets a new worker."""
    slow = slow_file(tmp_path)  # reading its line 3 keeps a worker busy until killed

    async def main() -> None:
        async with open_pool(grace_cfg(1.0, per_account=2)) as (pool, _):
            (pid,) = await warm(pool, "u", sample, 1)
            task = asyncio.create_task(pool.call("u", "files/read", {"path": str(slow), "start_line": 3}))
            await eventually(lambda: pool.workers("u") == {pid: True}, "slow read running")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task  # the caller is let go at once ...
            assert pool.workers("u") == {pid: True}  # ... while its worker is in its grace
            await eventually(lambda: is_reaped(pid), "worker killed after its grace")
            assert pid not in pool.workers("u")
            result = await pool.call("u", "files/read", read_args(sample))
            assert result["text"] == "alpha\nbeta\r\ngamma" and pid not in pool.workers("u")

    asyncio.run(main())


def test_after_a_discarded_reply_the_same_worker_answers_the_next_call_with_its_own_result(tmp_path: Path) -> None:
    """The cancelled call's reply is read and thrown away before its worker serves anyone else: the
    next call, queued meanwhile, waits for it, then runs on that same worker and gets its own file's
    text, never the cancelled call's."""
    old, new = tmp_path / "old.txt", tmp_path / "new.txt"
    old.write_text("the cancelled call's text\n")
    new.write_text("the next call's text\n")

    async def main() -> None:
        async with open_pool(grace_cfg(10.0)) as (pool, spawner):
            (pid,) = await warm(pool, "u", new, 1)
            started = recording_spawner(spawner)
            os.kill(pid, signal.SIGSTOP)  # the worker takes the request but cannot answer yet
            cancelled = asyncio.create_task(pool.call("u", "files/read", read_args(old)))
            await eventually(lambda: pool.workers("u") == {pid: True}, "worker busy")
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            nxt = asyncio.create_task(pool.call("u", "files/read", read_args(new)))
            for _ in range(20):
                await asyncio.sleep(0.01)
            assert not nxt.done() and pool.workers("u") == {pid: True}  # held: the old reply is unread
            os.kill(pid, signal.SIGCONT)
            assert (await nxt)["text"] == "the next call's text\n"
            assert (await pool.call("u", "files/read", read_args(old)))["text"] == "the cancelled call's text\n"
            assert list(pool.workers("u")) == [pid] and not started  # kept: no new worker

    asyncio.run(main())


def test_a_worker_in_its_grace_still_counts_as_a_call_of_its_principal(sample: Path) -> None:
    """Cancelling gets no more work run at once: while the cancelled call's worker is in its grace
    it holds its slot and counts against ``max_calls_per_principal``."""
    cfg = dataclasses.replace(grace_cfg(10.0), max_calls_per_principal=1)

    async def main() -> None:
        async with open_pool(cfg) as (pool, _):
            await pool.call("u", "files/read", read_args(sample), owner="alice")
            (pid,) = pool.workers("alice\nu")
            os.kill(pid, signal.SIGSTOP)
            task = asyncio.create_task(pool.call("u", "files/read", read_args(sample), owner="alice"))
            await eventually(lambda: pool.workers("alice\nu") == {pid: True}, "worker busy")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(ToolError) as err:
                await pool.call("u", "files/read", read_args(sample), owner="alice")
            assert err.value.code == errors.RATE_LIMITED and err.value.details["limit"] == 1
            os.kill(pid, signal.SIGCONT)
            await eventually(lambda: pool.workers("alice\nu") == {pid: False}, "grace over, worker kept")
            result = await pool.call("u", "files/read", read_args(sample), owner="alice")
            assert result["text"] == "alpha\nbeta\r\ngamma" and list(pool.workers("alice\nu")) == [pid]

    asyncio.run(main())


def test_no_grace_for_a_granted_call_a_revoked_principal_or_a_zero_setting(sample: Path) -> None:
    """A cancelled call's worker is killed at once (no grace) when the call is a privileged one
    (the root helper may still be handing the worker its job), when its principal was revoked while
    the call ran (its workers must not outlive the token), and with ``cancel_grace_seconds: 0``."""
    async def never_granted(pool: WorkerPool, owner: str) -> None:  # the privileged route: its grant never comes
        async with pool.lease("u", "files/read", read_args(sample), token="", owner=owner, timeout=60.0):
            await asyncio.Event().wait()

    async def cancelled_kills_at_once(pool: WorkerPool, key: str, owner: str | None, revoke: bool = False,
                                      granted: bool = False) -> None:
        (pid,) = pool.workers(key)
        os.kill(pid, signal.SIGSTOP)
        assert owner is not None or not granted
        call = never_granted(pool, owner) if owner is not None and granted else \
            pool.call("u", "files/read", read_args(sample), owner=owner)
        task = asyncio.create_task(call)
        await eventually(lambda: pool.workers(key) == {pid: True}, "worker busy")
        if revoke:
            assert pool.retire_owner("alice") == 0  # busy: not retired now, but not kept either
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pid not in pool.workers(key)  # retired at once, no grace
        await eventually(lambda: is_reaped(pid), "worker killed")
        await pool.call("u", "files/read", read_args(sample), owner=owner)

    async def main() -> None:
        async with open_pool(grace_cfg(10.0, per_account=1, spawn_burst=8)) as (pool, _):
            await pool.call("u", "files/read", read_args(sample), owner="alice")
            await cancelled_kills_at_once(pool, "alice\nu", "alice", granted=True)
            await cancelled_kills_at_once(pool, "alice\nu", "alice", revoke=True)
        async with open_pool(grace_cfg(0.0, spawn_burst=8)) as (pool, _):
            await pool.call("u", "files/read", read_args(sample))
            await cancelled_kills_at_once(pool, "u", None)

    asyncio.run(main())


# --------------------------------------------------------------------------- the privileged route's lease


def test_a_lent_worker_is_kept_after_a_decided_refusal_and_killed_after_any_other_ending(sample: Path) -> None:
    """``WorkerPool.lease`` lends a worker of the principal's to a privileged call, whose backend has
    the policy process hand it the job: a refusal decided before the worker was touched gives the
    worker back; any other failure, and a lease left without reading the reply, kill it (its job may
    still be on its way)."""
    decided = frozenset({errors.PERMISSION_DENIED})

    async def lent(pool: WorkerPool, code: str | None) -> int:
        async with pool.lease("u", "files/read", read_args(sample), token="", owner="alice", timeout=20.0,
                              decided=decided) as worker:
            assert worker.rid >= 1 and pool.workers("alice\nu") == {worker.pid: True}
            if code is not None:
                raise ToolError(code, "refused")
            return worker.pid

    async def main() -> None:
        async with open_pool(make_cfg(per_account=1)) as (pool, _):
            await pool.call("u", "files/read", read_args(sample), owner="alice")
            (pid,) = pool.workers("alice\nu")
            with pytest.raises(ToolError) as err:
                await lent(pool, errors.PERMISSION_DENIED)
            assert err.value.code == errors.PERMISSION_DENIED and pool.workers("alice\nu") == {pid: False}
            with pytest.raises(ToolError) as err:
                await lent(pool, errors.HELPER_UNAVAILABLE)  # the policy process went away mid-call
            assert err.value.code == errors.HELPER_UNAVAILABLE and pool.workers("alice\nu") == {}
            await eventually(lambda: is_reaped(pid), "worker killed")
            again = await lent(pool, None)  # a new worker, left without its reply
            assert again != pid and pool.workers("alice\nu") == {}
            await eventually(lambda: is_reaped(again), "worker killed")
            assert (await pool.call("u", "files/read", read_args(sample), owner="alice"))["text"] == "alpha\nbeta\r\ngamma"

    asyncio.run(main())


def test_a_lease_past_its_time_ends_timeout_and_is_not_a_call_of_the_principal(sample: Path) -> None:
    """The lease's time bounds its body too (a grant that never comes ends ``TIMEOUT``, its worker
    killed), and a lease is not counted against ``max_calls_per_principal`` (the privileged backend
    bounds privileged calls itself)."""
    cfg = dataclasses.replace(make_cfg(per_account=2), max_calls_per_principal=1)

    async def main() -> None:
        async with open_pool(cfg) as (pool, _):
            with pytest.raises(ToolError) as err:
                async with pool.lease("u", "files/read", read_args(sample), token="", owner="alice",
                                      timeout=HUNG_TIMEOUT) as worker:
                    pid = worker.pid
                    await asyncio.Event().wait()
            assert err.value.code == errors.TIMEOUT and pid not in pool.workers("alice\nu")
            await eventually(lambda: is_reaped(pid), "worker killed")
            async with pool.lease("u", "files/read", read_args(sample), token="", owner="alice", timeout=20.0):
                result = await pool.call("u", "files/read", read_args(sample), owner="alice")
                assert result["text"] == "alpha\nbeta\r\ngamma"

    asyncio.run(main())


# --------------------------------------------------------------------------- accounts, leaks, close


def test_max_accounts_evicts_least_recently_used_idle_account(sample: Path) -> None:
    async def main() -> None:
        async with open_pool(make_cfg(per_account=1, max_accounts=2)) as (pool, _):
            (a,) = await warm(pool, "a", sample, 1)
            await warm(pool, "b", sample, 1)
            await pool.call("a", "files/read", read_args(sample))  # b is now least recently used
            (b,) = pool.workers("b")
            await pool.call("c", "files/read", read_args(sample))
            assert pool.workers("b") == {}
            assert list(pool.workers("a")) == [a]
            await eventually(lambda: is_reaped(b), "evicted worker reaped")

    asyncio.run(main())


def test_no_leaked_fds_or_zombies_after_many_calls_and_close(tmp_path: Path, sample: Path) -> None:
    fds_before = set(os.listdir("/proc/self/fd"))
    children_before = children()

    async def main() -> None:
        async with open_pool(make_cfg(per_account=2, max_accounts=2)) as (pool, spawner):
            for round_ in range(10):
                users = ["a", "b", "c"][round_ % 3 :] + ["a"]
                await asyncio.gather(*(pool.call(u, "files/read", read_args(sample)) for u in users))
                with pytest.raises(ToolError):
                    await pool.call("a", "files/read", read_args(tmp_path / "nope"))
            (pid, *_) = pool.workers("a")
            os.kill(pid, signal.SIGSTOP)
            await asyncio.gather(
                *(pool.call("a", "files/read", read_args(sample), timeout=HUNG_TIMEOUT) for _ in range(2)),
                return_exceptions=True,
            )
            assert pool.workers("a") or pool.workers("b") or pool.workers("c")
        assert spawner.live_pids() == []
        with pytest.raises(ToolError):
            await pool.call("a", "files/read", read_args(sample))

    asyncio.run(main())
    assert children() <= children_before
    assert set(os.listdir("/proc/self/fd")) == fds_before


def test_close_kills_workers_with_calls_in_flight(sample: Path) -> None:
    children_before = children()

    async def main() -> None:
        pool = WorkerPool(LocalSpawner(config.ReadLimits()), make_cfg(per_account=1))
        (pid,) = await warm(pool, "u", sample, 1)
        os.kill(pid, signal.SIGSTOP)
        task = asyncio.create_task(pool.call("u", "files/read", read_args(sample)))
        await eventually(lambda: pool.workers("u") == {pid: True}, "worker busy")
        await pool.close()
        with pytest.raises(ToolError):
            await task
        assert is_reaped(pid)

    asyncio.run(main())
    assert children() <= children_before


def test_close_while_a_worker_is_starting_leaves_no_process(sample: Path) -> None:
    children_before = children()

    async def main() -> None:
        spawner = LocalSpawner(config.ReadLimits())
        pool = WorkerPool(spawner, make_cfg(per_account=1))
        task = asyncio.create_task(pool.call("u", "files/read", read_args(sample)))
        for _ in range(1000):  # single loop steps: stop while the worker is spawned but not connected
            await asyncio.sleep(0)
            if spawner.live_pids():
                break
        assert pool.workers("u") == {}  # started, not yet connected to the pool
        await pool.close()
        assert spawner.live_pids() == []
        assert task.done()
        with pytest.raises(ToolError):
            task.result()

    asyncio.run(main())
    assert children() <= children_before


# --------------------------------------------------------------------------- the worker process


def test_worker_inherits_only_its_socket_and_no_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MCPD_TEST_SECRET", "s3cret-value")
    key = tmp_path / "server.key"
    key.write_text("PRIVATE KEY")

    async def main() -> None:
        spawner = LocalSpawner(config.ReadLimits())
        fd = os.open(key, os.O_RDONLY)
        os.set_inheritable(fd, True)  # even a descriptor left inheritable by mistake stays home
        try:
            front, pid = await spawner.spawn("u")
        finally:
            os.close(fd)
        with front:
            frames.send_frame(front, {"id": 1, "op": "files/read", "args": {"path": str(key)}})
            reply = await asyncio.to_thread(frames.recv_frame, front, 1 << 20)
            assert reply is not None and reply["id"] == 1
            fds = {int(n): os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}
            sockets = [n for n, target in fds.items() if target.startswith("socket:")]
            assert len(sockets) == 1 and set(fds) == {0, 1, 2, *sockets}
            assert fds[0] == fds[1] == "/dev/null"
            assert str(key) not in fds.values()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            assert b"MCPD_TEST_SECRET" not in environ and b"s3cret" not in environ
            assert os.readlink(f"/proc/{pid}/cwd") == "/"
            status = Path(f"/proc/{pid}/status").read_text()
            assert "NoNewPrivs:\t1" in status
            # its wake-ups do not preempt the front (the same share of the CPU: nice unchanged)
            assert os.sched_getscheduler(pid) == os.SCHED_BATCH and os.getpriority(os.PRIO_PROCESS, pid) == 0
            await spawner.kill(pid)
        assert spawner.live_pids() == [] and is_reaped(pid)

    asyncio.run(main())


def test_worker_exits_when_socket_closes() -> None:
    async def main() -> None:
        spawner = LocalSpawner(config.ReadLimits())
        front, pid = await spawner.spawn("u")
        front.close()
        await eventually(lambda: pid not in spawner.live_pids(), "worker exited on EOF")
        assert is_reaped(pid)

    asyncio.run(main())


def test_worker_drops_oversized_request_frame() -> None:
    async def main() -> None:
        spawner = LocalSpawner(config.ReadLimits())
        front, pid = await spawner.spawn("u")
        with front:
            front.sendall(struct.pack("!I", 1 << 30))  # announces 1 GiB: refused before any read
            data = await asyncio.to_thread(front.recv, 16)
            assert data == b""
        await eventually(lambda: pid not in spawner.live_pids(), "worker exited")

    asyncio.run(main())


def test_requests_split_across_writes_or_sent_together_are_each_answered_in_order(sample: Path) -> None:
    """The worker reads what arrives and takes whole frames out of it: a request cut in pieces
    is answered once complete, and two sent in one write are both answered, in order."""
    def request(rid: int) -> bytes:
        return frames.encode({"id": rid, "op": "files/read", "args": {"path": str(sample)}})

    def replies(sock: socket.socket, count: int) -> list[int]:
        buf, got = bytearray(), []
        while len(got) < count:
            chunk = sock.recv(65536)
            assert chunk, "the worker closed the connection"
            buf += chunk
            while (body := frames.take_frame(buf, 1 << 20)) is not None:
                reply = frames.decode_body(body)
                if reply.get("text_frame"):
                    while frames.take_frame(buf, 1 << 20) is None:
                        buf += sock.recv(65536)
                assert reply["ok"] is True, reply
                got.append(reply["id"])
        return got

    async def main() -> None:
        spawner = LocalSpawner(config.ReadLimits())
        front, pid = await spawner.spawn("u")
        with front:
            data = request(1)
            for i in range(len(data)):  # one byte at a time
                front.sendall(data[i:i + 1])
            assert await asyncio.to_thread(replies, front, 1) == [1]
            front.sendall(request(2) + request(3))
            assert await asyncio.to_thread(replies, front, 2) == [2, 3]
        await eventually(lambda: pid not in spawner.live_pids(), "worker exited")

    asyncio.run(main())


def test_a_request_the_front_never_finishes_does_not_hold_up_a_granted_call(tmp_path: Path) -> None:
    """Half a request frame on the front's socket (a slow or hostile front) leaves the worker free
    to run a call the root helper granted on its ctl socket; the half request is answered once
    its last byte comes."""
    import fcntl
    import termios
    import threading
    import time

    from mcpd.core import fileopen, ops
    from mcpd.worker.main import serve

    def raw_frame(sock: socket.socket) -> bytes:
        (n,) = struct.unpack("!I", sock.recv(4, socket.MSG_WAITALL))
        return sock.recv(n, socket.MSG_WAITALL)

    def reply_and_text(sock: socket.socket) -> tuple[int, str]:
        reply = frames.decode_body(raw_frame(sock))
        assert reply["ok"] is True and reply["text_frame"] is True, reply
        return reply["id"], raw_frame(sock).decode()

    secret = tmp_path / "granted.txt"
    secret.write_text("granted bytes")
    front, worker_end = socket.socketpair()
    helper, worker_ctl = socket.socketpair()
    ctx = ops.OpContext(limits=config.ReadLimits(), open_file=fileopen.open_regular, open_dir=fileopen.open_directory)
    thread = threading.Thread(target=serve, args=(worker_end, ctx, worker_ctl), daemon=True)
    thread.start()
    try:
        front.settimeout(10)
        helper.settimeout(10)
        request = frames.encode({"id": 1, "op": "files/read", "args": {"path": str(secret)}})
        front.sendall(request[:7])  # the header and a few bytes of the body, then nothing
        for _ in range(1000):  # until the worker has read them (none left queued on its end)
            if struct.unpack("i", fcntl.ioctl(worker_end, termios.FIONREAD, b"\0\0\0\0"))[0] == 0:
                break
            time.sleep(0.005)
        fd = os.open(secret, os.O_RDONLY)
        try:
            frames.send_frame(helper, {"id": 2, "op": "files/read", "args": {"path": str(secret)}}, [fd])
        finally:
            os.close(fd)
        assert frames.recv_frame(helper, 4096) == {"id": 2, "code": None, "bytes": 13}
        assert reply_and_text(front) == (2, "granted bytes")
        front.sendall(request[7:])
        assert reply_and_text(front) == (1, "granted bytes")
    finally:
        front.close()
        helper.close()
        thread.join(10)
        worker_end.close()
        worker_ctl.close()
    assert not thread.is_alive()


def test_worker_refuses_a_descriptor_that_is_not_a_socket() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mcpd.worker", "--fd", "0", "--parent", str(os.getpid())],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert b"bad arguments" in proc.stderr or b"not a Unix stream socket" in proc.stderr


def test_a_worker_whose_starter_dies_while_it_starts_exits_without_serving() -> None:
    """No worker outlives whoever started it, even when the starter dies before the worker's
    interpreter is up (before its parent-death signal is set): the worker compares its parent
    with the pid its starter gave it, finds another one, and exits without serving the request
    already waiting on its socket."""
    front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    frames.send_frame(front, {"id": 1, "op": "files/read", "args": {"path": "/etc/hostname"}})
    starter = ("import os, subprocess, sys; fd = int(sys.argv[1]); "
               "subprocess.Popen([sys.executable, '-I', '-m', 'mcpd.worker', '--fd', str(fd), '--parent', "
               "str(os.getpid())], pass_fds=(fd,), stdin=subprocess.DEVNULL); os._exit(0)")
    subprocess.run([sys.executable, "-c", starter, str(back.fileno())], pass_fds=(back.fileno(),), timeout=60,
                   check=True)
    back.close()
    front.settimeout(60)
    with front:
        try:
            answer = front.recv(4096)
        except ConnectionResetError:  # it exited with the request unread
            answer = b""
        assert answer == b"", "the orphaned worker served a request"


def test_worker_refuses_an_inet_socket() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        proc = subprocess.run(
            [sys.executable, "-m", "mcpd.worker", "--fd", str(s.fileno()), "--parent", str(os.getpid())],
            pass_fds=(s.fileno(),),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
        )
    assert proc.returncode == 2


def test_limits_reach_the_worker(tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_text("x" * 300 + "\n")
    cfg = dataclasses.replace(make_cfg(), read=config.ReadLimits(default_bytes=100, response_cap=200))

    async def main() -> None:
        async with open_pool(cfg) as (pool, _):
            with pytest.raises(ToolError) as err:
                await pool.call("u", "files/read", {"path": str(big), "limit": 250})
            assert err.value.code == errors.FILE_TOO_LARGE

    asyncio.run(main())




# --------------------------------------------------------------------------- workers started per principal


def test_cancelled_calls_start_workers_only_within_the_principals_bucket(tmp_path: Path, sample: Path) -> None:
    """Each cancelled call kills its worker; the calls that need a new one past the principal's
    spawn_burst are RATE_LIMITED (nothing started), while reusing an idle worker costs nothing and
    another principal still gets workers."""
    slow = slow_file(tmp_path)  # reading its line 3 keeps a worker busy until killed
    cfg = config.from_dict({"workers": {"per_account": 1, "spawn_burst": 3, "spawns_per_second": 0.001,
                                        "timeout_seconds": 20}})

    async def main() -> None:
        async with open_pool(cfg) as (pool, spawner):
            started = recording_spawner(spawner)
            for _ in range(20):  # one worker, reused: one start
                await pool.call("u", "files/read", read_args(sample), owner="alice")
            assert len(started) == 1
            refusals = []
            for _ in range(6):
                task = asyncio.create_task(pool.call("u", "files/read", {"path": str(slow), "start_line": 3},
                                                     owner="alice"))
                await eventually(lambda: task.done() or any(pool.workers("alice\nu").values()), "call running")
                if task.done():
                    refusals.append(task.exception())
                    continue
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await eventually(lambda: not pool.workers("alice\nu"), "cancelled worker gone")
            assert len(started) == 3  # the burst, and no more
            # the first cancelled call ran on the idle worker, the next two started the rest of the burst
            assert len(refusals) == 3 and all(isinstance(e, ToolError) and e.code == errors.RATE_LIMITED
                                              for e in refusals)
            assert refusals[0].details["limit"] == 3 and refusals[0].details["retry_after_seconds"] > 0
            result = await pool.call("u", "files/read", read_args(sample), owner="bob")  # bob has his own bucket
            assert result["text"] == "alpha\nbeta\r\ngamma" and len(started) == 4

    asyncio.run(main())


# --------------------------------------------------------------------------- workers per token


def recording_spawner(spawner: LocalSpawner) -> dict[int, str]:
    """Make ``spawner`` note the token each worker was started with: ``{pid: token}``."""
    spawned: dict[int, str] = {}
    real_spawn = spawner.spawn

    async def spawn(os_user: str, token: str = "") -> tuple[socket.socket, int]:
        sock, pid = await real_spawn(os_user, token)
        spawned[pid] = token
        return sock, pid

    spawner.spawn = spawn  # type: ignore[method-assign]
    return spawned


def test_a_call_runs_only_on_a_worker_its_own_token_spawned(tmp_path: Path, sample: Path) -> None:
    """docs/REFERENCE.md §5.3 (a logout ends its token's workers; the principal's other tokens go on working):
    the policy process kills a worker once its token stops authenticating, so a call of token B
    never runs on the idle worker token A spawned; it gets a worker of its own, and A's stays."""
    slow = slow_file(tmp_path)  # reading its line 3 keeps a worker busy until killed
    a, b = identity.new_token()[0], identity.new_token()[0]

    async def main() -> None:
        async with open_pool(make_cfg(per_account=2)) as (pool, spawner):
            spawned = recording_spawner(spawner)
            await pool.call("u", "files/read", read_args(sample), token=a, owner="alice")
            (pid_a,) = spawned
            task = asyncio.create_task(pool.call("u", "files/read", {"path": str(slow), "start_line": 3},
                                                 token=b, owner="alice"))
            await eventually(lambda: task.done() or any(pool.workers("alice\nu").values()), "B's call running")
            assert not task.done(), task
            (busy,) = [pid for pid, on in pool.workers("alice\nu").items() if on]
            assert busy != pid_a and spawned[busy] == b
            assert pool.workers("alice\nu")[pid_a] is False  # A's worker idle, untouched
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await eventually(lambda: busy not in pool.workers("alice\nu"), "B's worker killed after its cancel grace")
            await pool.call("u", "files/read", read_args(sample), token=a, owner="alice")
            assert list(pool.workers("alice\nu")) == [pid_a] and len(spawned) == 2  # A's reused

    asyncio.run(main())


def test_a_principal_at_its_cap_with_only_other_tokens_idle_workers_is_served(sample: Path) -> None:
    """The bound of ``per_account`` workers per principal holds whichever tokens spawned them:
    when it is reached and the calling token has no idle worker, the least recently used idle
    worker of another token is retired and one is started for the caller, which is served."""
    a, b, c = (identity.new_token()[0] for _ in range(3))

    async def main() -> None:
        async with open_pool(make_cfg(per_account=2)) as (pool, spawner):
            spawned = recording_spawner(spawner)
            for token in (a, b, a):
                result = await pool.call("u", "files/read", read_args(sample), token=token, owner="alice")
                assert result["text"] == "alpha\nbeta\r\ngamma"
            pid_a, pid_b = spawned
            assert sorted(pool.workers("alice\nu")) == sorted(spawned)  # at the cap, both idle
            result = await pool.call("u", "files/read", read_args(sample), token=c, owner="alice")
            assert result["text"] == "alpha\nbeta\r\ngamma"
            (pid_c,) = [pid for pid, token in spawned.items() if token == c]
            assert sorted(pool.workers("alice\nu")) == sorted([pid_a, pid_c])  # B's, the least recently used, went
            await eventually(lambda: is_reaped(pid_b), "B's worker reaped")
            assert sorted(spawner.live_pids()) == sorted([pid_a, pid_c])
            # two calls of B at once: each makes room, the second counting the first's worker still starting
            results = await asyncio.gather(*(pool.call("u", "files/read", read_args(sample), token=b, owner="alice")
                                             for _ in range(2)))
            assert all(r["text"] == "alpha\nbeta\r\ngamma" for r in results)
            assert sorted(pool.workers("alice\nu")) == sorted(pid for pid, t in spawned.items() if t == b)[-2:]
            await eventually(lambda: len(spawner.live_pids()) == 2, "the retired workers reaped")

    asyncio.run(main())


def test_a_revoked_tokens_workers_are_dropped_and_the_others_kept(sample: Path) -> None:
    """A logout (or rotation) ends only the workers its token started (docs/REFERENCE.md §5.3), and ends them
    without asking the root helper to kill them with that token, which it would refuse and record
    as an invalid token (an operator saw a ``reject invalid token`` record after every logout):
    the spawner's ``drop``, not its ``kill``; the principal's other token keeps its worker."""
    a, b = identity.new_token()[0], identity.new_token()[0]

    async def main() -> None:
        async with open_pool(make_cfg(per_account=2)) as (pool, spawner):
            spawned = recording_spawner(spawner)
            ended: list[tuple[str, int]] = []
            real_kill, real_drop = spawner.kill, spawner.drop

            async def kill(pid: int) -> None:
                ended.append(("kill", pid))
                await real_kill(pid)

            async def drop(pid: int) -> None:
                ended.append(("drop", pid))
                await real_drop(pid)

            spawner.kill, spawner.drop = kill, drop  # type: ignore[method-assign]
            await pool.call("u", "files/read", read_args(sample), token=a, owner="alice")
            await pool.call("u", "files/read", read_args(sample), token=b, owner="alice")
            pid_a, pid_b = (pid for pid, token in spawned.items() if token in (a, b))
            assert spawned[pid_a] == a and spawned[pid_b] == b
            assert pool.retire_owner("alice", b) == 1
            await eventually(lambda: pid_b not in spawner.live_pids(), "B's worker ended")
            assert ended == [("drop", pid_b)]
            assert list(pool.workers("alice\nu")) == [pid_a]
            await pool.call("u", "files/read", read_args(sample), token=a, owner="alice")
            assert len(spawned) == 2  # A's worker served on

    asyncio.run(main())
