"""Worker processes and the per-account worker pool (DESIGN.md "worker"; SPEC §1.4, §1.5, §2.5).

A worker is a long-lived process that runs ops (``mcpd.core.ops.run``) for one OS account, one request
at a time, over its end of a ``socketpair`` with length-prefixed frames (``mcpd.helper.wire.frames``). It
starts as ``python -I -m mcpd.worker --fd N --limits JSON``, closes every other descriptor, and
exits when the socket closes. It holds nothing of the front's: no TLS key, no tokens.

The front talks to workers only through :class:`WorkerPool`: per principal and account up to
``workers.per_account`` workers, spawned lazily and reused, each only for calls of the token it
was spawned with (:meth:`WorkerPool.call`); a deadline per call
(``workers.timeout_seconds``, SPEC §2.5 ``TIMEOUT``) after which the worker is killed, reaped and
replaced; a crashed worker fails only its own request. Cancelling a call stops waiting for it at
once; its worker gets ``workers.cancel_grace_seconds`` to finish the op, its reply is read and
discarded and it goes back idle, else it is killed then (0: killed at once). The pool never blocks
the event loop and leaves no zombies.

Since every timed-out or crashed call, and every cancelled one whose op outlasts the grace, costs a
worker, starting workers is bounded per principal (``workers.spawn_burst`` at once, then
``workers.spawns_per_second``): a call that needs a new worker past that is refused ``RATE_LIMITED``
at once, so calling and cancelling in a loop cannot make the daemon fork without end. Reusing an
idle worker costs nothing, and so do a start that failed (no helper to ask, or a refusal: nothing
was started) and the replacement of a worker lost when the root helper restarted (the pool is back
to its size within seconds of the helper's return, and the calls that failed meanwhile leave the
bucket as it was).

Spawning is delegated to a :class:`Spawner`: :class:`LocalSpawner` (development, the daemon's own
user) here; the root helper provides one that starts workers as the account.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast

from mcpd.common import identity, wirejson
from mcpd.helper.wire import frames
from mcpd.common.buckets import TokenBuckets
from mcpd.common.config import Config, ReadLimits
from mcpd.helper.wire.errors import HELPER_UNAVAILABLE, INTERNAL_ERROR, RATE_LIMITED, TIMEOUT, ToolError, invalid_argument
from mcpd.front import metrics

log = logging.getLogger("mcpd.front.pool")

REQUEST_CAP = frames.HELPER_REQUEST_CAP  # bytes: a request frame to a worker is at most 64 KiB
STREAM_LIMIT = 1024 * 1024  # bytes a worker connection buffers unasked before its reading pauses
REAP_GRACE = 2.0  # seconds a failed call waits for its killed worker to be reaped before answering

#: ``grant(worker_pid, request_id)`` of :meth:`WorkerPool.call` (the privileged content route).
GrantCallback = Callable[[int, int], Awaitable[None]]

#: ``on_progress(done, total | None, message)`` of :meth:`WorkerPool.call`, awaited per interim frame.
ProgressCallback = Callable[[int, "int | None", str], Awaitable[None]]


# --------------------------------------------------------------------------- spawners


class Spawner(Protocol):
    """Starts and stops worker processes for an OS account (DESIGN.md "worker").

    ``spawn`` returns the front's end of a connected ``AF_UNIX`` stream socketpair and the
    worker's pid; the pool owns the socket from then on. ``kill`` sends SIGKILL to a worker it
    spawned and returns once the process has been reaped (a no-op for an unknown or gone pid).
    Both may raise ``OSError`` or :class:`ToolError`.
    """

    async def spawn(self, os_user: str, token: str = "") -> tuple[socket.socket, int]: ...

    async def kill(self, pid: int) -> None: ...

    async def drop(self, pid: int) -> None:
        """End worker ``pid``, whose token no longer authenticates or which hung up (its socket is
        closed, so it exits at its next read if it has not): the root helper ends and reaps such
        workers by itself (asking it with a token that no longer authenticates would be refused
        and recorded as an invalid token); a local spawner kills and reaps it."""
        ...

    async def alive(self) -> bool:
        """Whether new workers can be started now (asked after a worker ended mid-call)."""
        ...

    def generation(self) -> int:
        """A number that changes whenever every worker this spawner started may have ended
        together, through no doing of their principals (the root helper or its policy process
        died, and its workers with it). A worker that ended on its own in an older generation
        than the current one was lost to that restart, and its replacement is no new start of
        its principal's (:meth:`WorkerPool._checkout`)."""
        ...


