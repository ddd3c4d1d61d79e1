"""Per-principal limits: requests per day and largest answer (docs/REFERENCE.md §2.5).

``mcpd.yaml``'s ``limits`` (:class:`mcpd.common.config.Limits`) gives each principal a tier (``users``
maps a principal name to a tier in ``tiers``; others get ``default``). Login principals are named
after their OS account (``mcpd/policy/login.py``). Each ``tools/call`` is charged one request:
past ``requests_per_day`` (a UTC day) it answers ``RATE_LIMITED`` with ``details.retryAfter`` =
seconds until the next UTC midnight. ``max_file_bytes`` becomes that call's response cap (the
reading core stops there, docs/REFERENCE.md §3), so a larger answer is ``FILE_TOO_LARGE`` with the user's limit.

Counters survive restarts: they are written atomically (write, fsync, rename) to
``<state_dir>/limits-counters.json`` every ``save_every`` charged requests and at shutdown. A
crash loses at most ``save_every - 1`` requests per day of counting (documented bound).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from mcpd.common.config import CAP_KEY, Limits, UserLimits
from mcpd.front import metrics
from mcpd.helper.wire.errors import RATE_LIMITED, ToolError

log = logging.getLogger(__name__)

FILE_NAME = "limits-counters.json"


def _day(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%d")


def seconds_to_midnight(now: float) -> int:
    """Whole seconds (at least 1) until the next UTC midnight after ``now`` (UNIX seconds)."""
    return max(1, 86400 - int(now) % 86400)


class LimitsTracker:
    """Counts requests per principal per UTC day and answers each principal's caps.

    Args:
        limits: the ``limits`` section of the config.
        state_dir: where the counters file lives (must be writable by the front).
        clock: UNIX seconds; injectable for tests.
    """

    def __init__(self, limits: Limits, state_dir: str, clock: Callable[[], float] = time.time) -> None:
        self.limits = limits
        self.path = os.path.join(state_dir, FILE_NAME)
        self._clock = clock
        self._day = _day(clock())
        self._counts: dict[str, int] = {}
        self._unsaved = 0
        self._load()

    def _load(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.error("limits counters %s unreadable (%s); starting from zero", self.path, type(exc).__name__)
            return
        counts = data.get("counts") if isinstance(data, dict) else None
        if data.get("day") == self._day and isinstance(counts, dict):
            self._counts = {str(k): int(v) for k, v in counts.items() if isinstance(v, int)}

    def tier(self, principal: str) -> UserLimits:
        """The limits that apply to ``principal``."""
        name = self.limits.users.get(principal)
        return self.limits.tiers[name] if name is not None else self.limits.default

    def charge(self, principal: str) -> None:
        """Count one request for ``principal``.

        Raises:
            ToolError: ``RATE_LIMITED`` (details ``retryAfter`` seconds, ``limit``) when the day's
                quota is already spent; the refused request is not counted.
        """
        now = self._clock()
        day = _day(now)
        if day != self._day:
            self._day, self._counts = day, {}
        quota = self.tier(principal).requests_per_day
        used = self._counts.get(principal, 0)
        if quota and used >= quota:
            metrics.limit_hit("requests_per_day")
            raise ToolError(RATE_LIMITED, f"daily quota of {quota} requests is spent; retry after UTC midnight",
                            retryAfter=seconds_to_midnight(now), limit=quota)
        self._counts[principal] = used + 1
        self._unsaved += 1
        if self._unsaved >= self.limits.save_every:
            self.save()

    def charge_call(self, principal: str, args: dict[str, Any]) -> dict[str, Any]:
        """Charge one call (:meth:`charge`) and return ``args`` with the principal's response cap
        under :data:`CAP_KEY` when its tier has one (``tools/call`` and ``resources/read`` alike).

        Raises:
            ToolError: ``RATE_LIMITED`` as :meth:`charge`.
        """
        self.charge(principal)
        cap = self.max_bytes(principal)
        return args if cap is None else {**args, CAP_KEY: cap}

    def max_bytes(self, principal: str) -> int | None:
        """``max_file_bytes`` of ``principal``'s tier in bytes, or ``None`` when unlimited."""
        return self.tier(principal).max_file_bytes or None

    def save(self) -> None:
        """Write the counters atomically; errors are logged, never raised (the call goes on)."""
        folder = os.path.dirname(self.path) or "."
        try:
            fd, tmp = tempfile.mkstemp(prefix=".limits.", dir=folder)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump({"day": self._day, "counts": self._counts}, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            log.error("cannot save limits counters to %s: %s", self.path, exc.strerror)
            return
        self._unsaved = 0
