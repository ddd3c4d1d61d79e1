"""The keyed in-flight limiter (``mcpd.common.inflight.InFlight``) that every total-plus-per-key
cap uses: privileged calls and call connections per principal, worker calls per principal, logins
per address in the front and in the policy process."""

from __future__ import annotations

from mcpd.common.inflight import PER_KEY, TOTAL, InFlight


def test_each_key_is_held_to_its_cap_and_others_still_find_room() -> None:
    limiter = InFlight(per_key=2)
    assert limiter.take("alice") is None and limiter.take("alice") is None
    assert limiter.take("alice") == PER_KEY  # refused: nothing counted
    assert limiter.held("alice") == 2 and limiter.total == 2
    assert limiter.take("bob") is None and limiter.held("bob") == 1


def test_the_total_cap_is_checked_first_and_frees_as_calls_end() -> None:
    limiter = InFlight(per_key=3, total=4)
    for key in ("a", "a", "b", "c"):
        assert limiter.take(key) is None
    assert limiter.over("d") == TOTAL and limiter.take("a") == TOTAL
    limiter.release("b")
    assert limiter.held("b") == 0 and limiter.take("a") is None
    assert limiter.take("a") == TOTAL  # full again (a holds 3 of 4: its cap is reached too)


def test_add_counts_past_the_caps_and_release_forgets_empty_keys() -> None:
    limiter = InFlight(per_key=1, total=1)
    limiter.add("alice")  # something already running that must count (a cancelled call's worker)
    limiter.add("alice")
    assert limiter.held("alice") == 2 and limiter.total == 2 and limiter.over("bob") == TOTAL
    limiter.release("alice")
    limiter.release("alice")
    assert limiter.total == 0 and limiter._by_key == {}  # an idle limiter holds no keys
    assert limiter.take("bob") is None
