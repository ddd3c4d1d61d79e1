"""The one keyed in-flight limiter: things in flight (calls, connections, login attempts)
counted in total and per key (a principal, a client address), each count under its cap.

Plain counters, no lock and no waiting: for one event loop, or under the caller's own lock. A
caller that waits for room waits on its own event and asks :meth:`InFlight.over` again.
"""

from __future__ import annotations

TOTAL = "total"  # :meth:`InFlight.over`: the total cap is reached
PER_KEY = "per_key"  # :meth:`InFlight.over`: the key's cap is reached


class InFlight:
    """Counts in flight, in total and per key.

    Args:
        per_key: at most this many per key.
        total: at most this many in all; ``None``: no cap on the sum.
    """

    __slots__ = ("per_key", "cap", "total", "_by_key")

    def __init__(self, per_key: int, total: int | None = None) -> None:
        self.per_key, self.cap = per_key, total
        self.total = 0
        self._by_key: dict[str, int] = {}

    def held(self, key: str) -> int:
        """How many ``key`` has in flight."""
        return self._by_key.get(key, 0)

    def over(self, key: str) -> str | None:
        """Which cap one more for ``key`` would pass: :data:`TOTAL` (checked first), :data:`PER_KEY`,
        or ``None`` when there is room."""
        if self.cap is not None and self.total >= self.cap:
            return TOTAL
        if self._by_key.get(key, 0) >= self.per_key:
            return PER_KEY
        return None

    def take(self, key: str) -> str | None:
        """Count one more for ``key`` if there is room; return ``None``, or (nothing counted) the
        cap it would pass (:meth:`over`)."""
        over = self.over(key)
        if over is None:
            self.add(key)
        return over

    def add(self, key: str) -> None:
        """Count one more for ``key`` whatever the caps (something already running that must
        count, such as a cancelled call's worker still finishing)."""
        self.total += 1
        self._by_key[key] = self._by_key.get(key, 0) + 1

    def release(self, key: str) -> None:
        """Count one of ``key``'s out (one that :meth:`take` or :meth:`add` counted)."""
        self.total -= 1
        left = self._by_key[key] - 1
        if left > 0:
            self._by_key[key] = left
        else:
            del self._by_key[key]