class LocalSpawner:
    """Development spawner: workers run as the daemon's own user (``os_user`` is ignored).

    Args:
        limits: the read limits (bytes) handed to every worker on its command line.
        python: the interpreter to run (default: the current one).

    Children get only their socket (``pass_fds``), ``/dev/null`` as stdin/stdout, the daemon's
    stderr for tracebacks, a minimal environment, a new session (terminal signals do not reach
    them) and ``-I`` (isolated mode). Each child is watched through a pidfd and reaped as soon as
    it exits, so no zombie outlives its process.
    """

    def __init__(self, limits: ReadLimits, python: str = sys.executable) -> None:
        self._argv = [python, "-I", "-m", "mcpd.worker", "--limits", json.dumps(dataclasses.asdict(limits))]
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._exited: dict[int, asyncio.Future[None]] = {}

    async def spawn(self, os_user: str, token: str = "") -> tuple[socket.socket, int]:
        """Start one worker; see :class:`Spawner`. Raises ``OSError`` when the fork/exec fails."""
        loop = asyncio.get_running_loop()
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = subprocess.Popen(
                [*self._argv, "--fd", str(back.fileno()), "--parent", str(os.getpid())],
                pass_fds=(back.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                cwd="/",
                env={"PATH": os.defpath, "LANG": "C.UTF-8"},
                start_new_session=True,
            )
        except BaseException:
            front.close()
            raise
        finally:
            back.close()
        pidfd = os.pidfd_open(proc.pid)
        self._procs[proc.pid] = proc
        self._exited[proc.pid] = loop.create_future()
        loop.add_reader(pidfd, self._reap, loop, pidfd, proc.pid)
        return front, proc.pid

    def _reap(self, loop: asyncio.AbstractEventLoop, pidfd: int, pid: int) -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        proc = self._procs.pop(pid)
        proc.wait()  # the pidfd is readable: the child has exited, this does not block
        done = self._exited.pop(pid)
        if not done.done():
            done.set_result(None)

    async def kill(self, pid: int) -> None:
        """SIGKILL a worker this spawner started and wait until it is reaped; see :class:`Spawner`."""
        await self._end(pid)

    async def drop(self, pid: int) -> None:
        """As :meth:`kill`: nobody else ends these workers (see :class:`Spawner`)."""
        await self._end(pid)

    async def _end(self, pid: int) -> None:
        proc = self._procs.get(pid)
        done = self._exited.get(pid)
        if proc is None or done is None:
            return
        proc.kill()
        await asyncio.shield(done)

    async def alive(self) -> bool:
        """Always: these workers need nobody's help to start."""
        return True

    def generation(self) -> int:
        """Always 0: nothing ends these workers together but the front itself."""
        return 0

    def live_pids(self) -> list[int]:
        """Pids started by this spawner and not yet reaped (introspection for tests and status)."""
        return list(self._procs)


# --------------------------------------------------------------------------- reply frames


class WorkerChannel(asyncio.Protocol):
    """The front's end of one worker's socket: frames taken from what arrives, as it arrives (one
    buffer, no stream reader and no coroutine per read: a call's reply is usually in the buffer
    whole, both its frames, by the time it is asked for).

    Reading pauses while more than :data:`STREAM_LIMIT` bytes wait and nobody asks for a frame (a
    worker sending what was not asked for fills no memory), and while :meth:`hold` is on.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self.hung_up = False  # the worker closed its end (it exited, or was killed): set by eof_received only
        self._held = False
        self._paused = False
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # done once the socket is

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._waiter is not None:
            self._wake()
        elif len(self._buf) > STREAM_LIMIT:
            self._steer()

    def eof_received(self) -> bool:
        self._eof = self.hung_up = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._wake()
        if not self.closed.done():
            self.closed.set_result(None)

    # the pool's side

    @property
    def ended(self) -> bool:
        """The worker's end is closed (or ours is closing): no reply can come."""
        return self._eof or self.transport is None or self.transport.is_closing()

    def write(self, data: bytes) -> None:
        """Send ``data`` (a request frame, at most 64 KiB: one call at a time, so the transport's
        buffer never holds more than one)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def hold(self, on: bool) -> None:
        """Stop (``True``) or go on (``False``) reading: what arrives meanwhile wakes nobody."""
        self._held = on
        self._steer()

    async def body(self, cap: int) -> bytes | None:
        """The next frame's body (its announced length checked against ``cap`` bytes as soon as
        its header is in); ``None`` at a clean end of stream between frames.

        Raises:
            mcpd.helper.wire.frames.FrameError: a frame over ``cap``, or the stream ended inside one.
        """
        while (found := frames.take_frame(self._buf, cap)) is None:
            if self._eof:
                if self._buf:
                    raise frames.FrameError("connection closed inside a frame")
                return None
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            self._steer()
            try:
                await waiter
            finally:
                self._waiter = None
        if self._paused:
            self._steer()
        return found

    def close(self) -> None:
        """Close our end (idempotent); :attr:`closed` is done once the socket is."""
        if self.transport is not None:
            self.transport.close()
        elif not self.closed.done():
            self.closed.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _steer(self) -> None:
        """Pause or resume reading as :meth:`hold` and the buffer's size say."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        pause = self._held or (self._waiter is None and len(self._buf) > STREAM_LIMIT)
        if pause != self._paused:
            self._paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()


