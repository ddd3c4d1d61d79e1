"""The front's side of the root helper (SPEC §4.1, §4.5a, §5; docs/PRIVSEP.md).

The front never decides anything privileged; it asks, always with the caller's token. Requests
travel over a few persistent connections (:class:`PolicyChannel`), multiplexed by ``id``: no
connection and no thread per request. A privileged call takes a persistent connection of its own
for its duration (the helper runs it on that connection's thread, with no hand-over). A helper
that dies fails the requests in flight (``HELPER_UNAVAILABLE``); the next request reconnects.

- :class:`PolicyAuthenticator`: token checks, with a short cache so a POST carrying its session's
  recently verified token needs no round trip.
- :class:`PolicySpawner`: workers for the token's principal (the helper binds each to it).
- :class:`PolicyBackend`: privileged calls. ``files/read``/``files/filetype`` run in the caller's
  own worker on a descriptor the helper passes it; ``files/list``/``files/find`` come back as the
  helper's raw metadata walk, formatted here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import itertools
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from mcpd.helper.wire import frames
from mcpd.helper.wire.errors import HELPER_UNAVAILABLE, INTERNAL_ERROR, PERMISSION_DENIED, RATE_LIMITED, TIMEOUT, ToolError
from mcpd.common import identity
from mcpd.common.identity import Principal
from mcpd.core import fileops
from mcpd.core.tools import DEADLINE_MARGIN, deadline_seconds
from mcpd.front import metrics
from mcpd.front.access import helper_received
from mcpd.front.auth import CheckerDown, TokenUndecided
from mcpd.front.limits import CAP_KEY
from mcpd.front.workers.channel import reply_result
from mcpd.front.workers.pool import WorkerPool

log = logging.getLogger("mcpd.front.policy_client")

_UNAVAILABLE = "privileged reads are unavailable: the root helper is not running"
CONNECTIONS = 4
#: privileged calls in flight at once; each has a connection of its own, on which the helper runs
#: it without handing it to another thread (so nothing else may wait behind it there)
CALL_CONNECTIONS = 12
#: call connections one principal may hold at once, so that one principal's hung calls (a
#: privileged find on a hung folder) never hold all of them: the other principals always find
#: ``CALL_CONNECTIONS - CALL_SHARE``. Beyond it a privileged list/find is refused ``RATE_LIMITED``
#: at once (it may hang a minute: queueing more behind hung ones only piles them up); a read or
#: filetype waits for one of its principal's own within its time (reads are short; a burst of one
#: principal's reads, more than its workers, queues here instead of failing).
CALL_SHARE = 8
#: token checks of tokens not verified lately (new or forged) in flight at once: fewer than the
#: helper takes (its "auth" class: 8 threads, 32 in flight), so known tokens always find room
UNKNOWN_CHECKS = 16
UNKNOWN_WAIT = 5.0  # seconds such a check waits for its turn before it is undecided (503)
PROBE_SECONDS = 3.0  # a health probe not answered within this is "the helper does not answer"
#: refusals decided before the helper touched the worker: the worker stays in the pool
_DECIDED = frozenset({PERMISSION_DENIED, "NOT_A_REGULAR_FILE", "FILE_NOT_FOUND", "INVALID_ARGUMENT"})


class PolicyUnavailable(Exception):
    """The helper socket is missing, refused, or closed before answering."""


class _Connection:
    """One persistent connection: frames out under a lock, frames (and descriptors) in by a reader."""

    def __init__(self, sock: socket.socket, reply_cap: int, on_lost: Callable[[], None] = lambda: None) -> None:
        self.sock, self.reply_cap, self.on_lost = sock, reply_cap, on_lost
        self.pending: dict[int, asyncio.Future[tuple[dict[str, Any], list[socket.socket]]]] = {}
        self.closed = False
        self._buf = bytearray()
        self._fds: list[int] = []
        self._loop = asyncio.get_running_loop()
        self._write = asyncio.Lock()
        self._loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, frames.READ_CHUNK, 4)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        self._fds += fds
        if not data:
            return self.close(lost=True)
        self._buf += data
        try:
            while (body := frames.take_frame(self._buf, self.reply_cap)) is not None:
                reply = frames.decode_body(body)
                n = reply.pop("fds", 0)
                n = n if isinstance(n, int) and 0 <= n <= len(self._fds) else 0
                got, self._fds = [socket.socket(fileno=fd) for fd in self._fds[:n]], self._fds[n:]
                fut = self.pending.pop(reply.get("id"), None)  # type: ignore[arg-type]
                if fut is not None and not fut.done():
                    fut.set_result((reply, got))
                else:
                    for s in got:
                        s.close()
        except frames.FrameError:
            log.error("malformed frame from the root helper; reconnecting")
            self.close(lost=True)

    async def send(self, req: dict[str, Any]) -> None:
        data = frames.encode(req)
        async with self._write:
            await self._loop.sock_sendall(self.sock, data)

    def close(self, lost: bool = False) -> None:
        """Close the connection (idempotent) and fail its requests in flight; ``lost``: the helper
        ended it (end of stream, an error, a broken frame), not the front (then ``on_lost``)."""
        if self.closed:
            return
        self.closed = True
        if lost:
            self.on_lost()
        self._loop.remove_reader(self.sock.fileno())
        self.sock.close()
        for fd in self._fds:
            os.close(fd)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(PolicyUnavailable("the helper closed the connection"))
        self.pending.clear()


class OverShare(Exception):
    """The principal already holds its share (:data:`CALL_SHARE`) of the call connections."""


class NoConnection(Exception):
    """No call connection came free within the time the call could wait; :attr:`own`: the
    principal's own calls held its whole share then (else the calls of all held them all)."""

    def __init__(self, own: bool) -> None:
        super().__init__(own)
        self.own = own


