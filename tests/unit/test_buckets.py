"""The token buckets that bound how fast a principal's workers are started (mcpd.common.buckets).

Rules: a bucket starts full (``burst`` takes at once succeed); over any span of ``t`` seconds a key
takes at most ``burst + rate * t`` tokens; a refused take names the seconds after which a take
succeeds, and taking then succeeds; keys are independent; full buckets are forgotten (memory).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpd.common.buckets import EPSILON, SWEEP_MIN, TokenBuckets


def test_a_full_burst_then_one_refusal_naming_the_refill_time() -> None:
    b = TokenBuckets(burst=4, rate=2.0)
    assert [b.take("alice", 100.0) for _ in range(4)] == [0.0] * 4
    assert b.take("alice", 100.0) == pytest.approx(0.5)
    assert b.take("bob", 100.0) == 0.0  # another key has its own bucket
    assert b.take("alice", 100.25) == pytest.approx(0.25)
    assert b.take("alice", 100.5) == 0.0
    assert b.take("alice", 100.5) == pytest.approx(0.5)


@pytest.mark.parametrize(("burst", "rate"), [(0, 1.0), (1, 0.0), (1, -1.0), (1, float("nan"))])
def test_a_bucket_needs_a_burst_and_a_positive_rate(burst: int, rate: float) -> None:
    with pytest.raises(ValueError):
        TokenBuckets(burst, rate)


@settings(max_examples=300, deadline=None)
@given(burst=st.integers(1, 20), rate=st.floats(0.01, 100.0),
       steps=st.lists(st.tuples(st.floats(0.0, 5.0), st.sampled_from(["a", "b"])), max_size=200))
def test_takes_never_pass_burst_plus_rate_times_span(burst: int, rate: float, steps: list[tuple[float, str]]) -> None:
    b = TokenBuckets(burst, rate)
    now = 1000.0
    taken: dict[str, list[float]] = {"a": [], "b": []}
    for gap, key in steps:
        now += gap
        wait = b.take(key, now)
        assert wait >= 0.0
        if wait == 0.0:
            taken[key].append(now)
        else:  # refused: nothing taken, and a take `wait` seconds later succeeds
            assert wait <= (1.0 + EPSILON) / rate
            probe = TokenBuckets(burst, rate)
            probe._held = dict(b._held)  # noqa: SLF001 - a copy, to look ahead without taking
            assert probe.take(key, now + wait) == 0.0
    for times in taken.values():
        for i, start in enumerate(times):
            for j in range(i, len(times)):
                assert j - i + 1 <= burst + rate * (times[j] - start) + EPSILON * len(times)


@settings(max_examples=100, deadline=None)
@given(burst=st.integers(1, 10), rate=st.floats(0.1, 10.0), n=st.integers(1, 30))
def test_a_key_left_alone_for_burst_over_rate_seconds_has_its_whole_burst_again(burst: int, rate: float, n: int) -> None:
    b = TokenBuckets(burst, rate)
    for _ in range(n):
        b.take("a", 0.0)
    later = burst / rate
    assert [b.take("a", later) for _ in range(burst)] == [0.0] * burst


def test_full_buckets_are_forgotten() -> None:
    b = TokenBuckets(burst=2, rate=1.0)
    for i in range(10 * SWEEP_MIN):  # each key takes once, each at its own second
        b.take(f"p{i}", float(i))
    assert len(b) <= 2 * SWEEP_MIN  # only the keys of the last two seconds are not full
    for _ in range(10 * SWEEP_MIN):
        b.take("busy", 10_000.0)  # one key refused over and over holds one entry
    assert len(b) <= 2 * SWEEP_MIN + 1


def test_a_token_given_back_is_there_again_and_never_past_the_burst() -> None:
    """A start that failed costs nothing (issue 28 item 6): its token is given back, so failures
    while the root helper is down do not empty the bucket the respawns then need."""
    b = TokenBuckets(burst=2, rate=1.0)
    assert b.take("a", 10.0) == 0.0 and b.take("a", 10.0) == 0.0
    assert b.take("a", 10.0) > 0
    for _ in range(100):  # a hundred failed starts, each taken and given back
        b.give_back("a", 10.0)
        assert b.take("a", 10.0) == 0.0
    b.give_back("a", 10.0)
    b.give_back("a", 10.0)
    b.give_back("a", 10.0)  # more than was taken: the bucket is only full
    assert len(b) == 0
    assert [b.take("a", 10.0) for _ in range(2)] == [0.0, 0.0] and b.take("a", 10.0) > 0
