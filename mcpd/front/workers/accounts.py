"""The worker pool's accounts and their workers: which idle worker may serve a call (one its
token started), when a new one is started (bounded per principal by a token bucket; free when it
replaces one lost to a restart of the helper unit), and how one is ended and reaped.

An account is one (principal, OS account) pair: at most ``workers.per_account`` workers and as
many calls at once (its slots); at most ``workers.max_accounts`` accounts, the least recently used
idle one evicted. The calls themselves (deadlines, replies, cancellation) are the pool's
(:mod:`mcpd.front.workers.pool`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging

from mcpd.common import identity
from mcpd.common.buckets import TokenBuckets
from mcpd.common.config import Config
from mcpd.front import metrics
from mcpd.front.workers.channel import WorkerChannel
from mcpd.front.workers.spawner import Spawner
from mcpd.helper.wire.errors import INTERNAL_ERROR, RATE_LIMITED, TIMEOUT, ToolError

log = logging.getLogger(__name__)

REAP_GRACE = 2.0  # seconds a failed call waits for its killed worker to be reaped before answering


def token_tag(token: str) -> str:
    """The tag the pool gives the workers ``token`` spawns: the token's id (the 12 hex
    digits of ``mcpd_<id>_<secret>``, the id the policy process binds the worker to), or ``token``
    itself when it has no such form (development callers and tests, the empty token included)."""
    m = identity.TOKEN_RE.match(token)
    return m.group(1) if m else token


@dataclasses.dataclass(eq=False)
class Worker:
    """The front's record of one worker process and its socket."""

    pid: int
    channel: WorkerChannel
    tag: str = ""  # the token it was spawned with (token_tag): it serves only that token's calls
    busy: bool = False
    retired: bool = False
    revoked: bool = False  # its token no longer authenticates: never kept after its call, ended by drop
    next_id: int = 0
    generation: int = 0  # the spawner's generation when it started (Spawner.generation)


class Account:
    """One (principal, OS account) pair's workers and call slots."""

    def __init__(self, size: int) -> None:
        self.size = size  # workers.per_account: live workers at most, whichever tokens spawned them
        self.slots = asyncio.Semaphore(size)  # one per call in progress
        self.idle: list[Worker] = []  # least recently used first
        self.workers: dict[int, Worker] = {}  # every live worker, idle or busy
        self.starting = 0  # workers asked for and not yet in workers (each counts towards size)
        self.callers = 0  # calls inside (waiting or running): an account in use is never evicted
        #: the generations of the last ``size`` workers that ended on their own (hung up): one of an
        #: older generation than the spawner's now was lost to a restart, and is replaced free
        self.lost: collections.deque[int] = collections.deque(maxlen=size)


