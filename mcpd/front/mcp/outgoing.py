"""Requests this server sends to a session's client (2025-11-25 sessions; docs/REFERENCE.md §4.7):
URL-mode ``elicitation/create`` during a privileged call that needs a person. Each gets an id of
its own (``mcpd-<n>``, never one a client request could hold in this session's table), goes out
on the stream of the call that asks, and waits, bounded, for the client's response, which the
session routes here (:meth:`Outgoing.resolve`) instead of dropping it.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from mcpd.front.mcp.jsonrpc import Send

#: at most this many of a session's requests wait for their client at once (more: refused at once)
MAX_WAITING = 16


class ClientDidNotAnswer(Exception):
    """The client sent no response in time, too many requests wait already, or it answered an error."""


class Outgoing:
    """One session's requests to its client and their pending responses."""

    __slots__ = ("_ids", "_waiting")

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}

    async def ask(self, send: Send, method: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send request ``method`` with ``params`` through ``send``; its ``result`` (a dict).

        Raises:
            ClientDidNotAnswer: no response within ``timeout`` seconds, an error response, or
                :data:`MAX_WAITING` requests already waiting in this session.
        """
        if len(self._waiting) >= MAX_WAITING:
            raise ClientDidNotAnswer("too many requests to the client are waiting")
        rid = f"mcpd-{next(self._ids)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = future
        try:
            send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
            reply = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise ClientDidNotAnswer("the client did not answer in time") from None
        finally:
            self._waiting.pop(rid, None)
        result = reply.get("result")
        if not isinstance(result, dict):
            raise ClientDidNotAnswer("the client answered with an error")
        return result

    def resolve(self, msg: dict[str, Any]) -> bool:
        """Hand a client's response (an object with ``id`` and ``result`` or ``error``) to the request
        waiting for it; False when none waits for that id (the response is dropped)."""
        rid = msg.get("id")
        future = self._waiting.get(rid) if isinstance(rid, str) else None
        if future is None or future.done():
            return False
        future.set_result(msg)
        return True
