"""Bounds on client connections (SPEC §1.7): counts in total and per address, and deadlines for
the TLS handshake, a request's headers and its body.

uvicorn has a keep-alive timeout (``connections.idle_seconds`` is passed to it) but none for a
client that trickles its headers or body, and no per-address count. :func:`guarded_protocol`
returns uvicorn's httptools protocol class with those added; :class:`GuardedLoop` is uvloop's
event loop with a TLS handshake deadline on every server it creates. A connection over a count,
or past a deadline, is closed: it never holds a slot or delays anyone else.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mcpd.common.config import Connections


class ConnectionCount:
    """Connections held, in total and per client address (a plain counter: one event loop)."""

    def __init__(self, limits: Connections) -> None:
        self.limits = limits
        self.total = 0
        self.by_address: collections.Counter[str] = collections.Counter()

    def admit(self, address: str) -> bool:
        """Count one more connection from ``address``; ``False`` (nothing counted) over a cap."""
        if self.total >= self.limits.max_total or self.by_address[address] >= self.limits.max_per_address:
            return False
        self.total += 1
        self.by_address[address] += 1
        return True

    def release(self, address: str) -> None:
        """Forget one admitted connection from ``address``."""
        self.total -= 1
        self.by_address[address] -= 1
        if self.by_address[address] <= 0:
            del self.by_address[address]


def guarded_protocol(count: ConnectionCount) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with ``count``'s caps and the header and body deadlines.

    Deadlines (seconds, from ``count.limits``): ``header_seconds`` from the connection's start or a
    request's first byte to its last header; ``body_seconds`` from then to the body's last byte.
    A response that streams (SSE) is not limited: its request was complete.
    """
    limits = count.limits

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _timer: asyncio.TimerHandle | None = None
        _address: str | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else "unknown"
            if not count.admit(address):
                transport.close()
                return
            self._address = address
            self._arm(limits.header_seconds)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._address is not None:
                count.release(self._address)
                self._address = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._address is None:  # over a cap: closing, read nothing
                return
            super().data_received(data)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm(limits.header_seconds)

        def on_headers_complete(self) -> None:
            self._arm(limits.body_seconds)
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def _arm(self, seconds: float) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._too_slow)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _too_slow(self) -> None:
            self._timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return GuardedHttpToolsProtocol


class GuardedLoop(uvloop.Loop):  # type: ignore[misc]
    """uvloop's loop whose TLS servers give up on a handshake after :attr:`handshake_seconds`."""

    handshake_seconds: float = 10.0

    async def create_server(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", self.handshake_seconds)
        return await super().create_server(*args, **kwargs)


def loop_factory(limits: Connections) -> Any:
    """A factory of :class:`GuardedLoop` with ``limits.handshake_seconds`` (for ``asyncio.Runner``)."""

    def make() -> GuardedLoop:
        loop = GuardedLoop()
        loop.handshake_seconds = limits.handshake_seconds
        return loop

    return make