class CallLease:
    """One exclusive call connection held for one principal's privileged call (:meth:`PolicyChannel.lease`):
    at most one request is sent on it; it goes back to the idle connections after an answered
    request or none, and is closed after a request that was not answered (the helper may still be
    working on it: nothing else may go on that connection)."""

    def __init__(self, conn: _Connection) -> None:
        self.conn, self.reusable = conn, True


class PolicyChannel:
    """Requests to the root helper at ``path``, multiplexed over :data:`CONNECTIONS` persistent
    connections (round robin), each request with its own ``id``; privileged calls each on one of
    at most :data:`CALL_CONNECTIONS` more, kept open between calls, of which one principal holds
    at most :data:`CALL_SHARE` (see :meth:`lease`).

    Args:
        path: the helper's Unix socket (``helper_socket`` in mcpd.yaml).
        reply_cap: the largest reply frame accepted, in bytes.
        connect_timeout: seconds to wait for a connection.
    """

    def __init__(self, path: str, reply_cap: int, connect_timeout: float = 5.0) -> None:
        self.path, self.reply_cap, self.connect_timeout = path, reply_cap, connect_timeout
        self._conns: list[_Connection | None] = [None] * CONNECTIONS
        self._ids = itertools.count(1)
        self._next = itertools.count()
        self._connecting = asyncio.Lock()
        self._leased = 0  # call connections held by calls now
        self._held: collections.Counter[str] = collections.Counter()  # principal -> call connections it holds
        self._freed = asyncio.Event()  # set when a call connection is given back
        self._idle: list[_Connection] = []  # exclusive connections free for the next privileged call
        self._busy: set[_Connection] = set()
        #: connections the helper ended (it died, or broke a frame): the pool's spawner generation
        self.losses = 0
        self._answered: int | None = None  # losses when the last probe was answered (None: it was not)

    @property
    def up(self) -> bool:
        """Whether the helper answers: its last :meth:`probe` got an answer and no connection has
        been lost since (the metrics' ``mcpd_helper_up`` and ``/healthz``; with metrics on, the
        server probes every second). A connection alone says nothing: under socket activation
        systemd accepts connections while no helper runs."""
        return self._answered == self.losses

    async def probe(self) -> bool:
        """One round trip to the policy process (the check of an empty token: no audit record),
        at most :data:`PROBE_SECONDS`; return :attr:`up`. Never raises: a helper that is not
        there, or does not answer in time, is ``False``."""
        try:
            reply, fds = await self.request({"type": "authenticate", "token": ""}, timeout=PROBE_SECONDS)
        except (PolicyUnavailable, TimeoutError):
            self._answered = None
            return False
        for s in fds:
            s.close()
        self._answered = self.losses
        return self.up

    async def _open(self) -> _Connection:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await asyncio.get_running_loop().sock_connect(sock, self.path)
        except (OSError, TimeoutError) as exc:
            sock.close()
            raise PolicyUnavailable(str(exc)) from None
        return _Connection(sock, self.reply_cap, self._lost)

    def _lost(self) -> None:
        self.losses += 1

    async def _connection(self) -> _Connection:
        i = next(self._next) % CONNECTIONS
        conn = self._conns[i]
        if conn is not None and not conn.closed:
            return conn
        async with self._connecting:
            conn = self._conns[i]
            if conn is None or conn.closed:
                conn = self._conns[i] = await self._open()
            return conn

    @contextlib.asynccontextmanager
    async def lease(self, owner: str, wait: float, queue: bool = True) -> AsyncIterator[CallLease]:
        """Hold one exclusive call connection for a privileged call of principal ``owner``
        (``async with channel.lease(name, seconds) as lease``), for :meth:`request` ``lease=``.

        The rule (no principal takes the helper's capacity from the others): at most
        :data:`CALL_CONNECTIONS` are held at once, and one principal holds at most
        :data:`CALL_SHARE` of them, so others always find some. A call that finds all taken, or
        its principal's share taken, waits for one, at most ``wait`` seconds; with ``queue``
        false, a call of a principal holding its share is refused at once instead.

        Raises:
            OverShare: ``owner`` holds :data:`CALL_SHARE` connections and ``queue`` is false.
            NoConnection: none came free within ``wait`` seconds.
            PolicyUnavailable: no helper to connect to.
        """
        if not queue and self._held[owner] >= CALL_SHARE:
            raise OverShare(owner)
        if self._leased >= CALL_CONNECTIONS or self._held[owner] >= CALL_SHARE:
            try:
                async with asyncio.timeout(max(wait, 0.0)):
                    while self._leased >= CALL_CONNECTIONS or self._held[owner] >= CALL_SHARE:
                        self._freed.clear()
                        await self._freed.wait()
            except TimeoutError:
                raise NoConnection(self._held[owner] >= CALL_SHARE) from None
        self._leased += 1
        self._held[owner] += 1
        lease: CallLease | None = None
        try:
            conn = None
            while self._idle and conn is None:
                conn = self._idle.pop()
                conn = None if conn.closed else conn
            lease = CallLease(conn or await self._open())
            self._busy.add(lease.conn)
            yield lease
        finally:
            self._leased -= 1
            self._held[owner] -= 1
            if self._held[owner] <= 0:
                del self._held[owner]
            if lease is not None:
                self._busy.discard(lease.conn)
                if lease.reusable and not lease.conn.closed:
                    self._idle.append(lease.conn)
                else:
                    lease.conn.close()
            self._freed.set()

    async def request(self, req: dict[str, Any], timeout: float, lease: CallLease | None = None,
                      delivered: Callable[[bool], None] | None = None) -> tuple[dict[str, Any], list[socket.socket]]:
        """Send ``req`` (an ``id`` is added) and return ``(reply, sockets passed with it)``.

        ``lease``: send it on that call connection (privileged calls, see :meth:`lease`),
        otherwise on a shared one. ``delivered``: called with ``True`` once the whole request is
        in the helper's socket (the policy process reads it: it records what it received), and
        with ``False`` when the helper then closes the connection without answering (it may have
        ended before recording it). Never called when the request did not leave.

        Raises:
            PolicyUnavailable: no helper, or it closed the connection without a reply.
            TimeoutError: no reply within ``timeout`` seconds.
        """
        if lease is None:
            return await self._exchange(await self._connection(), req, timeout, delivered)
        if not lease.reusable:
            raise PolicyUnavailable("one request per call connection")
        lease.reusable = False  # until answered: the helper may still be working on it
        result = await self._exchange(lease.conn, req, timeout, delivered)
        lease.reusable = True
        return result

    async def _exchange(self, conn: _Connection, req: dict[str, Any], timeout: float,
                        delivered: Callable[[bool], None] | None = None) -> tuple[dict[str, Any], list[socket.socket]]:
        rid = next(self._ids)
        fut: asyncio.Future[tuple[dict[str, Any], list[socket.socket]]] = asyncio.get_running_loop().create_future()
        conn.pending[rid] = fut
        try:
            await conn.send(dict(req, id=rid))
            if delivered is not None:
                delivered(True)
            try:
                async with asyncio.timeout(timeout):
                    return await fut
            except PolicyUnavailable:
                if delivered is not None:
                    delivered(False)
                raise
        except OSError as exc:
            conn.close(lost=True)
            raise PolicyUnavailable(str(exc)) from None
        finally:
            conn.pending.pop(rid, None)

    async def ask(self, req: dict[str, Any], timeout: float, lease: CallLease | None = None,
                  delivered: Callable[[bool], None] | None = None) -> dict[str, Any]:
        """:meth:`request` for replies that carry no descriptors; a refusal raises its ToolError.

        Raises:
            ToolError: the helper's refusal; ``HELPER_UNAVAILABLE`` when it is down or too slow.
        """
        try:
            reply, fds = await self.request(req, timeout, lease, delivered)
        except PolicyUnavailable:
            raise ToolError(HELPER_UNAVAILABLE, _UNAVAILABLE) from None
        except TimeoutError:
            raise ToolError(HELPER_UNAVAILABLE, "the root helper did not answer in time") from None
        for s in fds:
            s.close()
        if not reply.get("ok"):
            raise ToolError.from_dict(reply.get("error")) if reply.get("error") else ToolError(
                PERMISSION_DENIED, "permission denied")
        return reply

    def close(self) -> None:
        """Close every connection (requests in flight fail with :class:`PolicyUnavailable`)."""
        for conn in [*self._conns, *self._idle, *self._busy]:
            if conn is not None:
                conn.close()
        self._idle.clear()


