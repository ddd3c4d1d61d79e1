"""The rate limit on alerts (docs/REFERENCE.md §7.1).

At most :data:`ALERT_BURST` alerts per reason in each :data:`ALERT_WINDOW` seconds are written;
the ones over are counted, and once the window is over (checked at every record, and on close)
the writer writes one more alert of that reason carrying the count as ``suppressed``. A flood
costs a few lines and loses no count. At most :data:`ALERT_KEYS` reasons are told apart; the
others share one slot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ALERT_BURST, ALERT_WINDOW, ALERT_KEYS = 10, 60.0, 256  # alerts per reason per window (s); reasons tracked


class AlertLimit:
    """The windows of the alert reasons seen; ``clock``: monotonic seconds."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._slots: dict[str, list[float]] = {}  # reason -> [window start, written, suppressed]

    def admit(self, fields: dict[str, Any]) -> bool:
        """Whether the alert of ``fields`` (its ``reason``) may be written now (else it is counted
        as suppressed)."""
        key = str(fields.get("reason"))[:200]
        key = key if key in self._slots or len(self._slots) < ALERT_KEYS else "(other reasons)"
        slot = self._slots.setdefault(key, [self._clock(), 0, 0])
        if slot[1] >= ALERT_BURST:
            slot[2] += 1
            return False
        slot[1] += 1
        return True

    def due(self, now: float | None) -> list[tuple[str, int]]:
        """``(reason, suppressed)`` of each reason whose window is over (all when ``now`` is None)
        with a count to write; forgets those windows."""
        if not self._slots:  # (the usual case: nothing to look at)
            return []
        done = [(k, v) for k, v in self._slots.items() if now is None or now - v[0] >= ALERT_WINDOW]
        for key, _ in done:
            del self._slots[key]
        return [(k, int(v[2])) for k, v in done if v[2]]
