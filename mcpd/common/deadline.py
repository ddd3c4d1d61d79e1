"""The one deadline rule of a call: how long the front, the policy process and a worker or walker
wait for one call before it is ``TIMEOUT`` (docs/REFERENCE.md §2.5).

Shared by the front (:mod:`mcpd.core.tools` re-exports it) and the policy process. It reads the
call's raw or parsed arguments and never raises.
"""

from __future__ import annotations

from typing import Any

DEADLINE_MARGIN = 5.0  # seconds a call may run past a tool's own time budget (startup, answer)
BUDGET_MAX_SECONDS = 60.0  # files/find's largest time_budget_seconds (core.walk refuses more)


def deadline_seconds(args: dict[str, Any], default: float) -> float:
    """The deadline in seconds of one call with arguments ``args`` (raw or parsed).

    A call whose ``time_budget_seconds`` is a positive number (``files/find``) gets that
    budget, at most :data:`BUDGET_MAX_SECONDS` (an infinite or huge one too), plus :data:`DEADLINE_MARGIN`, so the walk can stop
    itself and answer before its process is killed; the result is never below ``default``
    (``workers.timeout_seconds``; with 0, a call without a budget gets 0: "no deadline of its
    own", which the front and the policy process then replace with their own default). Any
    other value (absent, a bool, a string, zero, negative, NaN) counts as no budget: ``default``.
    The cap comes before the conversion to float, so a huge integer never overflows.
    """
    budget = args.get("time_budget_seconds")
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        return default
    return max(default, float(min(budget, BUDGET_MAX_SECONDS)) + DEADLINE_MARGIN)
