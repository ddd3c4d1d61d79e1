"""The one deadline rule of a call: how long the front, the policy process and a worker or walker
wait for one call before it is ``TIMEOUT`` (docs/REFERENCE.md §2.5).

Applied alike by the front (its worker pool, its wait on the policy process, a request's wait for
room in its session) and the policy process. It reads the call's raw or parsed arguments and
never raises.
"""

from __future__ import annotations

from typing import Any

DEADLINE_MARGIN = 5.0  # seconds a call may run past a tool's own time budget (startup, answer)
BUDGET_MAX_SECONDS = 60.0  # files/find's largest time_budget_seconds (core.walk refuses more)
BUDGETED = frozenset({"files/find", "files/grep"})  # the tools with a time_budget_seconds argument
DEFAULT_BUDGET_SECONDS = 10.0  # their time_budget_seconds when a call gives none (core.walk, core.grepargs)


def deadline_seconds(args: dict[str, Any], default: float, op: str | None = None) -> float:
    """The deadline in seconds of one call of tool ``op`` (slash or portable name; None: not
    known) with arguments ``args`` (raw or parsed).

    A call whose ``time_budget_seconds`` is a positive number (``files/find``) gets that
    budget, at most :data:`BUDGET_MAX_SECONDS` (an infinite or huge one too), plus
    :data:`DEADLINE_MARGIN`, whether that is shorter or longer than ``default``: the walk stops
    itself at its budget and answers before its process is killed, and a caller that asks for a
    short budget wants a short wait. Any other call gets ``default`` (``workers.timeout_seconds``);
    any other value (a bool, a string, zero, negative, NaN) counts as no budget, and so does an
    absent one, except for a tool of :data:`BUDGETED`, whose walk then stops itself at
    :data:`DEFAULT_BUDGET_SECONDS`. The cap comes before the conversion to float, so a huge
    integer never overflows.
    """
    budget = args.get("time_budget_seconds")
    if budget is None and op is not None and op.replace("_", "/", 1) in BUDGETED:
        budget = DEFAULT_BUDGET_SECONDS
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        return default
    return float(min(budget, BUDGET_MAX_SECONDS)) + DEADLINE_MARGIN