async def read_reply_frame(channel: WorkerChannel, cap: int) -> dict[str, Any] | None:
    """One reply (or progress) frame from a worker: :func:`mcpd.helper.wire.frames.recv_frame`'s format,
    parsed with :func:`mcpd.common.wirejson.loads`. A reply marked ``"text_frame": true`` (see
    ``mcpd.worker.main.send_reply``) is followed by a frame of raw UTF-8 that becomes its
    ``result["text"]``.

    Returns ``None`` on a clean end of stream. Raises :class:`mcpd.helper.wire.frames.FrameError` for a
    frame over ``cap`` bytes, one cut short, a body that is not one JSON object, or a text frame
    that is missing, not UTF-8, or follows a reply without a result object.
    """
    body = await channel.body(cap)
    if body is None:
        return None
    obj = wirejson.loads(body)
    if not isinstance(obj, dict):
        raise frames.FrameError("frame is not a JSON object")
    if obj.pop("text_frame", None) is True:
        result = obj.get("result")
        raw = await channel.body(cap)
        if raw is None or not isinstance(result, dict):
            raise frames.FrameError("a text frame is missing or has no result to belong to")
        try:
            result["text"] = raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise frames.FrameError("a text frame is not UTF-8") from None
    return obj


# --------------------------------------------------------------------------- the pool


def token_tag(token: str) -> str:
    """The tag :class:`WorkerPool` gives the workers ``token`` spawns: the token's id (the 12 hex
    digits of ``mcpd_<id>_<secret>``, the id the policy process binds the worker to), or ``token``
    itself when it has no such form (development callers and tests, the empty token included)."""
    m = identity.TOKEN_RE.match(token)
    return m.group(1) if m else token


@dataclasses.dataclass(eq=False)
class _Worker:
    pid: int
    channel: WorkerChannel
    tag: str = ""  # the token it was spawned with (token_tag): it serves only that token's calls
    busy: bool = False
    retired: bool = False
    revoked: bool = False  # its token no longer authenticates: never kept after its call, ended by drop
    next_id: int = 0
    generation: int = 0  # the spawner's generation when it started (Spawner.generation)


class _Crashed(Exception):
    """The worker closed its socket or broke the frame protocol."""


class _Account:
    def __init__(self, size: int) -> None:
        self.size = size  # workers.per_account: live workers at most, whichever tokens spawned them
        self.slots = asyncio.Semaphore(size)  # one per call in progress
        self.idle: list[_Worker] = []  # least recently used first
        self.workers: dict[int, _Worker] = {}  # every live worker, idle or busy
        self.starting = 0  # workers asked for and not yet in workers (each counts towards size)
        self.callers = 0  # calls inside (waiting or running): an account in use is never evicted
        #: the generations of the last ``size`` workers that ended on their own (hung up): one of an
        #: older generation than the spawner's now was lost to a restart, and is replaced free
        self.lost: collections.deque[int] = collections.deque(maxlen=size)


