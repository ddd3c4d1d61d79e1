"""Token buckets per key: a burst, then a steady rate (the bound on how fast workers are started).

One :class:`TokenBuckets` holds a bucket per key (a principal's name). Each bucket holds at most
``burst`` tokens, gains ``rate`` tokens a second, and starts full; taking one token is allowed
while the bucket holds at least one. So over any span of ``t`` seconds a key takes at most
``burst + rate * t`` tokens, and a key that takes nothing for ``burst / rate`` seconds has its full
burst again.

It is pure arithmetic on a clock the caller passes (seconds of a monotonic clock: the event loop's
``time()`` in the front, ``time.monotonic()`` in the policy process), so it serves an asyncio
caller and a threaded one (under its own lock) alike, and it never waits: a caller told to wait
gets the seconds until its next token and decides (the front refuses with ``RATE_LIMITED``).
A token taken for a start that then failed is given back (:meth:`TokenBuckets.give_back`): the
bound is on what is started, not on what is asked for.

Memory: a full bucket is not stored (a missing key is a full bucket), and full buckets are swept
whenever the table has doubled since the last sweep, so it holds about two entries per key that
took a token within the last ``burst / rate`` seconds.
"""

from __future__ import annotations

SWEEP_MIN = 64  # entries the table may hold before its first sweep
EPSILON = 1e-9  # tokens: a take at exactly the time :meth:`TokenBuckets.take` named succeeds despite rounding


class TokenBuckets:
    """A token bucket per key.

    Args:
        burst: tokens a bucket holds when full (at least 1).
        rate: tokens a bucket gains per second (positive).

    Raises:
        ValueError: ``burst`` below 1 or ``rate`` not positive.
    """

    def __init__(self, burst: int, rate: float) -> None:
        if burst < 1 or not rate > 0:
            raise ValueError("a token bucket needs burst >= 1 and rate > 0")
        self.burst = burst
        self.rate = rate
        self._held: dict[str, tuple[float, float]] = {}  # key -> (tokens, at): buckets that are not full
        self._sweep_at = SWEEP_MIN

    def _level(self, key: str, now: float) -> float:
        held = self._held.get(key)
        if held is None:
            return float(self.burst)
        tokens, at = held
        return min(float(self.burst), tokens + max(now - at, 0.0) * self.rate)

    def take(self, key: str, now: float) -> float:
        """Take one token of ``key``'s bucket at time ``now`` (seconds, monotonic).

        Returns:
            ``0.0`` when a token was taken; otherwise nothing is taken and the result is the
            seconds (positive) until the bucket holds a token again.
        """
        tokens = self._level(key, now)
        if tokens < 1.0 - EPSILON:
            return (1.0 - tokens) / self.rate
        self._held[key] = (tokens - 1.0, now)
        if len(self._held) >= self._sweep_at:
            self._sweep(now)
        return 0.0

    def give_back(self, key: str, now: float) -> None:
        """Return one token :meth:`take` gave for something that did not happen (a worker that was
        asked for and not started): ``key``'s bucket at time ``now`` gains one token, never past
        ``burst``. Only a token actually taken may be given back, so the bound of
        ``burst + rate * t`` tokens over ``t`` seconds still holds for what did happen."""
        tokens = min(float(self.burst), self._level(key, now) + 1.0)
        if tokens >= self.burst:
            self._held.pop(key, None)  # full again: not stored
        else:
            self._held[key] = (tokens, now)

    def _sweep(self, now: float) -> None:
        """Forget the buckets that are full again at ``now``."""
        self._held = {k: v for k, v in self._held.items() if self._level(k, now) < self.burst}
        self._sweep_at = max(SWEEP_MIN, 2 * len(self._held))

    def __len__(self) -> int:
        """Buckets held (not full at their last take): for tests of the memory bound."""
        return len(self._held)
