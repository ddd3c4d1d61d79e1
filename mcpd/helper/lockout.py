"""Slow down, then lock out, repeated password failures (SPEC §5.2; issue 5).

The root helper keeps one :class:`Lockout` for PAM logins. Its keys are strings such as
``user:alice`` and ``peer:203.0.113.7``; a login attempt is judged on all its keys at once, so a
guesser is slowed whether it tries many passwords for one account or many accounts from one
address, while other accounts and other addresses are untouched.

Per key, after ``n`` consecutive failures (``n >= free_failures``) the next attempt waits
``min(base_delay * 2 ** (n - free_failures), max_delay)`` seconds before PAM is asked; after
``max_failures`` failures the key is locked for ``lock_seconds`` and every attempt is refused
without asking PAM. A success clears the user key (not the address key: an address that guessed
wrong for many accounts stays suspicious until its own failures age out). Failures older than
``lock_seconds`` are forgotten.

The state is a dict under one short lock that only guards dictionary updates; the delay itself is
slept by the caller (:meth:`Lockout.delay_for` returns it) in its own thread, never under the lock
and never on the helper's main loop. The table is bounded (``max_keys``): when full, the oldest
entries are dropped first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class LockoutPolicy:
    """Numbers of the lockout (counts and seconds).

    Attributes:
        free_failures: failures per key answered without delay.
        base_delay: seconds of the first delay; doubles with each further failure.
        max_delay: the longest delay, in seconds.
        max_failures: failures per key after which the key is locked.
        lock_seconds: how long a locked key stays locked, and how long failures are remembered.
        max_keys: the largest number of keys tracked at once.
    """

    free_failures: int = 2
    base_delay: float = 0.5
    max_delay: float = 4.0
    max_failures: int = 5
    lock_seconds: float = 900.0
    max_keys: int = 10000


@dataclass
class _Entry:
    failures: int
    last: float
    locked_until: float = 0.0


class Lockout:
    """Per-key failure counters with growing delays and a lockout window.

    Args:
        policy: the numbers (see :class:`LockoutPolicy`).
        clock: monotonic seconds; injectable so tests need not sleep.
    """

    def __init__(self, policy: LockoutPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def _live(self, key: str, now: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.locked_until <= now and now - entry.last >= self.policy.lock_seconds:
            del self._entries[key]
            return None
        return entry

    def locked(self, keys: Iterable[str]) -> float:
        """Seconds until the most restrictive of ``keys`` is unlocked; ``0.0`` when none is locked."""
        now = self._clock()
        with self._lock:
            waits = [e.locked_until - now for k in keys if (e := self._live(k, now)) and e.locked_until > now]
        return max(waits, default=0.0)

    def delay_for(self, keys: Iterable[str]) -> float:
        """Seconds the caller should sleep (outside any lock) before asking PAM."""
        now = self._clock()
        p = self.policy
        delay = 0.0
        with self._lock:
            for key in keys:
                entry = self._live(key, now)
                if entry is not None and entry.failures >= p.free_failures:
                    delay = max(delay, min(p.base_delay * 2 ** (entry.failures - p.free_failures), p.max_delay))
        return delay

    def failure(self, keys: Iterable[str]) -> None:
        """Count one failed attempt for every key; lock the keys that reach ``max_failures``."""
        now = self._clock()
        p = self.policy
        with self._lock:
            for key in keys:
                entry = self._live(key, now)
                if entry is None:
                    if len(self._entries) >= p.max_keys:
                        oldest = min(self._entries, key=lambda k: self._entries[k].last)
                        del self._entries[oldest]
                    entry = self._entries[key] = _Entry(0, now)
                entry.failures += 1
                entry.last = now
                if entry.failures >= p.max_failures:
                    entry.locked_until = now + p.lock_seconds

    def success(self, keys: Iterable[str]) -> None:
        """Forget the failures of ``keys`` (called with the user key after a good login)."""
        with self._lock:
            for key in keys:
                self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)
