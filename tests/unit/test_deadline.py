"""The one deadline rule of a call (:func:`mcpd.common.deadline.deadline_seconds`), as the front
and the policy process both apply it: a find's time budget plus a margin, capped, shorter or
longer than the default, and the default for anything that is not a positive number."""

from __future__ import annotations

import math
from typing import Any

import pytest

from mcpd.common.deadline import BUDGET_MAX_SECONDS, DEADLINE_MARGIN, DEFAULT_BUDGET_SECONDS, deadline_seconds
from mcpd.core import grepargs, tools, walk


@pytest.mark.parametrize("budget", [True, False, -1, 0, 0.0, -0.0, math.nan, "10", None, [5], {"x": 1}])
def test_anything_but_a_positive_number_is_no_budget(budget: Any) -> None:
    assert deadline_seconds({"time_budget_seconds": budget}, 30.0) == 30.0
    assert deadline_seconds({"time_budget_seconds": budget}, 0.0) == 0.0
    assert deadline_seconds({}, 12.5) == 12.5


@pytest.mark.parametrize("budget", [10**400, math.inf, 61, 1e308])
def test_a_huge_or_infinite_budget_is_capped_without_overflow(budget: Any) -> None:
    assert deadline_seconds({"time_budget_seconds": budget}, 0.0) == BUDGET_MAX_SECONDS + DEADLINE_MARGIN
    assert deadline_seconds({"time_budget_seconds": budget}, 100.0) == BUDGET_MAX_SECONDS + DEADLINE_MARGIN


def test_a_budget_adds_the_margin_in_place_of_the_default() -> None:
    assert deadline_seconds({"time_budget_seconds": 10}, 0.0) == 10 + DEADLINE_MARGIN
    assert deadline_seconds({"time_budget_seconds": 2.5}, 0.0) == 2.5 + DEADLINE_MARGIN
    assert deadline_seconds({"time_budget_seconds": 10}, 30.0) == 10 + DEADLINE_MARGIN  # shorter: the budget's
    assert deadline_seconds({"time_budget_seconds": 50}, 30.0) == 50 + DEADLINE_MARGIN  # longer: the budget's


def test_there_is_one_rule_and_its_cap_is_the_walks() -> None:
    assert not hasattr(tools, "deadline_seconds")  # one rule: core keeps no copy of its own
    assert BUDGET_MAX_SECONDS == walk.FIND_MAX_BUDGET


@pytest.mark.parametrize("op", ["files/find", "files/grep", "files_find", "files_grep"])
def test_a_search_without_a_budget_gets_its_default_budget_plus_the_margin(op: str) -> None:
    """A find or grep that gives no time_budget_seconds stops itself at its default budget: its
    deadline is that plus the margin (not workers.timeout_seconds, which would kill it as it answers)."""
    assert deadline_seconds({}, 10.0, op) == DEFAULT_BUDGET_SECONDS + DEADLINE_MARGIN
    assert deadline_seconds({}, 3.0, op) == DEFAULT_BUDGET_SECONDS + DEADLINE_MARGIN
    assert deadline_seconds({"time_budget_seconds": "x"}, 3.0, op) == 3.0  # a bad value is refused by the tool
    assert deadline_seconds({}, 3.0, "files/read") == 3.0 and deadline_seconds({}, 3.0) == 3.0


def test_the_default_budget_is_the_tools_own() -> None:
    assert DEFAULT_BUDGET_SECONDS == walk.FIND_BUDGET == grepargs.BUDGET
