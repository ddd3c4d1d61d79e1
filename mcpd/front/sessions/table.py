"""The table of live sessions, one for both transports (``GET /sse`` and ``/mcp``): opening
them within ``max_sessions`` and ``max_sessions_per_principal``, finding one for its owner,
evicting and expiring idle ``/mcp`` sessions, the one keep-alive ticker of every stream, and
giving closed sessions' memory back.

One table, so every per-session rule counts both transports together, and the once-a-second
token re-check (``mcpd.front.revalidate``) closes both. A session itself is ``session.py``; the
outgoing-byte budgets the table keeps are its base, ``budgets.py``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import secrets
import time

from mcpd.common.config import Config
from mcpd.common.identity import Principal
from mcpd.front import metrics
from mcpd.front.heap import trim_heap
from mcpd.front.mcp.dispatcher import Dispatcher
from mcpd.front.sessions.budgets import Budgets
from mcpd.front.sessions.session import Session

log = logging.getLogger(__name__)

#: A session id: 32 lowercase hex digits (16 random bytes).
SESSION_ID_RE = re.compile(r"[0-9a-f]{32}")


def tick_seconds(keepalive: float) -> float:
    """How often the keep-alive ticker looks at the streams: a quarter of ``keepalive`` (seconds),
    at most once a second."""
    return min(1.0, keepalive / 4)


TRIM_AFTER = 32  # sessions closed before the heap is trimmed (SessionManager.give_back_memory)
TRIM_QUIET = 0.5  # seconds without a close before it is


class SessionRefused(Exception):
    """No session may be opened: ``status`` is ``503`` (``max_sessions`` open in all) or ``429``
    (the principal holds ``max_sessions_per_principal``); ``reason`` is the answer's text."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _last_active(session: Session) -> float:
    """When ``session`` last had a request come or a request's handling end (``time.monotonic()``)."""
    return max(session.last_active, session.protocol.last_done)


