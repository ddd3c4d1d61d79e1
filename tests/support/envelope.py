"""Bodies, callers and settings of the envelope property tests."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st

from mcpd.common.identity import Principal
from mcpd.front.mcp.dispatcher import Caller
from tests.support.fuzzgen import Raw

SETTINGS = settings(derandomize=True, max_examples=800, deadline=None, database=None)


CALLER = Caller(Principal("alice", "alice", "t1"), "t" * 32, "127.0.0.1:1")


SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from([Raw("1e400"), Raw("-1e400"), Raw('"\\ud800"'), Raw('"a\\udfff"'), Raw("1.0"), Raw("-0"),
                     Raw("123456789012345678901234567890"), Raw("1E+2")]),
)


VALUE = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                         max_size=3), max_leaves=8)


METHOD = st.one_of(
    st.sampled_from(["ping", "initialize", "tools/list", "resources/list", "resources/templates/list",
                     "resources/read", "tools/call", "server/discover", "notifications/initialized",
                     "notifications/cancelled", "nope", ""]),
    SCALAR,
)


PARAMS = st.one_of(
    VALUE,
    st.fixed_dictionaries({}, optional={
        "protocolVersion": st.sampled_from(["2024-11-05", "2025-06-18", "1999"]) | SCALAR,
        "name": st.sampled_from(["no/such/tool", "x"]) | SCALAR,
        "uri": st.text(max_size=8) | SCALAR,
        "requestId": SCALAR,
        "_meta": st.fixed_dictionaries({}, optional={"progressToken": SCALAR}) | SCALAR,
    }),
)


MESSAGE = st.one_of(
    st.fixed_dictionaries({}, optional={"jsonrpc": st.just("2.0") | SCALAR, "id": SCALAR, "method": METHOD,
                                        "params": PARAMS, "result": VALUE, "error": VALUE}),
    SCALAR,
    VALUE,
)


BODY = st.one_of(MESSAGE, st.lists(MESSAGE, max_size=5), st.integers(60, 70).map(lambda d: Raw("[" * d + "]" * d)))