class WorkerPool:
    """Per-account pools of long-lived workers (DESIGN.md "worker"; SPEC §1.5, §2.5 ``TIMEOUT``).

    Args:
        spawner: starts and kills worker processes (:class:`LocalSpawner`, or the root helper's).
        cfg: the daemon config; uses ``workers.per_account`` (workers per account),
            ``workers.max_accounts`` (accounts with workers at once; the least recently used idle
            account is evicted), ``workers.timeout_seconds`` (default deadline per call) and
            ``read.response_cap`` (bytes; sets the reply frame cap) and ``max_calls_per_principal``
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
        self._accounts: collections.OrderedDict[str, _Account] = collections.OrderedDict()
        self._account_freed = asyncio.Event()
        self._retiring: set[asyncio.Task[None]] = set()
        self._inflight = 0  # calls inside call(); close() waits for them to end
        self._by_owner: collections.Counter[str] = collections.Counter()  # unprivileged calls per principal
        self._waiting = 0  # calls inside call() that hold no worker slot yet (the metrics' queue)
        self._quiet = asyncio.Event()
        self._closed = False
        self._spawns = TokenBuckets(cfg.workers.spawn_burst, cfg.workers.spawns_per_second)  # per principal
        self._in_grace: collections.Counter[str] = collections.Counter()  # workers in a cancel grace, per principal

    def live(self) -> int:
        """Live worker processes, every account together (the metrics' ``mcpd_workers``)."""
        return sum(len(account.workers) for account in self._accounts.values())

    def busy(self) -> int:
        """Live workers running a call (the metrics' ``mcpd_workers_busy``)."""
        return sum(1 for account in self._accounts.values() for w in account.workers.values() if w.busy)

    def queued(self) -> int:
        """Calls waiting for a worker slot: for an account to be admitted, or for one of its
        ``per_account`` slots (the metrics' ``mcpd_pool_queued``)."""
        return self._waiting

    def retire_owner(self, owner: str, token: str | None = None) -> int:
        """End the idle workers of principal ``owner`` spawned with ``token`` (``None``: with any
        of its tokens), which no longer authenticates: they must not outlive it. Busy ones end
        with their calls (which their closed sessions cancel), without a cancel grace. They are
        ended with the spawner's :meth:`Spawner.drop`, not asked to be killed with the token
        that is no longer valid (the root helper would refuse it and record an invalid token).
        Returns how many were retired."""
        tag = None if token is None else token_tag(token)
        count = 0
        for key, account in self._accounts.items():
            if key.split("\n", 1)[0] == owner:
                for worker in [w for w in account.workers.values() if tag is None or w.tag == tag]:
                    worker.revoked = True
                for worker in [w for w in account.idle if w.revoked]:
                    self._retire(account, worker, release=False)
                    count += 1
        return count

    def workers(self, os_user: str) -> dict[int, bool]:
        """Live workers of ``os_user`` as ``{pid: busy}`` (introspection for tests and status)."""
        account = self._accounts.get(os_user)
        return {} if account is None else {w.pid: w.busy for w in account.workers.values()}

    async def call(
        self, os_user: str, op: str, args: dict[str, Any], timeout: float | None = None,
        on_progress: ProgressCallback | None = None, *, token: str = "", owner: str | None = None,
        grant: GrantCallback | None = None, decided: frozenset[str] = frozenset(),
    ) -> dict[str, Any]:
        """Run ``op`` with ``args`` in one of ``os_user``'s workers and return its result dict.

        Args:
            os_user: the OS account whose rights the worker has.
            op: an op name (``"files/read"``); args: its JSON-serialisable arguments.
            timeout: seconds for the whole call (queueing, spawning, running); default
                ``workers.timeout_seconds``.
            on_progress: awaited with ``(done, total | None, message)`` for each progress frame
                the op sends (``files/find``); ``None``: the worker is not asked for progress.
            token: the caller's bearer token, handed to the spawner (the root helper starts
                workers only for the token's principal). The call runs only on a worker spawned
                with this token (same :func:`token_tag`): the policy process ends a worker once
                the token that spawned it stops authenticating (a logout, a rotation), and that
                must end only that token's calls, never those of the principal's other tokens.
            owner: the principal's name: workers are pooled per (owner, os_user), since the
                helper binds each worker to one principal; ``workers.per_account`` bounds them
                there whichever tokens spawned them.
            grant: privileged content route: instead of sending the request, the pool awaits
                ``grant(worker_pid, request_id)``, which has the root helper decide and pass the
                opened file to that worker; the worker's reply is then read as usual.
            decided: error codes of ``grant`` that mean the helper refused before touching the
                worker (the worker goes back to the pool; any other failure retires it).

        Raises:
            ToolError: the worker's own error; ``TIMEOUT`` when the deadline passes (a running
                worker is then killed, reaped and replaced); ``INTERNAL_ERROR`` ("worker crashed")
                when the worker dies or breaks the protocol; ``INVALID_ARGUMENT`` when the request
                frame would exceed 64 KiB; ``RATE_LIMITED`` when ``owner`` already has
                ``max_calls_per_principal`` unprivileged calls waiting or running, or when the call
                needs a new worker and ``owner`` (``os_user`` without one) has had
                ``workers.spawn_burst`` started lately (its details say ``retry_after_seconds``).
            asyncio.CancelledError: the call was cancelled (raised at once); its worker is killed,
                or first given ``workers.cancel_grace_seconds`` to reply (see :meth:`_graced`).
        """
        if self._closed:
            raise ToolError(INTERNAL_ERROR, "worker pool is closed")
        counted = owner if grant is None and owner is not None else None  # (privileged: the helper client's cap)
        if counted is not None:
            cap = self._cfg.max_calls_per_principal
            if self._by_owner[counted] + self._in_grace[counted] >= cap:  # a worker in its cancel grace counts
                metrics.limit_hit("calls_per_principal")
                raise ToolError(RATE_LIMITED, f"{cap} calls of this principal are in flight; retry when one ends",
                                limit=cap)
            self._by_owner[counted] += 1
        try:
            return await self._call(os_user, op, args, timeout, on_progress, token, owner, grant, decided)
        finally:
            if counted is not None:
                self._by_owner[counted] -= 1
                if self._by_owner[counted] <= 0:
                    del self._by_owner[counted]

    async def _call(
        self, os_user: str, op: str, args: dict[str, Any], timeout: float | None, on_progress: ProgressCallback | None,
        token: str, owner: str | None, grant: GrantCallback | None, decided: frozenset[str],
    ) -> dict[str, Any]:
        limit = self._cfg.workers.timeout_seconds if timeout is None else timeout
        encoded = self._encode_args(op, args)  # once per call, size checked before any worker is taken
        deadline = asyncio.get_running_loop().time() + limit
        key = os_user if owner is None else f"{owner}\n{os_user}"
        self._inflight += 1
        self._waiting += 1
        waiting = [True]

        def admitted() -> None:
            if waiting[0]:
                waiting[0] = False
                self._waiting -= 1

        try:
            account = await self._enter(key, deadline, limit)
            try:
                return await self._call_in(account, os_user, op, encoded, deadline, limit, on_progress,
                                           token, grant, decided, admitted, os_user if owner is None else owner)
            finally:
                account.callers -= 1
                if account.callers == 0:
                    self._account_freed.set()
        finally:
            admitted()
            self._inflight -= 1
            if self._inflight == 0:
                self._quiet.set()

    @staticmethod
    def _encode_args(op: str, args: dict[str, Any]) -> bytes:
        """``args`` as JSON, encoded once for every frame of the call; ``INVALID_ARGUMENT`` when
        they are not JSON-serialisable or the request frame would pass :data:`REQUEST_CAP`."""
        try:
            data = wirejson.dumps(args)
        except (TypeError, ValueError) as exc:
            raise invalid_argument("arguments are not JSON-serialisable") from exc
        # the frame adds {"id":N,"op":"...","args":...,"progress":true}: 64 bytes are room for it
        if len(data) + len(op.encode("utf-8", "surrogatepass")) + 64 > REQUEST_CAP:
            raise invalid_argument(f"request over {REQUEST_CAP} bytes", limit=REQUEST_CAP)
        return data

    @staticmethod
    def _frame(rid: int, op: str, args: bytes, progress: bool = False) -> bytes:
        """One request frame: ``{"id", "op", "args"[, "progress": true]}`` with ``args`` the JSON
        of :meth:`_encode_args`, embedded as it is."""
        request: dict[str, Any] = {"id": rid, "op": op, "args": wirejson.embed(args)}
        if progress:
            request["progress"] = True
        body = wirejson.dumps(request)
        return frames.HEADER.pack(len(body)) + body

    async def _enter(self, os_user: str, deadline: float, limit: float) -> _Account:
        while True:
            if self._closed:
                raise ToolError(INTERNAL_ERROR, "worker pool is closed")
            account = self._accounts.get(os_user)
            if account is None and len(self._accounts) >= self._cfg.workers.max_accounts:
                self._evict_one()
            if account is None and len(self._accounts) < self._cfg.workers.max_accounts:
                account = self._accounts[os_user] = _Account(self._cfg.workers.per_account)
            if account is not None:
                self._accounts.move_to_end(os_user)
                account.callers += 1
                return account
            self._account_freed.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._account_freed.wait()
            except TimeoutError:
                metrics.limit_hit("worker_accounts")
                raise ToolError(TIMEOUT, "too many accounts have requests running", seconds=limit) from None

    def _evict_one(self) -> None:
        for name, account in self._accounts.items():  # least recently used first
            if account.callers == 0:
                for worker in list(account.workers.values()):
                    self._retire(account, worker, release=False)
                del self._accounts[name]
                return

    async def _call_in(
        self, account: _Account, os_user: str, op: str, args: bytes, deadline: float, limit: float,
        on_progress: ProgressCallback | None = None, token: str = "", grant: GrantCallback | None = None,
        decided: frozenset[str] = frozenset(), admitted: Callable[[], None] = lambda: None, principal: str = "",
    ) -> dict[str, Any]:
        try:
            if account.slots.locked():  # (a free slot is taken at once: no deadline to arm)
                async with asyncio.timeout_at(deadline):
                    await account.slots.acquire()
            else:
                await account.slots.acquire()
            admitted()
        except TimeoutError:
            metrics.limit_hit("account_workers")
            raise ToolError(TIMEOUT, "all workers of this account stayed busy", seconds=limit) from None
        worker: _Worker | None = None
        try:
            worker = await self._checkout(account, os_user, deadline, token, principal or os_user)
            reply = await self._exchange(worker, op, args, deadline, on_progress, grant)
        except ToolError as exc:  # the root helper refused a granted call
            if worker is None or exc.code not in decided:
                await self._fail(account, worker)
            else:
                worker.busy = False
                account.idle.append(worker)
                account.slots.release()
            raise
        except TimeoutError:
            await self._fail(account, worker)
            log.warning("worker %s timed out on %s after %.1f s", worker and worker.pid, op, limit)
            raise ToolError(TIMEOUT, f"the worker did not finish in {limit:g} s", seconds=limit) from None
        except (_Crashed, frames.FrameError, OSError) as exc:
            await self._fail(account, worker)
            log.warning("worker %s failed on %s: %s", worker and worker.pid, op, type(exc).__name__)
            if not await self._spawner.alive():  # the root helper died and took its workers along
                raise ToolError(HELPER_UNAVAILABLE, "the root helper is not running") from None
            raise ToolError(INTERNAL_ERROR, "worker crashed") from None
        except BaseException as exc:  # cancellation: answer nothing; the worker is drained or killed in the background
            if worker is None:
                account.slots.release()
            elif grant is not None or not isinstance(exc, asyncio.CancelledError) or \
                    not self._graced(account, worker, principal or os_user, deadline):
                self._retire(account, worker, release=True)
            raise
        worker.busy = False
        if self._closed or worker.retired:
            self._retire(account, worker, release=True)
        else:
            account.idle.append(worker)
            account.slots.release()
        if reply["ok"] is True:
            result: dict[str, Any] = reply["result"]
            return result
        raise ToolError.from_dict(reply.get("error"))

    async def _fail(self, account: _Account, worker: _Worker | None) -> None:
        if worker is None:
            account.slots.release()
            return
        task = self._retire(account, worker, release=True)
        if task is not None:
            await asyncio.wait({task}, timeout=REAP_GRACE)

    async def _checkout(self, account: _Account, os_user: str, deadline: float, token: str = "",
                        principal: str = "") -> _Worker:
        """An idle worker of ``account`` spawned with ``token`` (the most recently used), else a new
        one for ``token``, charged to ``principal``'s spawn bucket (``RATE_LIMITED`` when it is
        empty: nothing is started or retired). Two starts are not charged: one the spawner failed
        (it raised a :class:`ToolError` or ``OSError``: nothing started, the token is given back),
        and one that replaces a worker of ``account`` lost to a restart of the root helper (it
        ended on its own in an older :meth:`Spawner.generation`; at most ``per_account`` of them
        are remembered, so a restart frees at most the pool's own size, and workers killed
        between restarts, by their account's own processes say, are charged as ever). A worker of
        another token never serves the call
        (see :meth:`call`). When ``account`` already holds ``per_account`` workers (those still
        starting included), at least one of them is idle (this call holds one of the
        ``per_account`` slots) and of another token: the least recently used idle one is retired,
        and its reaping awaited (at most :data:`REAP_GRACE` s), before the new one is asked for.
        So a principal that uses several tokens is never refused for want of room while idle
        workers of its other tokens sit here, and its workers stay within ``per_account`` (and the
        policy process's bound on them)."""
        if self._closed:
            raise ToolError(INTERNAL_ERROR, "worker pool is closed")
        tag = token_tag(token)
        for worker in reversed(account.idle.copy()):
            if worker.channel.ended:  # died while idle
                self._retire(account, worker, release=False)
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
                room = self._retire(account, account.idle[0], release=False)
            async with asyncio.timeout_at(deadline):
                if room is not None:
                    await asyncio.wait({room}, timeout=REAP_GRACE)
                try:
                    sock, pid = await self._spawner.spawn(os_user, token)
                except (ToolError, OSError):  # nothing was started (refused, or no helper to ask)
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
                self._track(asyncio.get_running_loop().create_task(self._reap(pid, None, None)))
                raise
            worker = _Worker(pid=pid, channel=channel, tag=tag, busy=True, generation=generation)
            account.workers[pid] = worker
        finally:
            account.starting -= 1
        if self._closed:  # close() ran while this worker was starting: it must not outlive the pool
            self._retire(account, worker, release=False)
            raise ToolError(INTERNAL_ERROR, "worker pool is closed")
        return worker

    async def _exchange(
        self, worker: _Worker, op: str, args: bytes, deadline: float, on_progress: ProgressCallback | None,
        grant: GrantCallback | None = None,
    ) -> dict[str, Any]:
        worker.next_id += 1

        async def read_reply() -> dict[str, Any] | None:
            while True:
                frame = await read_reply_frame(worker.channel, self._reply_cap)
                if frame is None or "progress" not in frame or "ok" in frame:
                    return frame
                await self._forward_progress(worker, frame, on_progress)

        async with asyncio.timeout_at(deadline):
            if grant is not None:
                # The worker sends the helper its report before it sends its reply here, so the
                # grant (which the helper answers once the report is in its audit log) never waits
                # for this reply to be read: it is read after. Until then this socket is not
                # watched: the reply's arrival wakes no one, and it is read with the grant's answer
                # (a reply larger than the socket's buffer waits in the worker until then).
                worker.channel.hold(True)
                try:
                    await grant(worker.pid, worker.next_id)
                finally:
                    worker.channel.hold(False)
                reply = await read_reply()
            else:
                worker.channel.write(self._frame(worker.next_id, op, args, progress=on_progress is not None))
                reply = await read_reply()
        if reply is None:
            raise _Crashed("end of stream")
        ok = reply.get("ok")
        if reply.get("id") != worker.next_id or not isinstance(ok, bool):
            raise _Crashed("malformed reply")
        if ok and not isinstance(reply.get("result"), dict):
            raise _Crashed("malformed result")
        return reply

    @staticmethod
    async def _forward_progress(worker: _Worker, frame: dict[str, Any], on_progress: ProgressCallback | None) -> None:
        """Check one interim frame and hand it to ``on_progress``; a malformed one is a protocol break."""
        p = frame.get("progress")
        if on_progress is None or frame.get("id") != worker.next_id or not isinstance(p, dict):
            raise _Crashed("unexpected progress frame")
        done, total, message = p.get("done"), p.get("total"), p.get("message")
        if not isinstance(done, int) or not (total is None or isinstance(total, int)) or not isinstance(message, str):
            raise _Crashed("malformed progress frame")
        try:
            await on_progress(done, total, message)
        except Exception:
            log.exception("progress callback failed")

    def _graced(self, account: _Account, worker: _Worker, principal: str, deadline: float) -> bool:
        """Give ``worker``, whose call was cancelled after its request was sent, the cancel grace
        (SPEC §1.4: the job is stopped; a quick op is let finish instead, costing no new worker):
        :meth:`_drain` reads its reply in the background, at most ``workers.cancel_grace_seconds``
        and never past the call's ``deadline`` (loop seconds). Meanwhile the worker stays busy, keeps
        its call slot and counts as a call of ``principal``, so cancelling gets no more work run at
        once. Returns ``False`` (the caller kills it) when the grace is 0, the pool is closing, or
        ``principal`` was revoked while the call ran (:meth:`retire_owner`).

        Only the unprivileged route comes here: on the privileged one the root helper may still be
        handing the worker its job, so a cancelled granted call kills its worker."""
        grace = self._cfg.workers.cancel_grace_seconds
        if grace <= 0 or self._closed or worker.retired or worker.revoked:
            return False
        self._in_grace[principal] += 1
        loop = asyncio.get_running_loop()
        self._track(loop.create_task(self._drain(account, worker, principal, min(loop.time() + grace, deadline))))
        return True

    async def _drain(self, account: _Account, worker: _Worker, principal: str, end: float) -> None:
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
            self._in_grace[principal] -= 1
            if self._in_grace[principal] <= 0:
                del self._in_grace[principal]
            if replied and not (self._closed or worker.retired or worker.revoked):
                worker.busy = False
                account.idle.append(worker)
                account.slots.release()
            else:
                self._retire(account, worker, release=True)

    @staticmethod
    def _respawn_credit(account: _Account, generation: int) -> int | None:
        """Take one of ``account``'s workers lost to a restart (:attr:`_Account.lost`, of another
        generation than ``generation``, the spawner's now) and return its generation; ``None``
        when there is none (the start is charged to the bucket)."""
        for i, lost in enumerate(account.lost):
            if lost != generation:
                del account.lost[i]
                return lost
        return None

    def _retire(self, account: _Account, worker: _Worker, release: bool) -> asyncio.Task[None] | None:
        """Kill and reap ``worker`` in the background; release a call slot once it is reaped. A
        worker that had ended on its own (hung up; not revoked) is remembered in
        :attr:`_Account.lost`."""
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
        # a revoked token's worker, and one that hung up (it exited: the root helper has reaped or
        # will reap it), are dropped: a kill_worker with a token that no longer authenticates would
        # only be refused and recorded as an invalid token
        drop = worker.revoked or worker.channel.hung_up
        return self._track(asyncio.get_running_loop().create_task(self._reap(worker.pid, worker.channel, slots, drop)))

    def _track(self, task: asyncio.Task[None]) -> asyncio.Task[None]:
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
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

    async def close(self) -> None:
        """Kill and reap every worker; later calls raise ``INTERNAL_ERROR``. Idempotent.

        Calls in flight end with ``INTERNAL_ERROR`` (their workers are killed); a call still
        waiting for its spawner ends at the latest at its deadline, and close() returns after it.
        """
        self._closed = True
        self._account_freed.set()
        for account in self._accounts.values():
            for worker in list(account.workers.values()):
                self._retire(account, worker, release=False)
        self._accounts.clear()
        while self._retiring or self._inflight:
            if self._retiring:
                await asyncio.gather(*self._retiring, return_exceptions=True)
            else:
                self._quiet.clear()
                await self._quiet.wait()

