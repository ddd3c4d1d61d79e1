"""Writing a ``POST /mcp`` answer: the bounded queue of what one POST's requests produce
(:class:`PostStream`), the answer written whole a piece at a time (:class:`PiecedAnswer`), and the
answer written as an event stream of progress then reply (:func:`post_events`). What they hold
for a client that has not taken it is charged to the outgoing-byte budgets
(``mcpd.front.sessions.budgets``); past one, the client is cut. The ``/mcp`` endpoints that choose
the answer are ``streamable.py``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from mcpd.front import metrics
from mcpd.front.connections.handover import DETACH, PIECE, UNSEEN
from mcpd.front.events import EVENT_END, EVENT_HEAD, PING, encode_message, event_of, pieces
from mcpd.front.mcp.dispatcher import Caller
from mcpd.front.mcp.session import McpSession
from mcpd.front.sessions.budgets import FULL
from mcpd.front.sessions.table import SessionManager

log = logging.getLogger(__name__)


def _is_reply(msg: Any) -> bool:
    return isinstance(msg, list) or (isinstance(msg, dict) and "method" not in msg)


async def disconnected(receive: Receive) -> None:
    """Return once the client has gone away (the request's body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class PostStream:
    """The messages one POST's requests produce, in order, encoded, bounded like a session's queue.

    ``put`` is the ``send`` handed to :meth:`McpSession.receive`. A POST gets one reply (one
    request's, or one batch's array, bounded by the response cap or ``max_batch_bytes`` in
    :class:`~mcpd.front.mcp.session.McpSession`): it is always queued, however far behind the client
    is. Its progress notifications are dropped once the stream holds ``limit`` messages or
    ``limit_bytes`` bytes (``session_queue_size``, ``session_queue_bytes``: the client is behind,
    and progress is advisory), so a client reading a stream slowly is never cut for its own
    stream's bounds. The bytes count the messages queued and those taken (:meth:`drain`) until
    the response took them (:meth:`sent`).
    ``replies_only``: keep only replies (an answer sent as JSON, which carries no progress).
    With a ``manager``, a reply over :data:`~mcpd.front.connections.handover.UNSEEN` bytes is also
    counted among the principal's answers made and not yet written
    (:attr:`~mcpd.front.sessions.budgets.Budgets.answering`, for which room was reserved before it
    was made) from when it is encoded until :meth:`close` (a JSON answer's: once its
    :class:`PiecedAnswer` wrote it).
    ``manager`` and ``owner``: the session table, whose budgets of outgoing bytes by principal
    and in all are charged with what the stream holds (an event stream's; :meth:`close` releases
    it; :meth:`SessionManager.hold_answer`), and the principal's name: past either, the stream is
    cut too; when the total's rule cuts the principal (:meth:`SessionManager.still_over`), its
    connection is dropped as well (``drop``, the server's, when given).
    """

    def __init__(self, limit: int, limit_bytes: int = 16 * 1024 * 1024, replies_only: bool = False,
                 manager: SessionManager | None = None, owner: str = "",
                 drop: Callable[[], None] | None = None) -> None:
        self._items: collections.deque[Queued] = collections.deque()
        self._limit = limit
        self._limit_bytes = limit_bytes
        self._bytes = 0
        self._answering = 0  # bytes of replies made, counted in the manager's ``answering`` until close
        self._replies_only = replies_only
        self._manager = manager
        self._owner = owner
        self._drop = drop
        self._ready = asyncio.Event()
        self.overflowed = False
        self._closed = False

    def put(self, message: Any) -> None:
        """Encode and queue one message (never blocks); nothing once the stream was closed (its
        client left, or it was cut: a request still running puts its reply nowhere, and charges
        nothing no one would release)."""
        if self.overflowed or self._closed:
            return
        reply = _is_reply(message)
        if self._replies_only and not reply:
            return
        if not reply and len(self._items) >= self._limit:
            return  # (progress for a client that is behind: dropped)
        data = encode_message(message)
        size = len(data)
        if not reply and self._bytes and self._bytes + size > self._limit_bytes:
            return
        refused = isinstance(message, dict) and message.get("id") is None and "error" in message
        self._items.append(Queued(data, reply, refused, isinstance(message, dict) and "result" in message))
        if reply and size > UNSEEN and self._manager is not None:  # (made: counted until written, close)
            self._manager.answering.charge(self._owner, size)
            self._answering += size
        if self._replies_only:  # (a JSON answer: charged by its PiecedAnswer while its client is behind)
            self._ready.set()
            return
        self._bytes += size
        if self._manager is not None:
            kind = self._manager.hold_answer(self._owner, size, self._cut_off)
            if kind is not None:
                self._overflow(kind)
        self._ready.set()

    def _overflow(self, kind: str) -> None:
        """The client stopped reading: cut the stream, release what it holds, count ``kind``."""
        self.overflowed = True
        metrics.limit_hit(kind)
        self._items.clear()
        self.close()

    def _cut_off(self) -> None:
        """The total's rule cut the principal (:meth:`SessionManager.cut`): cut the stream,
        release what it holds, and drop its connection (its response may be waiting on a client
        that reads nothing, holding an event)."""
        self.overflowed = True
        self._items.clear()
        self.close()
        self._ready.set()
        if self._drop is not None:
            self._drop()

    def drain(self) -> list[Queued]:
        """Take everything queued so far (still counted until :meth:`sent`)."""
        items = list(self._items)
        self._items.clear()
        self._ready.clear()
        return items

    def sent(self, size: int) -> None:
        """A message of ``size`` bytes taken by :meth:`drain` was taken by the response."""
        if not self.overflowed:
            self._bytes -= size
            if self._manager is not None:
                self._manager.hold_answer(self._owner, -size, self._cut_off)

    def close(self) -> None:
        """Release what the stream still counts (it ended, or was cut); it takes nothing more."""
        self._closed = True
        if self._answering and self._manager is not None:
            self._manager.answering.charge(self._owner, -self._answering)
            self._answering = 0
        if self._manager is not None and self._bytes:
            self._manager.hold_answer(self._owner, -self._bytes, self._cut_off)
        self._bytes = 0

    async def wait(self, task: asyncio.Task[Any], timeout: float | None = None) -> bool:
        """Wait until something is queued or ``task`` ends (``True``), or ``timeout`` seconds
        pass first (``False``)."""
        waiter = asyncio.ensure_future(self._ready.wait())
        try:
            done, _ = await asyncio.wait({waiter, task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        return bool(done)


@dataclasses.dataclass(frozen=True)
class Queued:
    """One encoded message of a :class:`PostStream`: its JSON ``data``, whether it is a ``reply``,
    whether it is an error without an id (``refused``: answered ``400`` as JSON), and whether it
    is a success (``result``)."""

    data: bytes
    reply: bool
    refused: bool
    result: bool


class PiecedAnswer(Response):
    """A ``/mcp`` POST's answer, its body known (a reply as JSON, or as one event for a client
    that accepts only event streams), written through the request's ``send`` a piece of at most
    :data:`~mcpd.front.connections.handover.PIECE` at a time: uvicorn's ``send`` waits while the connection
    asked to pause writing, so a client that stops reading leaves about two pieces in the
    connection's transport, and the rest here.

    The rule: while it is being written, the answer is charged, all of it, to principal
    ``owner``'s and the total budgets (``principal_queue_bytes``, ``total_queue_bytes``;
    :meth:`SessionManager.hold_answer`) whenever its connection is behind (the server's
    :meth:`~mcpd.front.connections.handover.ConnectionOffer.behind`, asked before each write; always, without
    the server's offer). Once written, an answer over :data:`~mcpd.front.connections.handover.UNSEEN` bytes
    is charged what its connection still holds, the kernel's queue included, until it holds
    nothing (:meth:`SessionManager.keep_answer`). Past a bound the client stopped reading: the
    connection is dropped, the charge released and the limit counted, as for a full queue. An
    answer of at most ``UNSEEN`` bytes to a client that keeps up costs one :meth:`behind` more
    than a plain response.

    ``held``: the :class:`PostStream` that took the reply, which counts it among its principal's
    answers made and not yet written until it is written (then closed here).

    Args:
        body: the answer's bytes. status: its HTTP status. headers: extra response headers.
        media_type: its ``Content-Type``. manager: the session table (its budgets).
        owner: the principal's name. session_id: the session the POST named (for the log), or ``None``.
        held: the POST's stream that took the reply (closed once it is written), or ``None``.
    """

    def __init__(self, body: bytes, status: int, headers: dict[str, str] | None, media_type: str,
                 manager: SessionManager, owner: str, session_id: str | None,
                 held: PostStream | None = None) -> None:
        super().__init__(body, status_code=status, headers=headers, media_type=media_type)
        self._data = body  # (self.body, typed loosely: the same bytes)
        self._manager, self._owner, self._session_id = manager, owner, session_id
        self._held = held

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._write(scope, receive, send)
        finally:
            if self._held is not None:
                self._held.close()

    async def _write(self, scope: Scope, receive: Receive, send: Send) -> None:
        offer = scope.get(DETACH)
        data = self._data
        size = len(data)
        cut = None if offer is None else offer.abort
        charged = 0  # what hold_answer counts: 0, or the answer's size while its client is behind
        try:
            start: dict[str, Any] | None = {"type": "http.response.start", "status": self.status_code,
                                            "headers": self.raw_headers}
            for begin in range(0, size or 1, PIECE):
                owed = size if offer is None or offer.behind() else 0
                if owed != charged:
                    kind = self._manager.hold_answer(self._owner, owed - charged, cut)
                    charged = owed
                    if kind is not None:
                        self._manager.hold_answer(self._owner, -charged, cut)
                        charged = 0
                        self._cut(kind, cut)
                        if cut is not None:
                            await disconnected(receive)
                        return
                if start is not None:  # (the headers, and the first piece right behind them)
                    await send(start)
                    start = None
                end = begin + PIECE
                await send({"type": "http.response.body", "body": data[begin:end], "more_body": end < size})
                if self._held is not None:  # (a large answer moves: those waiting for room wait on)
                    self._manager.answer_moved(self._owner)
            if charged:
                self._manager.hold_answer(self._owner, -charged, cut)
                charged = 0
            if self._held is not None:
                self._held.close()
            if size > UNSEEN and offer is not None:  # written: what its connection still holds
                kind = self._manager.keep_answer(self._owner, offer)
                if kind is not None:
                    self._cut(kind, cut)
        finally:
            if charged:
                self._manager.hold_answer(self._owner, -charged, cut)

    def _cut(self, kind: str, cut: Callable[[], None] | None) -> None:
        """The client stopped reading (``kind``: the bound passed): count and log it, drop the
        connection (without the server's offer, the server closes the unfinished response)."""
        metrics.limit_hit(kind)
        log.warning("%s: a POST's answer: %s, dropping a client that stopped reading",
                    self._session_id or "stateless", FULL[kind])
        if cut is not None:
            cut()

async def post_events(protocol: McpSession, payload: Any, caller: Caller, out: PostStream, keepalive: float,
                      label: str, cancel_on_close: bool) -> AsyncIterator[bytes]:
    """One POST's response stream: its request's progress, then the reply, then the end, with
    a keep-alive comment after each ``keepalive`` seconds without a message; a client that
    stops reading is cut off. An event larger than :data:`~mcpd.front.connections.handover.PIECE` goes
    out a piece at a time (each yield returns once the transport takes more), so a client that
    stops reading leaves about a piece in the transport, the rest counted in ``out``'s bytes
    until it went out. ``out``: the POST's queue, charged to the caller's budgets (and closed
    here); ``label``: the session's id, or ``"stateless"``, for the log. ``cancel_on_close``: the
    stream ending early (the client left) cancels the request."""
    task = protocol.receive(payload, caller, out.put)
    if task is None:  # answered at once (a batch refused whole), or nothing to answer
        try:
            for item in out.drain():
                yield event_of(item.data)
        finally:
            out.close()
        return
    try:
        while True:
            if not await out.wait(task, keepalive):
                yield PING
                continue
            done = task.done()  # then every message of the task is queued already
            for item in out.drain():
                if out.overflowed:
                    break
                if len(item.data) <= PIECE:
                    yield event_of(item.data)
                else:
                    yield EVENT_HEAD
                    for piece in pieces(item.data):
                        yield piece
                    yield EVENT_END
                out.sent(len(item.data))
            if out.overflowed:
                log.warning("%s: a POST stream's client stopped reading; cut off", label)
                return
            if done:
                return
    finally:
        out.close()
        if cancel_on_close and not task.done():
            protocol.close()