class PolicySpawner:
    """A :class:`mcpd.front.workers.spawner.Spawner` whose workers the root helper starts for the principal
    of the token given, as that principal's OS account (DESIGN.md "worker")."""

    def __init__(self, channel: PolicyChannel) -> None:
        self._channel = channel
        self._tokens: dict[int, str] = {}  # pid -> the token that started it (needed to kill it)

    async def spawn(self, os_user: str, token: str = "") -> tuple[socket.socket, int]:
        """Start one worker for the principal of ``token`` (``os_user`` is only the pool's key).

        Raises:
            ToolError: ``HELPER_UNAVAILABLE`` when the helper is down, or its refusal
                (``PERMISSION_DENIED`` for a bad token or a root account).
        """
        try:
            reply, socks = await self._channel.request({"type": "spawn_worker", "token": token}, timeout=30)
        except (PolicyUnavailable, TimeoutError):
            raise ToolError(HELPER_UNAVAILABLE, "cannot start a worker: the root helper is not running") from None
        pid = reply.get("pid")
        if not reply.get("ok") or len(socks) != 1 or not isinstance(pid, int):
            for s in socks:
                s.close()
            if reply.get("error"):
                raise ToolError.from_dict(reply["error"])
            raise ToolError(INTERNAL_ERROR, "internal error")
        self._tokens[pid] = token
        return socks[0], pid

    def generation(self) -> int:
        """:attr:`PolicyChannel.losses`: it changes when the helper's connections were lost, as
        when the root helper or its policy process died (and every worker with it)."""
        return self._channel.losses

    async def alive(self) -> bool:
        """Whether the helper answers now: one round trip (an empty token's check), so a helper
        that is dying this very moment counts as gone."""
        try:
            await self._channel.request({"type": "authenticate", "token": ""}, timeout=2)
        except (PolicyUnavailable, TimeoutError):
            return False
        return True

    async def kill(self, pid: int) -> None:
        """Ask the helper to SIGKILL worker ``pid`` (with the token that started it); a refusal or a
        down helper is logged: the worker still ends when its socket closes."""
        token = self._tokens.pop(pid, "")
        try:
            await self._channel.ask({"type": "kill_worker", "token": token, "pid": pid}, timeout=10)
        except ToolError as exc:
            log.warning("could not kill worker %d: %s", pid, exc.message)

    async def drop(self, pid: int) -> None:
        """Forget worker ``pid``, whose token no longer authenticates or which hung up: the policy
        process kills a revoked token's workers itself within about a second (and a worker exits
        at once on its closed socket) and reaps every worker that exits; a ``kill_worker`` with a
        token that no longer authenticates would only be refused and recorded as an invalid token."""
        self._tokens.pop(pid, None)


