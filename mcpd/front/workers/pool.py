"""The worker pool (docs/REFERENCE.md §1.4, §1.5, §2.5): calls on the workers of each account.

A call has a deadline (``workers.timeout_seconds``; ``TIMEOUT``) after which its worker is killed,
reaped and replaced; a crashed worker fails only its own request. A cancelled call stops waiting at
once; its worker gets ``workers.cancel_grace_seconds`` to finish the op (its reply is read and
discarded and it goes back idle), else it is killed (0: at once). Which worker serves a call, and
starting and ending workers, is :mod:`mcpd.front.workers.accounts`'s. The pool never blocks the
event loop and leaves no zombies.

Two routes: :meth:`WorkerPool.call` sends the request itself (unprivileged); :meth:`WorkerPool.lease`
lends a worker to the privileged backend, which has the policy process grant the call (and
hand the worker its job with the descriptor root opened) and then reads the reply through the lease. The pool calls
nothing of the backend's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from mcpd.common import frames
from mcpd.common.config import Config
from mcpd.common.deadline import deadline_seconds
from mcpd.common.inflight import InFlight
from mcpd.front import metrics
from mcpd.front.workers.accounts import Account, Accounts, Worker
from mcpd.front.workers.channel import (
    Crashed,
    ProgressCallback,
    encode_args,
    read_reply,
    read_reply_frame,
    reply_result,
    request_frame,
)
from mcpd.front.workers.spawner import Spawner
from mcpd.helper.wire.errors import HELPER_UNAVAILABLE, INTERNAL_ERROR, RATE_LIMITED, TIMEOUT, ToolError

log = logging.getLogger(__name__)


class WorkerLease:
    """One worker lent for one privileged call (:meth:`WorkerPool.lease`): the policy process hands
    it the job (the opened file and the request ``rid``) when the policy process grants the call;
    :meth:`reply` then reads its answer. Until then its socket is not watched, so the reply's
    arrival wakes nobody and is read in one go after the grant's answer."""

    __slots__ = ("pid", "rid", "_worker", "_cap", "replied")

    def __init__(self, worker: Worker, cap: int) -> None:
        self.pid, self.rid = worker.pid, worker.next_id
        self._worker, self._cap = worker, cap
        self.replied = False

    async def reply(self) -> dict[str, Any]:
        """The worker's checked reply (:func:`~mcpd.front.workers.channel.read_reply`); turn it
        into the result with :func:`~mcpd.front.workers.channel.reply_result` after the lease.

        Raises:
            Crashed, FrameError: the worker broke the protocol (the lease ends the call as crashed).
        """
        channel = self._worker.channel
        channel.hold(False)
        reply = await read_reply(channel, self.rid, self._cap, None)
        self.replied = True
        return reply


