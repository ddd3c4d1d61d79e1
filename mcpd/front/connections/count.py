"""Counting the client connections held, in total and per client address, against
``connections.max_total`` and ``connections.max_per_address`` (docs/REFERENCE.md §1.7). The
guarded protocol (``guarded.py``) admits and releases each connection here."""

from __future__ import annotations

import collections

from mcpd.common.config import Connections


class ConnectionCount:
    """Connections held, in total and per client address (a plain counter: one event loop)."""

    def __init__(self, limits: Connections) -> None:
        self.limits = limits
        self.total = 0
        self.by_address: collections.Counter[str] = collections.Counter()

    def admit(self, address: str) -> str | None:
        """Count one more connection from ``address``; ``None``, or (nothing counted) the cap it is
        over: ``"connections_total"`` or ``"connections_per_address"``."""
        if self.total >= self.limits.max_total:
            return "connections_total"
        if self.by_address[address] >= self.limits.max_per_address:
            return "connections_per_address"
        self.total += 1
        self.by_address[address] += 1
        return None

    def release(self, address: str) -> None:
        """Forget one admitted connection from ``address``."""
        self.total -= 1
        self.by_address[address] -= 1
        if self.by_address[address] <= 0:
            del self.by_address[address]
