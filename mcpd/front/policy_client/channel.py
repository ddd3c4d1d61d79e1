"""The connections to the policy process (docs/PRIVSEP.md): requests multiplexed by ``id`` over
a few persistent connections (no connection and no thread per request), and one exclusive call
connection per privileged call, held for its duration (the policy process runs it on that
connection's thread, with no hand-over), with each principal's share of them bounded.

A policy process that dies fails the requests in flight (:class:`PolicyUnavailable`); the next
request reconnects. What is asked is the callers' business (:mod:`.authenticator`,
:mod:`.spawner`, :mod:`.backend`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

from mcpd.common import frames
from mcpd.common.inflight import InFlight
from mcpd.helper.wire.errors import HELPER_UNAVAILABLE, PERMISSION_DENIED, ToolError

log = logging.getLogger(__name__)

UNAVAILABLE = "privileged reads are unavailable: the policy process is not reachable"
CONNECTIONS = 4
#: privileged calls in flight at once; each has a connection of its own, on which the policy
#: process runs it without handing it to another thread (so nothing else may wait behind it there)
CALL_CONNECTIONS = 12
#: call connections one principal may hold at once, so that one principal's hung calls (a
#: privileged find on a hung folder) never hold all of them: the other principals always find
#: ``CALL_CONNECTIONS - CALL_SHARE``. Beyond it a privileged list/find is refused ``RATE_LIMITED``
#: at once (it may hang a minute: queueing more behind hung ones only piles them up); a read or
#: filetype waits for one of its principal's own within its time (reads are short; a burst of one
#: principal's reads, more than its workers, queues here instead of failing).
CALL_SHARE = 8
PROBE_SECONDS = 3.0  # a health probe not answered within this is "the policy process does not answer"


class PolicyUnavailable(Exception):
    """The policy process's socket is missing, refused, or closed before answering."""


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
            log.error("malformed frame from the policy process; reconnecting")
            self.close(lost=True)

    async def send(self, req: dict[str, Any]) -> None:
        data = frames.encode(req)
        async with self._write:
            await self._loop.sock_sendall(self.sock, data)

    def close(self, lost: bool = False) -> None:
        """Close the connection (idempotent) and fail its requests in flight; ``lost``: the policy
        process ended it (end of stream, an error, a broken frame), not the front (then ``on_lost``)."""
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
                fut.set_exception(PolicyUnavailable("the policy process closed the connection"))
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
    request or none, and is closed after a request that was not answered (the policy process may
    still be working on it: nothing else may go on that connection)."""

    def __init__(self, conn: _Connection) -> None:
        self.conn, self.reusable = conn, True


class PolicyChannel:
    """Requests to the policy process at ``path``, multiplexed over :data:`CONNECTIONS` persistent
    connections (round robin), each request with its own ``id``; privileged calls each on one of
    at most :data:`CALL_CONNECTIONS` more, kept open between calls, of which one principal holds
    at most :data:`CALL_SHARE` (see :meth:`lease`).

    Args:
        path: the policy process's Unix socket (``helper_socket`` in mcpd.yaml).
        reply_cap: the largest reply frame accepted, in bytes.
        connect_timeout: seconds to wait for a connection.
    """

    def __init__(self, path: str, reply_cap: int, connect_timeout: float = 5.0) -> None:
        self.path, self.reply_cap, self.connect_timeout = path, reply_cap, connect_timeout
        self._conns: list[_Connection | None] = [None] * CONNECTIONS
        self._ids = itertools.count(1)
        self._next = itertools.count()
        self._connecting = asyncio.Lock()
        self.calls = InFlight(CALL_SHARE, CALL_CONNECTIONS)  # call connections held, in all and per principal
        self._freed = asyncio.Event()  # set when a call connection is given back
        self._idle: list[_Connection] = []  # exclusive connections free for the next privileged call
        self._busy: set[_Connection] = set()
        #: connections the policy process ended (it died, or broke a frame): the pool's spawner generation
        self.losses = 0
        self._answered: int | None = None  # losses when the last probe was answered (None: it was not)

    @property
    def up(self) -> bool:
        """Whether the policy process answers: its last :meth:`probe` got an answer and no connection has
        been lost since (the metric ``mcpd_helper_up`` and ``/healthz``; with metrics on, the
        server probes every second). A connection alone says nothing: under socket activation
        systemd accepts connections while no policy process runs."""
        return self._answered == self.losses

    async def probe(self) -> bool:
        """One round trip to the policy process (the check of an empty token: no audit record),
        at most :data:`PROBE_SECONDS`; return :attr:`up`. Never raises: a policy process
        that is not there, or does not answer in time, is ``False``."""
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

        The rule (no principal takes the policy process's capacity from the others): at most
        :data:`CALL_CONNECTIONS` are held at once, and one principal holds at most
        :data:`CALL_SHARE` of them, so others always find some. A call that finds all taken, or
        its principal's share taken, waits for one, at most ``wait`` seconds; with ``queue``
        false, a call of a principal holding its share is refused at once instead.

        Raises:
            OverShare: ``owner`` holds :data:`CALL_SHARE` connections and ``queue`` is false.
            NoConnection: none came free within ``wait`` seconds.
            PolicyUnavailable: no policy process to connect to.
        """
        calls = self.calls
        if not queue and calls.held(owner) >= CALL_SHARE:
            raise OverShare(owner)
        if calls.over(owner) is not None:
            try:
                async with asyncio.timeout(max(wait, 0.0)):
                    while calls.over(owner) is not None:
                        self._freed.clear()
                        await self._freed.wait()
            except TimeoutError:
                raise NoConnection(calls.held(owner) >= CALL_SHARE) from None
        calls.add(owner)
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
            calls.release(owner)
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
        in the policy process's socket (it reads it: it records what it received), and
        with ``False`` when it then closes the connection without answering (it may have
        ended before recording it). Never called when the request did not leave.

        Raises:
            PolicyUnavailable: no policy process, or it closed the connection without a reply.
            TimeoutError: no reply within ``timeout`` seconds.
        """
        if lease is None:
            return await self._exchange(await self._connection(), req, timeout, delivered)
        if not lease.reusable:
            raise PolicyUnavailable("one request per call connection")
        lease.reusable = False  # until answered: the policy process may still be working on it
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
            ToolError: the policy process's refusal; ``HELPER_UNAVAILABLE`` when it is down or too slow.
        """
        try:
            reply, fds = await self.request(req, timeout, lease, delivered)
        except PolicyUnavailable:
            raise ToolError(HELPER_UNAVAILABLE, UNAVAILABLE) from None
        except TimeoutError:
            raise ToolError(HELPER_UNAVAILABLE, "the policy process did not answer in time") from None
        for s in fds:
            s.close()
        if not reply.get("ok"):
            raise frames.reply_error(reply.get("error")) if reply.get("error") else ToolError(
                PERMISSION_DENIED, "permission denied")
        return reply

    def close(self) -> None:
        """Close every connection (requests in flight fail with :class:`PolicyUnavailable`)."""
        for conn in [*self._conns, *self._idle, *self._busy]:
            if conn is not None:
                conn.close()
        self._idle.clear()