class WorkerPool:
    """Per-account pools of long-lived workers.

    Args:
        spawner: starts and kills worker processes (``LocalSpawner``, or the policy process's).
        cfg: the daemon config; uses ``workers.per_account`` (workers per account),
            ``workers.max_accounts`` (accounts with workers at once; the least recently used idle
            account is evicted), ``workers.timeout_seconds`` (default deadline per call),
            ``read.response_cap`` (bytes; sets the reply frame cap), ``max_calls_per_principal``
            (unprivileged calls of one owner waiting or running; ``RATE_LIMITED`` beyond),
            ``workers.spawn_burst`` and ``workers.spawns_per_second`` (workers started per
            principal: a token bucket; a call that needs one more is refused ``RATE_LIMITED``),
            ``workers.cancel_grace_seconds`` (how long a cancelled call's worker may still send
            its reply, read and discarded, before it is killed; 0: at once).

    Must be used from one event loop. Call :meth:`close` before the loop ends.
    """

    def __init__(self, spawner: Spawner, cfg: Config) -> None:
        self._spawner = spawner
        self._cfg = cfg
        self._reply_cap = frames.reply_cap(cfg.read.response_cap)
        self._accounts = Accounts(spawner, cfg)
        self._inflight = 0  # calls inside call() or lease(); close() waits for them to end
        #: unprivileged calls per principal, and workers in a cancel grace (those of a named owner
        #: counted under its name, others under their OS account's)
        self._calls = InFlight(cfg.max_calls_per_principal)
        self._waiting = 0  # calls that hold no worker slot yet (the metrics' queue)
        self._quiet = asyncio.Event()

    @property
    def _closed(self) -> bool:
        return self._accounts.closed

    def live(self) -> int:
        """Live worker processes, every account together (the metrics' ``mcpd_workers``)."""
        return self._accounts.live()

    def busy(self) -> int:
        """Live workers running a call (the metrics' ``mcpd_workers_busy``)."""
        return self._accounts.busy()

    def queued(self) -> int:
        """Calls waiting for a worker slot: for an account to be admitted, or for one of its
        ``per_account`` slots (the metrics' ``mcpd_pool_queued``)."""
        return self._waiting

    def retire_owner(self, owner: str, token: str | None = None) -> int:
        """:meth:`Accounts.retire_owner <mcpd.front.workers.accounts.Accounts.retire_owner>`: end
        the idle workers of ``owner``'s ``token`` (``None``: any), which no longer authenticates;
        busy ones end with their calls, without a cancel grace. Returns how many were retired."""
        return self._accounts.retire_owner(owner, token)

    def workers(self, os_user: str) -> dict[int, bool]:
        """Live workers of pool key ``os_user`` (``owner\\nos_user`` for a named owner) as
        ``{pid: busy}`` (introspection for tests and status)."""
        return self._accounts.workers(os_user)

    async def call(
        self, os_user: str, op: str, args: dict[str, Any], timeout: float | None = None,
        on_progress: ProgressCallback | None = None, *, token: str = "", owner: str | None = None,
    ) -> dict[str, Any]:
        """Run ``op`` with ``args`` in one of ``os_user``'s workers and return its result dict.

        Args:
            os_user: the OS account whose rights the worker has.
            op: an op name (``"files/read"``); args: its JSON-serialisable arguments.
            timeout: seconds for the whole call (queueing, spawning, running); default the
                call's deadline (:func:`~mcpd.common.deadline.deadline_seconds` of ``args`` and
                ``workers.timeout_seconds``).
            on_progress: awaited with ``(done, total | None, message)`` for each progress frame
                the op sends (``files/find``); ``None``: the worker is not asked for progress.
            token: the caller's bearer token, handed to the spawner. The call runs only on a
                worker spawned with this token (same :func:`token_tag`): the policy process ends a
                worker once the token that spawned it stops authenticating (a logout, a
                rotation), and that must end only that token's calls.
            owner: the principal's name: workers are pooled per (owner, os_user), since each
                worker is bound to one principal; ``workers.per_account`` bounds them there.

        Raises:
            ToolError: the worker's own error; ``TIMEOUT`` when the deadline passes (a running
                worker is then killed, reaped and replaced); ``INTERNAL_ERROR`` ("worker crashed")
                when the worker dies or breaks the protocol; ``INVALID_ARGUMENT`` when the request
                frame would exceed 64 KiB; ``RATE_LIMITED`` when ``owner`` already has
                ``max_calls_per_principal`` calls waiting or running, or when the call needs a new
                worker and its principal had ``workers.spawn_burst`` started lately.
            asyncio.CancelledError: the call was cancelled (raised at once); its worker is killed,
                or first given ``workers.cancel_grace_seconds`` to reply (see :meth:`_graced`).
        """
        if self._closed:
            raise ToolError(INTERNAL_ERROR, "worker pool is closed")
        if owner is not None and self._calls.take(owner) is not None:  # a worker in its cancel grace counts
            metrics.limit_hit("calls_per_principal")
            cap = self._calls.per_key
            raise ToolError(RATE_LIMITED, f"{cap} calls of this principal are in flight; retry when one ends",
                            limit=cap)
        try:
            return await self._call(os_user, op, args, timeout, on_progress, token, owner)
        finally:
            if owner is not None:
                self._calls.release(owner)

    async def _call(
        self, os_user: str, op: str, args: dict[str, Any], timeout: float | None, on_progress: ProgressCallback | None,
        token: str, owner: str | None,
    ) -> dict[str, Any]:
        limit = deadline_seconds(args, self._cfg.workers.timeout_seconds, op) if timeout is None else timeout
        encoded = encode_args(op, args)  # once per call, size checked before any worker is taken
        deadline = asyncio.get_running_loop().time() + limit
        principal = os_user if owner is None else owner
        account = await self._admit(os_user if owner is None else f"{owner}\n{os_user}", deadline, limit)
        try:
            worker: Worker | None = None
            try:
                worker = await self._accounts.checkout(account, os_user, deadline, token, principal)
                worker.next_id += 1
                async with asyncio.timeout_at(deadline):
                    worker.channel.write(request_frame(worker.next_id, op, encoded, progress=on_progress is not None))
                    reply = await read_reply(worker.channel, worker.next_id, self._reply_cap, on_progress)
            except ToolError:
                await self._accounts.fail(account, worker)
                raise
            except (TimeoutError, Crashed, frames.FrameError, OSError) as exc:
                raise await self._lost(account, worker, op, limit, exc) from None
            except BaseException as exc:  # cancellation: answer nothing; the worker is drained or killed in the background
                if worker is None:
                    account.slots.release()
                elif not isinstance(exc, asyncio.CancelledError) or not self._graced(account, worker, principal,
                                                                                     deadline):
                    self._accounts.retire(account, worker, release=True)
                raise
            self._accounts.give_back(account, worker)
        finally:
            self._leave(account)
        return reply_result(reply)

    @contextlib.asynccontextmanager
    async def lease(
        self, os_user: str, op: str, args: dict[str, Any], *, token: str, owner: str, timeout: float,
        decided: frozenset[str] = frozenset(),
    ) -> AsyncIterator[WorkerLease]:
        """Lend one of ``owner``'s workers of ``os_user`` to a privileged call (``async with
        pool.lease(...) as worker``): the caller has the policy process hand ``worker.pid`` its job
        ``worker.rid``, then reads :meth:`WorkerLease.reply`.

        The worker is chosen, started and bounded as for :meth:`call` (``token``, ``owner``;
        ``timeout`` seconds for all of it, the body included), but not counted against
        ``max_calls_per_principal`` (the privileged backend bounds those calls). ``op`` and
        ``args`` are the job, checked to fit a worker's request frame. On leaving, the worker goes
        back idle after its reply, or after a :class:`ToolError` whose code is in ``decided``
        (refused before the worker was touched); otherwise, cancellation included, it is killed:
        its job may still be on its way to it.

        Raises:
            ToolError: as :meth:`call`; the body's own passes through.
        """
        if self._closed:
            raise ToolError(INTERNAL_ERROR, "worker pool is closed")
        encode_args(op, args)
        deadline = asyncio.get_running_loop().time() + timeout
        account = await self._admit(f"{owner}\n{os_user}", deadline, timeout)
        try:
            worker: Worker | None = None
            try:
                worker = await self._accounts.checkout(account, os_user, deadline, token, owner)
                worker.next_id += 1
                lent = WorkerLease(worker, self._reply_cap)
                worker.channel.hold(True)
                try:
                    async with asyncio.timeout_at(deadline):
                        yield lent
                finally:
                    worker.channel.hold(False)
            except ToolError as exc:
                if worker is not None and exc.code in decided:
                    self._accounts.give_back(account, worker)
                else:
                    await self._accounts.fail(account, worker)
                raise
            except (TimeoutError, Crashed, frames.FrameError, OSError) as exc:
                raise await self._lost(account, worker, op, timeout, exc) from None
            except BaseException:
                if worker is None:
                    account.slots.release()
                else:
                    self._accounts.retire(account, worker, release=True)
                raise
            if lent.replied:
                self._accounts.give_back(account, worker)
            else:  # (its reply would wait in its socket for the next call)
                self._accounts.retire(account, worker, release=True)
        finally:
            self._leave(account)

    async def _admit(self, key: str, deadline: float, limit: float) -> Account:
        """Count one call in (:meth:`close` waits for it; :meth:`queued` until it holds a slot),
        enter account ``key`` and take one of its slots; undone when that fails.

        Raises:
            ToolError: ``TIMEOUT`` when no room for the account or no slot came by loop time
                ``deadline`` (``limit``: the call's seconds); ``INTERNAL_ERROR`` once closed.
        """
        self._inflight += 1
        self._waiting += 1
        account: Account | None = None
        try:
            account = await self._accounts.enter(key, deadline, limit)
            if account.slots.locked():  # (a free slot is taken at once: no deadline to arm)
                try:
                    async with asyncio.timeout_at(deadline):
                        await account.slots.acquire()
                except TimeoutError:
                    metrics.limit_hit("account_workers")
                    raise ToolError(TIMEOUT, "all workers of this account stayed busy", seconds=limit) from None
            else:
                await account.slots.acquire()
        except BaseException:
            self._waiting -= 1
            self._leave(account)
            raise
        self._waiting -= 1
        return account

    def _leave(self, account: Account | None) -> None:
        """Count a call of :meth:`_admit` out; an account no call is inside may be evicted."""
        if account is not None:
            self._accounts.leave(account)
        self._inflight -= 1
        if self._inflight == 0:
            self._quiet.set()

    async def _lost(self, account: Account, worker: Worker | None, op: str, limit: float,
                    exc: BaseException) -> ToolError:
        """Retire the worker of a call that timed out (``exc`` a ``TimeoutError``) or whose worker
        broke (its reaping awaited, at most :data:`REAP_GRACE`); return the error to answer."""
        await self._accounts.fail(account, worker)
        pid = worker and worker.pid
        if isinstance(exc, TimeoutError):
            log.warning("worker %s timed out on %s after %.1f s", pid, op, limit)
            return ToolError(TIMEOUT, f"the worker did not finish in {limit:g} s", seconds=limit)
        log.warning("worker %s failed on %s: %s", pid, op, type(exc).__name__)
        if not await self._spawner.alive():  # the policy process died and took its workers along
            return ToolError(HELPER_UNAVAILABLE, "the policy process is not reachable")
        return ToolError(INTERNAL_ERROR, "worker crashed")

    def _graced(self, account: Account, worker: Worker, principal: str, deadline: float) -> bool:
        """Give ``worker``, whose call was cancelled after its request was sent, the cancel grace
        (docs/REFERENCE.md §1.4: the job is stopped; a quick op is let finish instead, costing no new worker):
        :meth:`_drain` reads its reply in the background, at most ``workers.cancel_grace_seconds``
        and never past the call's ``deadline`` (loop seconds). Meanwhile the worker stays busy, keeps
        its call slot and counts as a call of ``principal``, so cancelling gets no more work run at
        once. Returns ``False`` (the caller kills it) when the grace is 0, the pool is closing, or
        ``principal`` was revoked while the call ran (:meth:`retire_owner`).

        Only the unprivileged route comes here: on the privileged one the policy process may still be
        handing the worker its job, so a cancelled granted call kills its worker."""
        grace = self._cfg.workers.cancel_grace_seconds
        if grace <= 0 or self._closed or worker.retired or worker.revoked:
            return False
        self._calls.add(principal)
        loop = asyncio.get_running_loop()
        end = min(loop.time() + grace, deadline)
        self._accounts.track(loop.create_task(self._drain(account, worker, principal, end)))
        return True

    async def _drain(self, account: Account, worker: Worker, principal: str, end: float) -> None:
        """Read and discard the cancelled call's progress frames and reply until loop time ``end``;
        then put ``worker`` back idle and free its slot, or kill it if no whole reply came (a timeout,
        a closed or broken stream). The worker reaches no other call before its reply is read."""
        replied = False
        try:
            async with asyncio.timeout_at(end):
                while (frame := await read_reply_frame(worker.channel, self._reply_cap)) is not None:
                    if frame.get("id") != worker.next_id:
                        break
                    if "ok" in frame or "progress" not in frame:
                        replied = isinstance(frame.get("ok"), bool)
                        break
        except (TimeoutError, frames.FrameError, OSError):
            pass
        finally:
            self._calls.release(principal)
            if replied and not (self._closed or worker.retired or worker.revoked):
                worker.busy = False
                account.idle.append(worker)
                account.slots.release()
            else:
                self._accounts.retire(account, worker, release=True)

    async def close(self) -> None:
        """Kill and reap every worker; later calls raise ``INTERNAL_ERROR``. Idempotent.

        Calls in flight end with ``INTERNAL_ERROR`` (their workers are killed); a call still
        waiting for its spawner ends at the latest at its deadline, and close() returns after it.
        """
        self._accounts.close()
        while self._accounts.retiring or self._inflight:
            if self._accounts.retiring:
                await asyncio.gather(*self._accounts.retiring, return_exceptions=True)
            else:
                self._quiet.clear()
                await self._quiet.wait()
