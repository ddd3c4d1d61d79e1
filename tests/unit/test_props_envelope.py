"""Property tests (hypothesis) of the JSON-RPC envelope (docs/REFERENCE.md §2.3) as the front parses and
answers it: generated bodies (raw text, so ``1e400``, lone surrogates, deep nesting and huge
integers are reachable) go through the front's body parser and a real session
(:class:`mcpd.front.mcp.session.McpSession`), and every reply through the stream's encoder.

Asserted for every body: it is refused with a JSON error body, or every member that is a request
gets exactly one reply (a batch: one array holding one reply per request), notifications and
client responses get none, and every reply is strict JSON (no ``NaN``/``Infinity``) that encodes as
UTF-8. The methods generated never reach a worker (the transport fuzz test in
``tests/integration/test_fuzz_transport.py`` does that). Derandomized, bounded.
"""

from __future__ import annotations

import asyncio
import math
from decimal import Decimal
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from mcpd.front.events import encode_message
from mcpd.front.mcp.dispatcher import Dispatcher
from mcpd.front.mcp.session import McpSession
from mcpd.front.transport.body import BodyRefused, parse_json
from tests.support.envelope import BODY, CALLER, SETTINGS
from tests.support.fuzzgen import answered, dump, strict


def exchange(payload: Any) -> list[Any]:
    async def go() -> list[Any]:
        sent: list[bytes] = []
        session = McpSession(Dispatcher(pool=None, privileged=None), "0" * 32,  # type: ignore[arg-type]
                             lambda m: sent.append(encode_message(m)))
        task = session.receive(payload, CALLER)
        if task is not None:
            await asyncio.wait_for(task, 10)
        session.close()
        return [strict(s.decode("utf-8")) for s in sent]

    return asyncio.run(go())


@SETTINGS
@given(body=BODY)
def test_every_request_gets_exactly_one_valid_json_reply(body: Any) -> None:
    raw = dump(body).encode("utf-8", "surrogatepass")
    try:
        payload = parse_json(raw)
    except BodyRefused as exc:
        resp = exc.response()
        assert resp.status_code == 400
        reply = strict(bytes(resp.body).decode("utf-8"))
        assert reply["id"] is None and reply["error"]["code"] in (-32700, -32600)
        return
    replies = exchange(payload)
    if isinstance(payload, list):
        want = [m for m in payload if answered(m)] if payload else [None]
        if not want:
            assert replies == []
            return
        assert len(replies) == 1, replies
        got = replies[0] if payload else [replies[0]]
        assert isinstance(got, list) and len(got) == len(want), (got, want)
    else:
        got = replies
        assert len(got) == (1 if answered(payload) else 0), (payload, replies)
    for reply in got:
        assert reply["jsonrpc"] == "2.0" and ("result" in reply) != ("error" in reply), reply
        rid = reply["id"]
        assert rid is None or isinstance(rid, str) or (isinstance(rid, (int, float)) and not isinstance(rid, bool))


NUMBER_TEXT = st.builds(
    lambda sign, whole, frac, exp: f"{sign}{whole}{frac}{exp}",
    st.sampled_from(["", "-"]),
    st.one_of(st.just("0"), st.from_regex(r"[1-9][0-9]{0,24}", fullmatch=True)),
    st.one_of(st.just(""), st.from_regex(r"\.[0-9]{1,25}", fullmatch=True)),
    st.one_of(st.just(""), st.builds(lambda e, n: f"{e}{n}", st.sampled_from(["e", "E", "e+", "e-", "E-"]),
                                     st.integers(0, 400))),
).filter(lambda t: "." in t or "e" in t.lower())  # a number the parser hands to parse_float


@SETTINGS
@given(text=NUMBER_TEXT)
def test_a_number_id_is_valid_exactly_when_its_reply_carries_the_same_number(text: str) -> None:
    """The id rule (a number not exactly representable is invalid, -32600 with id null) against
    an exact oracle: the reply's id, written in its shortest form, is the number the client sent,
    or the reply's id is null."""
    value = float(text)
    same = math.isfinite(value) and Decimal(text) == Decimal(repr(value))
    payload = parse_json(f'{{"jsonrpc":"2.0","id":{text},"method":"ping"}}'.encode())
    [reply] = exchange(payload)
    if same:
        assert reply == {"jsonrpc": "2.0", "id": value, "result": {}}, (text, reply)
    else:
        assert reply["id"] is None and reply["error"]["code"] == -32600, (text, reply)