class PolicyAuthenticator:
    """An :class:`mcpd.front.auth.Authenticator` that asks the helper (which alone reads the tokens).

    Args:
        channel: the helper channel.
        cache_seconds: while the helper is unreachable, a token it verified within this many
            seconds is still accepted (default 30). A refused token is dropped at once.
        fresh_seconds: a token verified within this many seconds is accepted without asking
            again (the session re-check keeps open sessions' tokens fresh every second).

    The cache key is a SHA-256 of the token; the token itself is never kept. A token that is not
    even well-formed (``mcpd_<id>_<secret>``) is refused here, without asking. Tokens the helper
    has not verified lately (unknown to the cache: a new token, or a forged one) are checked at
    most :data:`UNKNOWN_CHECKS` at a time, so a flood of forged tokens never takes the helper's
    whole capacity for token checks: the re-checks of open sessions and known tokens always find
    room. A check the helper could not make (it answered "busy", or no room came within
    :data:`UNKNOWN_WAIT` seconds) decides nothing: :class:`~mcpd.front.auth.TokenUndecided`,
    unless the token was verified within ``cache_seconds``; nor does one it could not make because
    it is not running (:class:`~mcpd.front.auth.CheckerDown`, answered 503, never 401).
    """

    def __init__(self, channel: PolicyChannel, cache_seconds: float = 30.0, fresh_seconds: float = 2.0) -> None:
        self._channel = channel
        self._cache_seconds = cache_seconds
        self._fresh_seconds = fresh_seconds
        self._cache: dict[str, tuple[float, Principal]] = {}
        self._unknown = asyncio.Semaphore(UNKNOWN_CHECKS)

    async def authenticate(self, token: str, fresh: bool = False) -> Principal | None:
        """The token's principal, or ``None`` (the front answers 401) for a malformed token or one
        the helper refused. ``fresh`` forces a helper round trip (stream opening, the
        once-a-second re-check).

        Raises:
            CheckerDown: the helper is not running (its socket refuses, or it closed the
                connection without an answer) and the token was not verified within
                ``cache_seconds``: no token is called bad because its checker is down.
            TokenUndecided: the helper is busy (or unknown tokens' checks are all taken) and the
                token was not verified within ``cache_seconds``.
        """
        if not identity.TOKEN_RE.match(token):
            return None  # the helper would refuse it, and take a malformed request for an attack
        key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        cached = self._cache.get(key)
        age = time.monotonic() - cached[0] if cached else None
        if cached and not fresh and age is not None and age <= self._fresh_seconds:
            return cached[1]
        recent = cached[1] if cached and age is not None and age <= self._cache_seconds else None
        gate = self._unknown if cached is None else None
        reply: dict[str, Any] | None = None
        try:
            if gate is not None:
                async with asyncio.timeout(UNKNOWN_WAIT):
                    await gate.acquire()
            try:
                reply, _ = await self._channel.request({"type": "authenticate", "token": token}, timeout=10)
            finally:
                if gate is not None:
                    gate.release()
        except PolicyUnavailable:
            if recent is None:  # the helper is down: past the short window nothing is accepted (fail
                raise CheckerDown("the root helper is not running")  # closed), nor refused as bad
            return recent
        except TimeoutError:
            pass  # no answer in time: undecided, as below
        if reply is None or (not reply.get("ok") and reply.get("error")):  # not a refusal: busy or too slow
            if recent is None:
                raise TokenUndecided("the token could not be checked now")
            return recent
        p = reply.get("principal")
        if not reply.get("ok") or not isinstance(p, dict):
            self._cache.pop(key, None)
            return None
        try:
            principal = Principal(name=str(p["name"]), os_user=str(p["os_user"]), token_id=str(p["token_id"]))
        except KeyError:
            return None
        if len(self._cache) > 10000:
            self._cache.clear()
        self._cache[key] = (time.monotonic(), principal)
        return principal


