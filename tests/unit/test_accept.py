"""The ``Accept`` parser of ``/mcp`` (``mcpd.front.transport.accept``): media ranges, weights with up
to three decimals, the most specific range deciding, a weight of 0 refusing, malformed values
refused as a whole."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpd.front.transport.accept import MalformedAccept, acceptable, parse, weight

JSON, SSE = "application/json", "text/event-stream"
BOTH = (JSON, SSE)


@pytest.mark.parametrize(("values", "accepted"), [
    ([], {JSON, SSE}),  # no header: anything
    ([""], set()),  # present but empty: nothing
    ([" , ,"], set()),
    (["application/json, text/event-stream"], {JSON, SSE}),
    (["*/*"], {JSON, SSE}),
    (["*/*;q=0"], set()),
    (["*/*;q=0.001"], {JSON, SSE}),
    (["application/json;q=0, text/event-stream"], {SSE}),
    (["application/json, text/event-stream;q=0"], {JSON}),
    (["APPLICATION/JSON;Q=0.5"], {JSON}),
    (["application/*"], {JSON}),
    (["text/*;q=1.000"], {SSE}),
    (["*/*, application/json;q=0"], {SSE}),  # the most specific range decides ...
    (["application/json;q=0, */*"], {SSE}),  # ... wherever it stands
    (["application/*;q=0, application/json;q=0.1"], {JSON}),
    (["*/*;q=0.5, text/*;q=0, text/event-stream;q=0.2"], {JSON, SSE}),
    (["text/event-stream;q=0, text/event-stream;q=0.3"], {SSE}),  # equally specific: the highest
    (['application/json;charset="utf-8, or not";q=0, text/event-stream'], {SSE}),  # a comma quoted
    (['text/event-stream; a="\\"q=0\\""'], {SSE}),  # an escaped quote inside a parameter
    (["application/json;charset=utf-8"], {JSON}),  # other parameters do not restrict a range
    (["application/json;", "text/event-stream ; q=0 ;"], {JSON}),  # copies are one list
    (["text/html, image/*"], set()),
    (["application/jsonx, text/event-streams, app/json"], set()),
])
def test_acceptable(values: list[str], accepted: set[str]) -> None:
    assert acceptable(values, BOTH) == accepted


@pytest.mark.parametrize("value", [
    "json", "*", "*/json", "application/", "/json", "application/json;q=2", "application/json;q=1.001",
    "application/json;q=.5", "application/json;q=0.5000", "application/json;q=-0", "application/json;q=1e-3",
    'application/json;q="0.5"', "application/json;q=", "application/json;q=0;q=1", "application/json;q = 1",
    "application/json;q =1", "application/json;q= 1", "application/json;charset", "application/json x",
    'application/json;a="unterminated', "application/json;a=b c", "appli cation/json", "text/event-stream\x00",
    "application/json;a=\"\x7f\"", "application/json,;q=1", "application/json;q=nan", "application/json;q=0x1",
])
def test_malformed_values_are_refused(value: str) -> None:
    with pytest.raises(MalformedAccept):
        acceptable([value], BOTH)


@pytest.mark.parametrize(("qvalue", "thousandths"), [
    ("0", 0), ("0.", 0), ("0.0", 0), ("0.000", 0), ("0.001", 1), ("0.5", 500), ("0.25", 250), ("0.999", 999),
    ("1", 1000), ("1.", 1000), ("1.0", 1000), ("1.000", 1000),
])
def test_weights(qvalue: str, thousandths: int) -> None:
    assert parse(f"text/event-stream;q={qvalue}") == [("text", "event-stream", thousandths)]
    assert weight(parse(f"text/event-stream;q={qvalue}"), SSE) == thousandths


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=255), max_size=60))
def test_any_latin1_text_parses_or_is_refused_cleanly(value: str) -> None:
    """Whatever the header holds, the answer is a subset of the offered types or MalformedAccept."""
    try:
        assert acceptable([value], BOTH) <= {JSON, SSE}
    except MalformedAccept:
        pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["*/*", "application/*", "text/*", JSON, SSE, "text/html"]),
                          st.integers(0, 1000), st.booleans()), max_size=6))
def test_weights_follow_the_rule(ranges: list[tuple[str, int, bool]]) -> None:
    """Against a direct statement of the rule: the most specific matching range, its highest weight."""
    value = ", ".join(r if not explicit else f"{r};q={q / 1000:.3f}" for r, q, explicit in ranges)
    for offered in BOTH:
        kind = offered.split("/")[0]
        levels = {"*/*": 0, f"{kind}/*": 1, offered: 2}
        matching = [(levels[r], q if explicit else 1000) for r, q, explicit in ranges if r in levels]
        top = max((level for level, _ in matching), default=None)
        want = max((q for level, q in matching if level == top), default=0)
        assert weight(parse(value), offered) == want, (value, offered)