class SessionManager(Budgets):
    """The table of live sessions, capped at ``max_sessions`` in all and at
    ``max_sessions_per_principal`` for each principal, both transports counted together
    (docs/REFERENCE.md §1.4, §1.7).

    Args:
        cfg: the daemon config (``max_sessions``, ``session_queue_size``, ``session_queue_bytes``,
            ``principal_queue_bytes``, ``total_queue_bytes``).
        dispatcher: shared by every session.
    """

    def __init__(self, cfg: Config, dispatcher: Dispatcher) -> None:
        self._cfg = cfg
        self._dispatcher = dispatcher
        self._sessions: dict[str, Session] = {}
        #: seconds a request waits for room in its session's queue before it is refused, and how
        #: many requests, holding about how many bytes together, may wait in one session
        self.admit_seconds = cfg.workers.timeout_seconds
        self.max_waiting, self.waiting_bytes = cfg.max_in_flight, cfg.max_body_bytes
        #: seconds a client may take nothing while its session's queue is full before it is disconnected
        self.stall_seconds = cfg.connections.idle_seconds
        self.closed_since_trim = 0  # sessions closed since the heap was last trimmed
        self._last_close = 0.0  # time.monotonic() of the last close
        self._ticker: asyncio.TimerHandle | None = None
        super().__init__(cfg)  # the outgoing-byte budgets (Budgets)

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def dispatcher(self) -> Dispatcher:
        """The tools and resources every session reaches (also one-request stateless ones)."""
        return self._dispatcher

    def open(self, principal: Principal, token: str = "", kind: str = "sse") -> Session:
        """Create a session of ``kind`` (``"sse"`` or ``"mcp"``) owned by ``principal`` opened with
        bearer ``token`` (kept in memory only, so a revoked or rotated token closes it).

        At a full cap, the ``"mcp"`` session idle longest (of ``principal`` for its own cap, of
        anyone for ``max_sessions``) makes room when it has been idle for at least
        ``mcp_session_evict_seconds`` (:meth:`evict_idle`): a client that never ends its sessions
        does not lock its principal out until they expire. The principal's own cap is checked
        first: a principal refused for it evicts no one else's session.

        Raises:
            SessionRefused: ``503`` when ``max_sessions`` are open, ``429`` when ``principal``
                holds ``max_sessions_per_principal``; both count the two kinds together.
        """
        held = 0
        for other in self._sessions.values():
            if other.principal.name == principal.name:
                held += 1
                if other.principal == principal:  # one object for all the sessions of a token
                    principal, token = other.principal, other.token if other.token == token else token
        full = len(self._sessions) >= self._cfg.max_sessions
        # (the principal's own cap first: one refused for it must not have evicted anyone else's
        # session; its own evicted session frees a place in all as well)
        if held >= self._cfg.max_sessions_per_principal and not self.evict_idle(principal.name):
            if full:
                metrics.limit_hit("sessions_total")
                raise SessionRefused(503, "too many sessions")
            metrics.limit_hit("sessions_per_principal")
            raise SessionRefused(429, "too many sessions for this principal")
        if len(self._sessions) >= self._cfg.max_sessions and not self.evict_idle(None):
            metrics.limit_hit("sessions_total")
            raise SessionRefused(503, "too many sessions")
        sid = secrets.token_hex(16)
        session = Session(sid, principal, self._cfg.session_queue_size, self, self._dispatcher, kind,
                             self._cfg.session_queue_bytes)
        session.token = token
        self._sessions[sid] = session
        return session

    def find(self, session_id: str, principal: Principal, kind: str = "sse") -> Session | None:
        """The live session ``session_id`` of ``kind`` if ``principal`` owns it, else ``None``
        (all answer 404: an id never reveals that another principal's or transport's session exists)."""
        session = self._sessions.get(session_id)
        if session is None or session.closed or session.kind != kind or session.principal.name != principal.name:
            return None
        return session

    def _idle(self, session: Session, now: float, seconds: float) -> bool:
        """Whether ``session`` is a ``"mcp"`` one with no GET stream, no request in flight and no
        request for more than ``seconds`` (since the last one came or was answered)."""
        return (session.kind == "mcp" and not session.stream_open and not session.protocol.busy
                and now - _last_active(session) > seconds)

    def evict_idle(self, name: str | None, now: float | None = None) -> bool:
        """Close the ``"mcp"`` session (of principal ``name``; of anyone for ``None``) that has
        been idle longest, if it has been idle (:meth:`_idle`) for ``mcp_session_evict_seconds``
        (``0``: never); whether one was. Its client's next request gets ``404`` and initializes
        again. Reads every session: called only at a full cap."""
        after = self._cfg.mcp_session_evict_seconds
        if not after > 0:
            return False
        now = time.monotonic() if now is None else now
        idle = [s for s in self._sessions.values()
                if (name is None or s.principal.name == name) and self._idle(s, now, after)]
        if not idle:
            return False
        oldest = min(idle, key=_last_active)
        log.info("session %s of %s closed after %.0f s idle to make room for a new one", oldest.id,
                 oldest.principal.name, now - _last_active(oldest))
        metrics.session_evicted()
        self.close(oldest)
        return True

    def expire_idle(self, idle_seconds: float, now: float | None = None) -> int:
        """Close the ``"mcp"`` sessions with no GET stream, no request in flight and no request
        for ``idle_seconds`` (a Streamable HTTP session has no stream whose end would close it);
        return how many were closed. ``now``: ``time.monotonic()`` by default."""
        now = time.monotonic() if now is None else now
        idle = [s for s in self._sessions.values() if self._idle(s, now, idle_seconds)]
        for session in idle:
            log.info("session %s closed after %.0f s idle", session.id, idle_seconds)
            self.close(session)
        return len(idle)

    def close(self, session: Session) -> None:
        """Close ``session`` and forget it."""
        if self._sessions.pop(session.id, None) is not None:
            self.closed_since_trim += 1
            self._last_close = time.monotonic()
        session.close()

    def stream_attached(self) -> None:
        """A GET stream was attached: start the keep-alive ticker unless it runs (it stops once no
        stream is left)."""
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().call_later(tick_seconds(self._cfg.keepalive_seconds),
                                                                self._tick)

    def keep_alive(self, now: float | None = None) -> tuple[int, int]:
        """Queue a ``: ping`` comment on every attached stream that has sent nothing for
        ``keepalive_seconds``; return (streams attached, streams pinged). One ticker for every
        stream (rather than a timer each) calls it every :func:`tick_seconds`, so a comment follows
        between ``keepalive_seconds`` and that much more after a stream's last event. A stream
        whose client was behind when last written to is measured again (:meth:`Session.held`),
        so what it no longer holds is not counted against its principal's budget for long. A
        session whose client has taken nothing for ``connections.idle_seconds`` while its queue is
        full (:meth:`Session.stalled`) is closed, as a client that stopped reading."""
        now = time.monotonic() if now is None else now
        due = now - self._cfg.keepalive_seconds
        attached = pinged = 0
        stalled = []
        for session in self._sessions.values():
            if session.stream_open:
                attached += 1
                if session.last_write <= due:
                    session.ping()
                    pinged += 1
                elif session.stale():  # what its stream held when last measured may have gone out
                    session.held()
                if session.stalled(now, self.stall_seconds):
                    stalled.append(session)
        for session in stalled:  # (closing changes the table)
            session.overflow("queue_overflow", self.stall_seconds)
        self.measure_kept()
        return attached, pinged

    def _tick(self) -> None:
        self._ticker = None
        attached = 1
        try:
            attached, _ = self.keep_alive()
        finally:
            if attached or self._kept:
                self.stream_attached()

    def give_back_memory(self, after: int = TRIM_AFTER, now: float | None = None) -> bool:
        """Once ``after`` sessions were closed since the last trim and closing has paused for
        :data:`TRIM_QUIET` seconds (or ``8 * after`` were closed, however busy), collect the
        cycles closed streams leave (a full ``gc.collect``: until the collector's rare full pass,
        cancelled tasks, their exceptions and frames keep a closed session's memory) and hand the
        C heap's free pages back to the system (glibc ``malloc_trim``). Returns whether it trimmed.
        Meant to be called every second."""
        now = time.monotonic() if now is None else now
        quiet = now - self._last_close >= TRIM_QUIET
        if self.closed_since_trim < after or not (quiet or self.closed_since_trim >= 8 * after):
            return False
        self.closed_since_trim = 0
        self._sessions = dict(self._sessions)  # a dict keeps the table of its largest size: this one fits
        gc.collect()  # a closed stream leaves cycles (cancelled tasks, their exceptions and frames)
        return trim_heap()

    def sessions(self) -> list[Session]:
        """A snapshot of the open sessions."""
        return list(self._sessions.values())

    def close_all(self) -> None:
        """Close every session (server shutdown)."""
        for session in list(self._sessions.values()):
            self.close(session)