class PolicyBackend:
    """The :class:`mcpd.front.privileged.PrivilegedBackend` that forwards to the root helper.

    Args:
        channel: the helper channel.
        pool: the worker pool; content calls run in the caller's own worker.
        timeout: seconds to wait for the helper's answer (its deadline plus margin).
        per_principal: privileged calls one principal may have in flight at once (SPEC §1.7), so
            no principal takes the helper's capacity from the others; beyond it ``RATE_LIMITED``.
    """

    def __init__(self, channel: PolicyChannel, pool: WorkerPool, timeout: float, per_principal: int = 32) -> None:
        self._channel, self._pool, self._timeout = channel, pool, timeout
        self._per_principal = per_principal
        self._in_flight: collections.Counter[str] = collections.Counter()

    async def call(
        self, token: str, principal: Principal, session_id: str, peer: str, op: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        """Run one privileged call; return the op's result dict.

        Raises:
            ToolError: the helper's refusal or failure; ``HELPER_UNAVAILABLE`` when it is down;
                ``RATE_LIMITED`` when the principal already has ``per_principal`` calls in flight
                or holds :data:`CALL_SHARE` call connections; ``TIMEOUT`` when no call connection
                came free within the call's time (the helper never received it).
        """
        if self._in_flight[principal.name] >= self._per_principal:
            metrics.limit_hit("privileged_per_principal")
            raise ToolError(RATE_LIMITED, f"{self._per_principal} privileged calls of this principal are in flight; "
                            "retry when one ends", limit=self._per_principal)
        self._in_flight[principal.name] += 1
        try:
            return await self._call(token, principal, session_id, peer, op, args)
        finally:
            self._in_flight[principal.name] -= 1
            if self._in_flight[principal.name] <= 0:
                del self._in_flight[principal.name]

    async def _call(
        self, token: str, principal: Principal, session_id: str, peer: str, op: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        args = dict(args)
        cap = args.pop(CAP_KEY, None)  # the principal's max_file_bytes (mcpd/front/limits.py)
        req: dict[str, Any] = {"type": "privileged_call", "token": token, "session": session_id, "peer": peer[:100],
                               "op": op, "args": args}
        if cap is not None:
            req["cap"] = cap
        timeout = max(self._timeout, deadline_seconds(args, 0.0) + 2 * DEADLINE_MARGIN)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        walk = op in ("files/list", "files/find")
        try:  # a walk may hang for a minute: one past the share is refused, not queued behind the hung ones
            async with self._channel.lease(principal.name, timeout, queue=not walk) as lease:
                left = max(end - loop.time(), 0.001)  # the wait for a connection is part of the call's time
                if walk:
                    raw = (await self._channel.ask(req, left, lease, helper_received))["result"]
                    return fileops.format_list(raw) if op == "files/list" else fileops.format_find(raw)

                job = dict(args, **({CAP_KEY: cap} if cap else {}))
                async with self._pool.lease(principal.os_user, op, job, token=token, owner=principal.name,
                                            timeout=left, decided=_DECIDED) as worker:
                    await self._channel.ask(dict(req, worker=worker.pid, rid=worker.rid), left, lease, helper_received)
                    reply = await worker.reply()
                return reply_result(reply)
        except OverShare:
            metrics.limit_hit("privileged_per_principal")
            raise ToolError(RATE_LIMITED, f"{CALL_SHARE} privileged calls of this principal are holding connections "
                            f"to the root helper (its share of {CALL_CONNECTIONS}); retry when one ends",
                            limit=CALL_SHARE) from None
        except NoConnection as exc:
            metrics.limit_hit("helper_connections")
            held = f"this principal's privileged calls hold its share ({CALL_SHARE})" if exc.own else \
                f"privileged calls in flight hold all {CALL_CONNECTIONS}"
            raise ToolError(TIMEOUT, f"no connection to the root helper came free within {timeout:g} s: {held}",
                            seconds=timeout) from None
        except PolicyUnavailable:
            raise ToolError(HELPER_UNAVAILABLE, _UNAVAILABLE) from None
