"""The budgets of outgoing bytes: what the front holds for clients that have not taken it yet,
by principal (``principal_queue_bytes``) and in all (``total_queue_bytes``), and the rule that
cuts a client that stopped reading once either is passed.

Charged here are the sessions' queues and streams (``session.py``), the ``/mcp`` POST event
streams and large ``/mcp`` answers (``mcpd.front.transport.answers``). :class:`Budgets` is the
half of :class:`~mcpd.front.sessions.table.SessionManager` that keeps them; each session's own
``session_queue_bytes`` is its backpressure (``backpressure.py``).

Against the same two budgets, apart from those (a client that stopped reading is cut for those;
one whose answers wait for room is not): the large answers made and not yet written, whose room
is reserved before they are made (:meth:`Budgets.reserve`), and the calls in hand whose answers
are not made yet (:meth:`Budgets.start_call`), so answers ready at once never pile up past them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from mcpd.common.config import Config
from mcpd.front import metrics
from mcpd.front.connections.handover import UNSEEN
from mcpd.front.mcp.jsonrpc import SERVER_BUSY, RpcError
from mcpd.front.sessions.backpressure import CALLS_AT_ONCE, Waiter

if TYPE_CHECKING:
    from mcpd.front.sessions.session import Session

log = logging.getLogger(__name__)

#: Seconds an answer waits for room (:meth:`Budgets.reserve`) while none of its principal's
#: answers moves (no piece written, none ended) before it is refused: its clients stopped reading.
STALL_SECONDS = 2.0

#: What each limit kind of a client that stopped reading says in the log.
FULL = {"queue_overflow": "outgoing queue full",
         "queue_bytes_per_principal": "its principal's outgoing bytes are over principal_queue_bytes",
         "queue_bytes_total": "all sessions' outgoing bytes are over total_queue_bytes"}


class OutgoingBytes:
    """The bytes of outgoing messages held for clients that have not taken them yet, by principal
    and in all, against two budgets (``principal_queue_bytes``, ``total_queue_bytes``): the
    sessions' queues and streams (:meth:`Session.send`), the ``/mcp`` POST event streams
    (:class:`~mcpd.front.transport.answers.PostStream`) and large ``/mcp`` answers
    (:meth:`Budgets.hold_answer`) charge what they hold here.

    Args:
        per_principal: bytes one principal's sessions and streams may hold together.
        total: bytes all of them may hold together.
    """

    __slots__ = ("per_principal", "budget", "total", "_held", "on_release")

    def __init__(self, per_principal: int, total: int) -> None:
        self.per_principal = per_principal
        self.budget = total
        self.total = 0
        self._held: dict[str, int] = {}
        #: called with the principal's name when bytes are released while answers wait for room
        #: (:meth:`Budgets.reserve`); ``None`` while none waits
        self.on_release: Callable[[str], None] | None = None

    def charge(self, name: str, delta: int) -> str | None:
        """Add ``delta`` bytes (negative: released) to principal ``name``'s count and the total.
        Returns, when they grew (``delta > 0``) past a budget, the limit kind to report
        (``"queue_bytes_per_principal"`` or ``"queue_bytes_total"``): the caller then gives up
        what it holds (releasing it here) as for a full queue; else ``None``."""
        held = self._held.get(name, 0) + delta
        if held > 0:
            self._held[name] = held
        else:
            self._held.pop(name, None)
        self.total += delta
        if delta < 0 and self.on_release is not None:
            self.on_release(name)
        if delta > 0:
            if held > self.per_principal:
                return "queue_bytes_per_principal"
            if self.total > self.budget:
                return "queue_bytes_total"
        return None

    def held(self, name: str) -> int:
        """The bytes principal ``name`` holds."""
        return self._held.get(name, 0)

    def holders(self) -> Iterator[tuple[str, int]]:
        """(principal, bytes held) for each principal holding some."""
        return iter(list(self._held.items()))


class AnswerConnection(Protocol):
    """The connection of a ``/mcp`` answer (the server's
    :class:`~mcpd.front.connections.handover.ConnectionOffer`; equal for every request of one connection)."""

    def unsent(self) -> int:
        """Bytes written to it that the client has not taken yet (``0`` once it is gone)."""

    def abort(self) -> None:
        """Drop it."""


class KeptAnswer:
    """A ``/mcp`` answer written whole whose connection still holds some of it
    (:meth:`Budgets.keep_answer`): its principal, its connection, and what is charged."""

    __slots__ = ("owner", "conn", "charged")

    def __init__(self, owner: str, conn: AnswerConnection) -> None:
        self.owner, self.conn = owner, conn
        self.charged = 0


class Budgets:
    """The outgoing bytes of the sessions in the table and of the ``/mcp`` answers, against the
    budgets (:attr:`outgoing`); the base of
    :class:`~mcpd.front.sessions.table.SessionManager`, whose sessions (``_sessions``) and
    keep-alive ticker (:meth:`stream_attached`, which measures the kept answers again) it uses.

    Args:
        cfg: the daemon config (``principal_queue_bytes``, ``total_queue_bytes``).
    """

    # the table's (mcpd.front.sessions.table.SessionManager)
    _sessions: dict[str, Session]

    def __init__(self, cfg: Config) -> None:
        #: outgoing bytes held by principal and in all (the sessions', /mcp POST streams' and answers')
        self.outgoing = OutgoingBytes(cfg.principal_queue_bytes, cfg.total_queue_bytes)
        #: what hold_answer counts of each answer being written (or POST stream), by principal and
        #: by what cuts it (its ``cut``)
        self._answers: dict[str, dict[Callable[[], None], int]] = {}
        #: the answers written whose connections still hold some of them (keep_answer), by connection
        self._kept: dict[AnswerConnection, KeptAnswer] = {}
        #: what a cut gave up of answers that their writers release later (by ``cut``: principal,
        #: bytes): still in ``outgoing`` until then, but no longer held for the total's rule
        self._leaving: dict[Callable[[], None], tuple[str, int]] = {}
        #: the bytes of large answers made and not yet written, by principal and in all, against
        #: the same budgets: room for each is reserved here before it is made (:meth:`reserve`),
        #: given back as it is handed to what holds it, which counts it here until it is written
        self.answering = OutgoingBytes(cfg.principal_queue_bytes, cfg.total_queue_bytes)
        #: the answers waiting for room to be made (reserve), by principal, oldest first; when
        #: each principal's bytes were last released; whether a grant is scheduled
        self._reserving: dict[str, list[Waiter]] = {}
        self._released: dict[str, float] = {}
        self._granting = False
        #: calls that may answer large a principal may have in hand at once (running, or their
        #: answer waiting for room); by principal, how many it has, and those waiting to start
        #: (none when ``max_calls_per_principal`` is as low: the pool bounds them then, refusing past it)
        self.calls_at_once = max(CALLS_AT_ONCE, cfg.workers.per_account)
        self._gated = self.calls_at_once < cfg.max_calls_per_principal
        self._calls: dict[str, int] = {}
        self._starting: dict[str, list[asyncio.Future[bool]]] = {}

    # -- calls in hand, whose answers are not made yet ---------------------------------------------

    def start_call_now(self, name: str) -> bool:
        """Count one call of principal ``name`` that may answer large (an unprivileged
        ``tools/call`` or ``resources/read``, run by its workers) as in hand, unless it has
        :attr:`calls_at_once` in hand (``workers.per_account``, at least 4: as many as its workers
        run at once) or a call of its waits to start already; whether it did (then
        :meth:`call_placed` ends it)."""
        held = self._calls.get(name, 0)
        if name in self._starting or (held >= self.calls_at_once and self._gated):
            return False
        self._calls[name] = held + 1
        return True

    async def start_call(self, name: str, seconds: float) -> None:
        """:meth:`start_call_now`, else wait, in arrival order, until one of the principal's calls
        in hand is placed (:meth:`call_placed`: its answer is handed on, or refused). So the
        answers a principal's workers made and that wait for room (:meth:`reserve`) never pile up
        past :attr:`calls_at_once`: a client calling faster than it reads is slowed down. The calls
        waiting here would wait for a worker anyway.

        Raises:
            RpcError: ``-32000`` once ``seconds`` passed without a start (the call is not run).
        """
        if self.start_call_now(name):
            return
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._starting.setdefault(name, []).append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), seconds)
        except TimeoutError:
            if not fut.done():
                fut.set_result(False)
            elif fut.result():  # (started just as its time ran out: it runs)
                return
            metrics.limit_hit("queue_bytes_per_principal")
            raise RpcError(SERVER_BUSY, f"this principal has {self.calls_at_once} calls whose answers are not taken "
                           f"yet; none of them ended within {seconds:g} s; this call was not run, retry later",
                           None) from None
        except asyncio.CancelledError:
            if not fut.done():
                fut.set_result(False)
            elif fut.result():
                self.call_placed(name)
            raise
        finally:
            waiting = self._starting.get(name)
            if waiting is not None and fut in waiting:
                waiting.remove(fut)
            if not waiting:
                self._starting.pop(name, None)

    def call_placed(self, name: str) -> None:
        """One call :meth:`start_call` counted has its answer placed (reserved, handed over, or
        none): the oldest call waiting to start, if any, starts in its stead."""
        for fut in self._starting.get(name, ()):
            if not fut.done():
                fut.set_result(True)
                return
        held = self._calls.get(name, 0) - 1
        if held > 0:
            self._calls[name] = held
        else:
            self._calls.pop(name, None)

    # -- room for an answer before it is made ------------------------------------------------------

    async def reserve(self, name: str, size: int, seconds: float) -> int:
        """Reserve room for an answer of about ``size`` bytes (its JSON, not made yet) in principal
        ``name``'s and the total budgets of answers made and not yet written (:attr:`answering`,
        bounded as :attr:`outgoing` is), before its bytes are made: so what the front holds of a
        principal's answers stays within ``principal_queue_bytes`` however many of them are ready
        at once (the reads of one held task result cost neither a worker nor quota).

        An answer of at most :data:`~mcpd.front.connections.handover.UNSEEN` bytes reserves
        nothing (``0``: it is charged by what holds it, as ever). A larger one waits, in arrival
        order among its principal's, until its bytes fit beside the principal's other answers and
        all principals'; the wait ends after ``seconds`` (the call's deadline) while the principal's
        answers moved, or once :data:`STALL_SECONDS` passed with none moving (its clients stopped
        reading: waiting on would only hold the call), and is refused then; nothing of it is made.

        Returns the bytes reserved, counted in :attr:`answering` until :meth:`unreserve` gives them
        back, which the caller does right before it hands the answer to what holds it (and
        counts it there until it is written), in the same step of the event loop. What the
        principal's clients have not taken (:attr:`outgoing`) is bounded apart, by cutting a
        client that stopped reading, as ever.

        Raises:
            RpcError: ``-32000`` when the answer can never fit (it is larger than
                ``principal_queue_bytes`` or ``total_queue_bytes``), or no room came in time.
        """
        if size <= UNSEEN:
            return 0
        answering = self.answering
        bound = min(answering.per_principal, answering.budget)
        if size > bound:
            metrics.limit_hit("queue_bytes_per_principal")
            raise RpcError(SERVER_BUSY, f"the answer (about {size} bytes) is larger than this principal's outgoing "
                           f"budget ({bound} bytes, principal_queue_bytes / total_queue_bytes) and can never be "
                           "sent; ask for less (a smaller max_results, a narrower root or pattern)",
                           {"size": size, "limit": bound})
        waiters = self._reserving.get(name)
        if not waiters and self._fits(name, size):
            answering.charge(name, size)
            return size
        loop = asyncio.get_running_loop()
        waiter = Waiter(size, 0, loop.create_future(), seconds)
        self._reserving.setdefault(name, []).append(waiter)
        answering.on_release = self._on_release
        waiter.timer = loop.call_later(min(STALL_SECONDS, seconds), self._expire_reserve, name, waiter,
                                       time.monotonic() + seconds)
        try:
            granted = await waiter.fut
        except asyncio.CancelledError:
            fut = waiter.fut
            if fut.done() and not fut.cancelled() and fut.result():  # granted, then cancelled
                self.unreserve(name, size)
            raise
        finally:
            if waiter.timer is not None:
                waiter.timer.cancel()
            left = self._reserving.get(name)
            if left is not None and waiter in left:
                left.remove(waiter)
            if not left:
                self._reserving.pop(name, None)
            if not self._reserving:
                answering.on_release = None
                self._released.clear()
        if not granted:
            metrics.limit_hit("queue_bytes_per_principal")
            log.warning("an answer of %s (about %d bytes): %s; refused before it was made", name, size,
                        FULL["queue_bytes_per_principal"])
            raise RpcError(SERVER_BUSY, f"no room in this principal's outgoing budget (principal_queue_bytes) for the "
                           f"answer (about {size} bytes): its clients are not taking their other answers; retry "
                           "later", {"size": size})
        return size

    def unreserve(self, name: str, size: int) -> None:
        """Give back what :meth:`reserve` reserved for principal ``name`` (``size`` bytes; 0: nothing)."""
        if size:
            self.answering.charge(name, -size)

    def _fits(self, name: str, size: int) -> bool:
        """Whether ``size`` more bytes of principal ``name``'s answers fit in both budgets now."""
        answering = self.answering
        return answering.held(name) + size <= answering.per_principal and answering.total + size <= answering.budget

    def _on_release(self, name: str) -> None:
        """Some bytes were released while answers wait for room: look again, once, soon (the
        releaser may be about to charge what it hands over in the same step)."""
        self._released[name] = time.monotonic()
        if not self._granting:
            self._granting = True
            asyncio.get_running_loop().call_soon(self._grant_reserve)

    def _grant_reserve(self) -> None:
        """Reserve room for the waiting answers that fit now, each principal's oldest first (one
        that does not fit holds back those behind it)."""
        self._granting = False
        for name, waiters in list(self._reserving.items()):
            for waiter in waiters:
                if waiter.fut.done():
                    continue
                if not self._fits(name, waiter.cost):
                    break
                self.answering.charge(name, waiter.cost)
                waiter.fut.set_result(True)

    def answer_moved(self, name: str) -> None:
        """Some of principal ``name``'s answer went out (a piece written): its waiting answers wait on."""
        if self._reserving:
            self._released[name] = time.monotonic()

    def _expire_reserve(self, name: str, waiter: Waiter, deadline: float) -> None:
        """``waiter``'s time is up (at ``deadline``, loop-independent ``time.monotonic()``, or
        once :data:`STALL_SECONDS` passed with none of principal ``name``'s answers moving, else
        it waits on from then): refuse it."""
        waiter.timer = None
        if waiter.fut.done():
            return
        now = time.monotonic()
        again = min(self._released.get(name, 0.0) + STALL_SECONDS, deadline) - now
        if again > 0:
            waiter.timer = asyncio.get_running_loop().call_later(again, self._expire_reserve, name, waiter, deadline)
            return
        waiter.fut.set_result(False)
        if not self._granting and self._reserving.get(name, [None])[0] is waiter:  # (those behind may fit)
            self._granting = True
            asyncio.get_running_loop().call_soon(self._grant_reserve)

    def stream_attached(self) -> None:
        """Start the keep-alive ticker unless it runs (the table's)."""
        raise NotImplementedError

    def still_over(self, name: str, measured: Session | None = None) -> str | None:
        """The bytes principal ``name`` holds grew past its or the total budget: measure afresh
        what the sessions' streams hold (it may have gone out since they were last measured; but
        ``measured``'s, just measured), and return the limit kind still passed
        (``"queue_bytes_per_principal"``, ``"queue_bytes_total"``), or ``None``. Only then: it
        reads every session.

        The total's rule: while it is passed, the principal holding the most gives up what it
        holds (:meth:`cut`); ``name`` when none other holds more (``"queue_bytes_total"`` is then
        returned for it to give up its own). So a principal holding at most ``total_queue_bytes``
        divided by the number of principals holding bytes is never cut for the total (were none
        holding more, all together would hold no more than the total). What a cut gave up and its
        writers have not released yet counts for no one (else the next charge would cut another
        principal for bytes already given up)."""
        for other in self._sessions.values():
            if other is not measured and other.stale():
                other.held()
        for kept in list(self._kept.values()):
            self._measure_kept(kept)
        outgoing = self.outgoing
        leaving: dict[str, int] = {}
        for owner, size in self._leaving.values():
            leaving[owner] = leaving.get(owner, 0) + size
        own = outgoing.held(name) - leaving.get(name, 0)
        if own > outgoing.per_principal:
            return "queue_bytes_per_principal"
        total, done = outgoing.total - sum(leaving.values()), {name}
        while total > outgoing.budget:
            top, most = max(((n, b - leaving.get(n, 0)) for n, b in outgoing.holders() if n not in done),
                            key=lambda nb: nb[1], default=("", 0))
            if most <= own:
                return "queue_bytes_total"
            done.add(top)
            total -= self.cut(top, "queue_bytes_total")
        return None

    def cut(self, name: str, kind: str) -> int:
        """Principal ``name``'s clients stopped reading (``kind``: the bound passed): close its
        sessions holding bytes and drop its answers and POST streams charged with a ``cut``
        (:meth:`hold_answer`) and its kept answers (:meth:`keep_answer`), each counted in
        ``limits_hit``. Returns the bytes this gives up: released now (sessions, kept answers, POST
        streams) or by their writers as they end (answers being written: counted as leaving until
        then, :meth:`still_over`)."""
        before = self.outgoing.held(name)
        for session in [s for s in self._sessions.values() if s.principal.name == name and s.held()]:
            session.overflow(kind)
        charged = self._answers.pop(name, {})
        for drop, size in charged.items():
            self._leaving[drop] = (name, size)
        drops = list(charged)
        for kept in [k for k in self._kept.values() if k.owner == name]:
            self._forget_kept(kept)
            drops.append(kept.conn.abort)
        for drop in drops:
            metrics.limit_hit(kind)
            log.warning("a POST's answer of %s: %s, dropping a client that stopped reading", name, FULL[kind])
            drop()
        # (a POST stream's cut released its bytes at once, through hold_answer: no longer leaving)
        return before - self.outgoing.held(name) + sum(self._leaving[d][1] for d in charged if d in self._leaving)

    def keep_answer(self, name: str, conn: AnswerConnection) -> str | None:
        """A ``/mcp`` answer was written whole (:class:`~mcpd.front.transport.answers.PiecedAnswer`) on ``conn``
        (the server's :class:`~mcpd.front.connections.handover.ConnectionOffer`): charge what the connection
        still holds (:meth:`AnswerConnection.unsent`) to principal ``name``'s and the total budgets
        while that is more than :data:`~mcpd.front.connections.handover.UNSEEN` bytes, measured again by the
        keep-alive ticker and before any cut for a budget; forgotten once it holds no more (or is
        gone). One answer kept per connection: a later one replaces it.

        Returns, when the charge passed a bound (:meth:`still_over`), its limit kind: the caller
        then drops the connection (nothing is kept); else ``None``."""
        held = conn.unsent()
        if held <= UNSEEN:  # (a client keeping up: nothing kept)
            return None
        kept = KeptAnswer(name, conn)
        earlier = self._kept.pop(conn, None)
        if earlier is not None:
            self._forget_kept(earlier)
        self._kept[conn] = kept
        self.stream_attached()  # (the ticker measures it again)
        if self._measure_kept(kept, held):
            kind = self.still_over(name)
            if kind is not None:
                self._forget_kept(kept)
                return kind
        return None

    def measure_kept(self) -> None:
        """Charge what each kept answer's connection holds now (the keep-alive ticker's round)."""
        for kept in list(self._kept.values()):
            self._measure_kept(kept)

    def _measure_kept(self, kept: KeptAnswer, held: int | None = None) -> bool:
        """Charge what ``kept``'s connection holds now (``held``, measured just now, or measured
        here) instead of what it held; forget it once that is at most
        :data:`~mcpd.front.connections.handover.UNSEEN`. Whether the charge passed a bound."""
        if held is None:
            held = kept.conn.unsent()
        if held <= UNSEEN:
            held = 0
        delta, kept.charged = held - kept.charged, held
        over = self.outgoing.charge(kept.owner, delta) is not None
        if not held:
            self._kept.pop(kept.conn, None)
        return over

    def _forget_kept(self, kept: KeptAnswer) -> None:
        """Release what ``kept`` is charged and forget it (its connection is dropped or gone)."""
        self._kept.pop(kept.conn, None)
        if kept.charged:
            self.outgoing.charge(kept.owner, -kept.charged)
            kept.charged = 0

    def hold_answer(self, name: str, delta: int, cut: Callable[[], None] | None = None) -> str | None:
        """Charge ``delta`` bytes (negative: released) of a ``/mcp`` answer its connection has not
        taken yet (:class:`~mcpd.front.transport.answers.PiecedAnswer`) to principal ``name``'s and the total
        budgets (:attr:`outgoing`). Not to the session's ``session_queue_bytes``: each answer has
        a connection of its own, and a client reading several large answers at once on one
        session is normal (each is held whole until its last piece is written, and a reader
        keeping up is behind for most of that time). ``cut``: drops the answer's connection (or
        cuts the POST stream); what is charged with it is counted for :meth:`cut`.

        Returns, when a charge (``delta > 0``) passed a bound, its limit kind
        (``"queue_bytes_per_principal"``, ``"queue_bytes_total"``: still passed once every stream
        was measured afresh and the total's rule applied, :meth:`still_over`); the caller then
        drops its connection and releases what it charged. Else ``None``."""
        if cut is not None and delta < 0 and cut in self._leaving:  # a release of what a cut gave up
            owner, size = self._leaving.pop(cut)
            if size + delta > 0:
                self._leaving[cut] = (owner, size + delta)
        elif cut is not None:
            answers = self._answers.setdefault(name, {})
            left = answers.get(cut, 0) + delta
            if left > 0:
                answers[cut] = left
            else:
                answers.pop(cut, None)
                if not answers:
                    del self._answers[name]
        if self.outgoing.charge(name, delta) is not None:
            return self.still_over(name)
        return None
