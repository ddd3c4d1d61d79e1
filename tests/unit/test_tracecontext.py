"""mcpd.common.tracecontext: W3C Trace Context checked strictly, an invalid value dropped."""

from __future__ import annotations

import pytest

from mcpd.common.tracecontext import trace_fields, traceparent, tracestate

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("value", [GOOD, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"])
def test_a_valid_traceparent_is_kept(value: str) -> None:
    assert traceparent(value) == value


@pytest.mark.parametrize("value", [
    None, 7, "", GOOD.upper(), GOOD + "-", GOOD[:-1], " " + GOOD, GOOD + "\n",
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # a version this syntax does not define
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
    "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
    "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\u0660",
])
def test_an_invalid_traceparent_is_dropped(value: object) -> None:
    assert traceparent(value) is None


@pytest.mark.parametrize("value", [
    "rojo=00f067aa0ba902b7", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7", " a=1 ,\tb=2 ", "a=1,,b=2",
    "tenant@vendor=x", "0tenant@v=x", "k=" + "v" * 256, ",".join(f"k{i}=v" for i in range(32)),
])
def test_a_valid_tracestate_is_kept(value: str) -> None:
    assert tracestate(value) == value


@pytest.mark.parametrize("value", [
    None, 1, "", ",", "a", "=v", "A=1", "a=", "a=v,a=w", "a=b=c", "a=b\nc", "a=\x7f", "a=é",
    "k=" + "v" * 257, ",".join(f"k{i}=v" for i in range(33)), "a=" + "v" * 510 + ",b=1",
    'a=x","user":"root', "t@" + "v" * 15 + "=1",
])
def test_an_invalid_tracestate_is_dropped(value: object) -> None:
    assert tracestate(value) is None


def test_trace_fields_of_meta() -> None:
    assert trace_fields(None) == {} and trace_fields([]) == {} and trace_fields({}) == {}
    assert trace_fields({"traceparent": GOOD}) == {"traceparent": GOOD}
    assert trace_fields({"traceparent": GOOD, "tracestate": "a=1"}) == {"traceparent": GOOD, "tracestate": "a=1"}
    assert trace_fields({"traceparent": GOOD, "tracestate": "a=\n"}) == {"traceparent": GOOD}
    assert trace_fields({"traceparent": "bad", "tracestate": "a=1"}) == {}  # no state without its parent
