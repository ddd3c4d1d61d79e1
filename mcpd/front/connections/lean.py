"""Lean stand-ins for uvicorn's per-connection objects: an idle SSE stream holds its connection
for hours, and uvicorn keeps an empty ``collections.deque`` (760 bytes each) for the pipelined
requests, the request's message event and the write flow control. :class:`Waiters`,
:class:`Pipeline` and :class:`LeanFlowControl` hold the same with a list made only when needed.
The guarded protocol (``guarded.py``) puts them in place of uvicorn's."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl


class Waiters:
    """``asyncio.Event``'s interface (``set``, ``clear``, ``is_set``, ``wait``) in 2 slots, for
    uvicorn's per-request message event and per-connection "writable" event: an ``asyncio.Event``
    keeps an empty ``collections.deque`` of waiters (760 bytes) for the connection's life; this
    keeps a list, made by the first wait. Same rule as ``asyncio.Event``: ``set`` wakes every
    waiter and later waits return at once until ``clear``."""

    __slots__ = ("_value", "_waiters")

    def __init__(self, value: bool = False) -> None:
        self._value = value
        self._waiters: list[asyncio.Future[bool]] | None = None

    def is_set(self) -> bool:
        """Whether set (and not cleared since)."""
        return self._value

    def set(self) -> None:
        """Set it and wake every waiter."""
        if not self._value:
            self._value = True
            for fut in self._waiters or ():
                if not fut.done():
                    fut.set_result(True)

    def clear(self) -> None:
        """Unset it: later waits block until the next :meth:`set`."""
        self._value = False

    async def wait(self) -> bool:
        """Return ``True`` once set (at once if it is)."""
        if self._value:
            return True
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(fut)
        try:
            await fut
            return True
        finally:
            self._waiters.remove(fut)


class Pipeline(list):  # type: ignore[type-arg]
    """uvicorn's queue of pipelined requests (``appendleft`` and ``pop``, oldest popped first) as a
    list: almost always empty, and an empty deque is 760 bytes, an empty list 56."""

    def appendleft(self, item: Any) -> None:
        """Queue ``item`` behind the others (``pop`` takes from the other end)."""
        self.insert(0, item)


class LeanFlowControl(FlowControl):
    """uvicorn's write flow control whose "writable" event (:class:`Waiters`) is made only when
    the transport first asks to pause writing: until then ``drain`` returns at once, as uvicorn's
    does while its event is set."""

    def __init__(self, transport: asyncio.Transport) -> None:  # (not FlowControl's: no Event)
        self._transport = transport
        self.read_paused = False
        self.write_paused = False
        self._is_writable_event: Any = None

    async def drain(self) -> None:
        if self._is_writable_event is not None:
            await self._is_writable_event.wait()

    def pause_writing(self) -> None:
        if not self.write_paused:
            self.write_paused = True
            if self._is_writable_event is None:
                self._is_writable_event = Waiters()
            self._is_writable_event.clear()

    def resume_writing(self) -> None:
        if self.write_paused:
            self.write_paused = False
            self._is_writable_event.set()
