"""Counting the client connections held, in total and per client address, against
``connections.max_total`` and ``connections.max_per_address`` (docs/REFERENCE.md §1.7). The
guarded protocol (``guarded.py``) admits and releases each connection here."""

from __future__ import annotations

from mcpd.common.config import Connections
from mcpd.common.inflight import TOTAL, InFlight


class ConnectionCount:
    """Connections held, in total and per client address (the one keyed limiter: one event loop)."""

    def __init__(self, limits: Connections) -> None:
        self.limits = limits
        self._held = InFlight(limits.max_per_address, limits.max_total)

    @property
    def total(self) -> int:
        """Connections held now."""
        return self._held.total

    def held(self, address: str) -> int:
        """Connections held now from ``address``."""
        return self._held.held(address)

    def admit(self, address: str) -> str | None:
        """Count one more connection from ``address``; ``None``, or (nothing counted) the cap it is
        over: ``"connections_total"`` or ``"connections_per_address"``."""
        over = self._held.take(address)
        return None if over is None else "connections_total" if over == TOTAL else "connections_per_address"

    def release(self, address: str) -> None:
        """Forget one admitted connection from ``address``."""
        self._held.release(address)