class Accounts:
    """The accounts with workers and their workers, for one event loop.

    Args:
        spawner: starts and ends worker processes.
        cfg: the daemon config; uses ``workers.per_account``, ``workers.max_accounts``,
            ``workers.spawn_burst`` and ``workers.spawns_per_second``.
    """

    def __init__(self, spawner: Spawner, cfg: Config) -> None:
        self._spawner = spawner
        self._cfg = cfg
        self.by_key: collections.OrderedDict[str, Account] = collections.OrderedDict()
        self._freed = asyncio.Event()  # set when an account no call is inside may be evicted
        self.retiring: set[asyncio.Task[None]] = set()  # workers being killed and reaped
        self.closed = False
        self._spawns = TokenBuckets(cfg.workers.spawn_burst, cfg.workers.spawns_per_second)  # per principal

    def live(self) -> int:
        """Live worker processes, every account together (the metrics' ``mcpd_workers``)."""
        return sum(len(account.workers) for account in self.by_key.values())

    def busy(self) -> int:
        """Live workers running a call (the metrics' ``mcpd_workers_busy``)."""
        return sum(1 for account in self.by_key.values() for w in account.workers.values() if w.busy)

    def retire_owner(self, owner: str, token: str | None = None) -> int:
        """End the idle workers of principal ``owner`` spawned with ``token`` (``None``: with any
        of its tokens), which no longer authenticates: they must not outlive it. Busy ones end
        with their calls (which their closed sessions cancel), without a cancel grace. They are
        ended with the spawner's :meth:`Spawner.drop`, not asked to be killed with the token
        that is no longer valid (the policy process would refuse it and record an invalid token).
        Returns how many were retired."""
        tag = None if token is None else token_tag(token)
        count = 0
        for key, account in self.by_key.items():
            if key.split("\n", 1)[0] == owner:
                for worker in [w for w in account.workers.values() if tag is None or w.tag == tag]:
                    worker.revoked = True
                for worker in [w for w in account.idle if w.revoked]:
                    self.retire(account, worker, release=False)
                    count += 1
        return count

    def workers(self, os_user: str) -> dict[int, bool]:
        """Live workers of ``os_user`` as ``{pid: busy}`` (introspection for tests and status)."""
        account = self.by_key.get(os_user)
        return {} if account is None else {w.pid: w.busy for w in account.workers.values()}

    async def enter(self, os_user: str, deadline: float, limit: float) -> Account:
        """Account ``os_user`` (a pool key), made if there is room (the least recently used
        account no call is inside is evicted to make some), with one more call inside; else wait
        for room until loop time ``deadline``.

        Raises:
            ToolError: ``TIMEOUT`` (``limit``: the call's seconds) when none came in time,
                ``INTERNAL_ERROR`` once closed.
        """
        while True:
            if self.closed:
                raise ToolError(INTERNAL_ERROR, "worker pool is closed")
            account = self.by_key.get(os_user)
            if account is None and len(self.by_key) >= self._cfg.workers.max_accounts:
                self._evict_one()
            if account is None and len(self.by_key) < self._cfg.workers.max_accounts:
                account = self.by_key[os_user] = Account(self._cfg.workers.per_account)
            if account is not None:
                self.by_key.move_to_end(os_user)
                account.callers += 1
                return account
            self._freed.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._freed.wait()
            except TimeoutError:
                metrics.limit_hit("worker_accounts")
                raise ToolError(TIMEOUT, "too many accounts have requests running", seconds=limit) from None

    def _evict_one(self) -> None:
        for name, account in self.by_key.items():  # least recently used first
            if account.callers == 0:
                for worker in list(account.workers.values()):
                    self.retire(account, worker, release=False)
                del self.by_key[name]
                return

    def leave(self, account: Account) -> None:
        """A call left ``account`` (:meth:`enter`): with none inside, it may be evicted."""
        account.callers -= 1
        if account.callers == 0:
            self._freed.set()

    async def checkout(self, account: Account, os_user: str, deadline: float, token: str = "",
                       principal: str = "") -> Worker:
        """An idle worker of ``account`` spawned with ``token`` (the most recently used), else a new
        one for ``token``, charged to ``principal``'s spawn bucket (``RATE_LIMITED`` when it is
        empty: nothing is started or retired). Not charged: a start the spawner failed (nothing
        started: the token is given back), and one that replaces a worker of ``account`` lost to a
        restart of the helper unit (it ended on its own in an older :meth:`Spawner.generation`; at
        most ``per_account`` are remembered). A worker of another token never serves the call.
        When ``account`` is full (workers starting included), the least recently used idle worker
        (of another token: this call holds a slot) is retired and its reaping awaited (at most
        :data:`REAP_GRACE` s) first, so a principal with several tokens is never refused for want
        of room while idle workers of its other tokens sit here.

        Raises:
            ToolError: ``RATE_LIMITED``; the spawner's refusal; ``INTERNAL_ERROR`` once closed.
            TimeoutError: no worker by loop time ``deadline``.
        """
        if self.closed:
            raise ToolError(INTERNAL_ERROR, "worker pool is closed")
        tag = token_tag(token)
        for worker in reversed(account.idle.copy()):
            if worker.channel.ended:  # died while idle
                self.retire(account, worker, release=False)
            elif worker.tag == tag:
                account.idle.remove(worker)
                worker.busy = True
                return worker
        loop = asyncio.get_running_loop()
        generation = self._spawner.generation()
        credit = self._respawn_credit(account, generation)
        wait = 0.0 if credit is not None else self._spawns.take(principal or os_user, loop.time())
        if wait:
            metrics.limit_hit("worker_spawns")
            burst, rate = self._spawns.burst, self._spawns.rate
            raise ToolError(RATE_LIMITED, f"too many new workers for this principal (at most {burst} at once, then "
                            f"{rate:g} a second; each timed-out or crashed call, and each cancelled one still running "
                            f"after the cancel grace, costs one); "
                            f"retry in {wait:.2f} s", limit=burst, retry_after_seconds=round(wait, 3))
        account.starting += 1
        try:
            room = None
            if len(account.workers) + account.starting > account.size and account.idle:
                room = self.retire(account, account.idle[0], release=False)
            async with asyncio.timeout_at(deadline):
                if room is not None:
                    await asyncio.wait({room}, timeout=REAP_GRACE)
                try:
                    sock, pid = await self._spawner.spawn(os_user, token)
                except (ToolError, OSError):  # nothing was started (refused, or no policy process to ask)
                    if credit is not None:
                        account.lost.appendleft(credit)
                    else:
                        self._spawns.give_back(principal or os_user, loop.time())
                    raise
            metrics.worker_started()
            try:
                _, channel = await asyncio.get_running_loop().create_unix_connection(WorkerChannel, sock=sock)
            except BaseException:
                sock.close()
                self.track(asyncio.get_running_loop().create_task(self._reap(pid, None, None)))
                raise
            worker = Worker(pid=pid, channel=channel, tag=tag, busy=True, generation=generation)
            account.workers[pid] = worker
        finally:
            account.starting -= 1
        if self.closed:  # close() ran while this worker was starting: it must not outlive the pool
            self.retire(account, worker, release=False)
            raise ToolError(INTERNAL_ERROR, "worker pool is closed")
        return worker

    def give_back(self, account: Account, worker: Worker) -> None:
        """``worker`` answered its call: idle again (most recently used), unless the pool closed
        or retired it meanwhile; its slot is freed either way."""
        worker.busy = False
        if self.closed or worker.retired:
            self.retire(account, worker, release=True)
        else:
            account.idle.append(worker)
            account.slots.release()

    async def fail(self, account: Account, worker: Worker | None) -> None:
        """Free the slot of a call that failed: with its worker (``None``: it had none yet)
        retired, whose reaping is awaited at most :data:`REAP_GRACE` s."""
        if worker is None:
            account.slots.release()
            return
        task = self.retire(account, worker, release=True)
        if task is not None:
            await asyncio.wait({task}, timeout=REAP_GRACE)

    @staticmethod
    def _respawn_credit(account: Account, generation: int) -> int | None:
        """Take one of ``account``'s workers lost to a restart (:attr:`Account.lost`, of another
        generation than ``generation``, the spawner's now) and return its generation; ``None``
        when there is none (the start is charged to the bucket)."""
        for i, lost in enumerate(account.lost):
            if lost != generation:
                del account.lost[i]
                return lost
        return None

    def retire(self, account: Account, worker: Worker, release: bool) -> asyncio.Task[None] | None:
        """Kill and reap ``worker`` in the background; release a call slot once it is reaped. A
        worker that had ended on its own (hung up; not revoked) is remembered in
        :attr:`Account.lost`."""
        if worker.retired:
            if release:
                account.slots.release()
            return None
        worker.retired = True
        if worker.channel.hung_up and not worker.revoked:
            account.lost.append(worker.generation)
        account.workers.pop(worker.pid, None)
        if worker in account.idle:
            account.idle.remove(worker)
        slots = account.slots if release else None
        # a revoked token's worker, and one that hung up (it exited: the policy process has reaped or
        # will reap it), are dropped: a kill_worker with a token that no longer authenticates would
        # only be refused and recorded as an invalid token
        drop = worker.revoked or worker.channel.hung_up
        return self.track(asyncio.get_running_loop().create_task(self._reap(worker.pid, worker.channel, slots, drop)))

    def track(self, task: asyncio.Task[None]) -> asyncio.Task[None]:
        """Keep ``task`` in :attr:`retiring` until it ends (the pool's close waits for them)."""
        self.retiring.add(task)
        task.add_done_callback(self.retiring.discard)
        return task

    async def _reap(self, pid: int, channel: WorkerChannel | None, slots: asyncio.Semaphore | None,
                    drop: bool = False) -> None:
        if channel is not None:
            channel.close()
        try:
            await (self._spawner.drop(pid) if drop else self._spawner.kill(pid))
        except Exception:
            log.exception("could not kill worker %s", pid)
        finally:
            if slots is not None:
                slots.release()
        if channel is not None:
            await channel.closed

    def close(self) -> None:
        """Retire every worker (reaped in the background: :attr:`retiring`); later calls to
        :meth:`enter` and :meth:`checkout` raise ``INTERNAL_ERROR``. Idempotent."""
        self.closed = True
        self._freed.set()
        for account in self.by_key.values():
            for worker in list(account.workers.values()):
                self.retire(account, worker, release=False)
        self.by_key.clear()
