"""Refusals on ``/mcp`` and the bodies they carry, against the real daemon over TLS: every refusal
by the transport is a JSON-RPC error whose id is the request's when the body is one request with a
valid id and ``null`` otherwise (a body never read, a client response); the stateless era's
envelope (``jsonrpc`` ``"2.0"``, a string ``method``) is ``400``; ``params`` present and not an
object is ``-32602``. Also the ``Accept`` rule at its edges.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.conftest import Daemon, SseSession
from tests.support.streamable import INIT, client, hdrs, headers, open_session, post, request

pytestmark = pytest.mark.anyio

INIT_ID = {**INIT, "id": "init-7"}


def rpc_error(r: httpx.Response, status: int, rid: Any, code: int = -32600) -> None:
    """``r`` is ``status`` with one JSON-RPC error ``code`` for id ``rid``."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers["content-type"]
    msg = r.json()
    assert msg["jsonrpc"] == "2.0" and msg["error"]["code"] == code and isinstance(msg["error"]["message"], str), msg
    assert "id" in msg and msg["id"] == rid and set(msg) == {"jsonrpc", "id", "error"}, msg


async def test_a_full_cap_refusal_carries_the_initializes_id(daemon_factory: Callable[..., Daemon]) -> None:
    """§1.6: "Every refusal of a POST whose body is one request with a valid id carries that id
    ... (no or an unknown session, a bad version header, a full session cap, ...)"."""
    d = daemon_factory(max_sessions_per_principal=1, mcp_session_evict_seconds=0)
    async with client(d) as c:
        await open_session(c, d)
        r = await c.post("/mcp", json=INIT_ID, headers=hdrs(d))
        assert r.status_code == 429 and r.json()["id"] == "init-7", r.text
        r = await c.post("/mcp", json=[INIT_ID], headers=hdrs(d))
        assert r.status_code in (400, 429) and r.json()["id"] is None, r.text


async def test_accept_edge_cases_as_documented(daemon: Daemon) -> None:
    """§1.6's Accept rule at its edges: ``q=0.`` and ``Q=0`` are weight 0, a quoted ``;q=1`` or
    comma inside a parameter is not a range, copies of the header are one list, ``q = 0`` breaks
    the grammar."""
    ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        for accept, status, ctype in (
                ("application/json;q=0., text/event-stream", 200, "text/event-stream"),
                ("application/json;Q=0, text/event-stream", 200, "text/event-stream"),
                ('application/json;a="x,y;q=1";q=0, text/event-stream', 200, "text/event-stream"),
                ("application/*, application/json;q=0", 406, "application/json"),
                ("text/event-stream;q=0, */*", 200, "application/json"),
                ("application/json;q = 0, text/event-stream", 400, "application/json")):
            r = await c.post("/mcp", json=ping, headers=hdrs(daemon, sid, accept=accept))
            assert r.status_code == status and r.headers["content-type"].startswith(ctype), (accept, r.text)
        h = [(k, v) for k, v in hdrs(daemon, sid).items() if k != "Accept"]
        r = await c.post("/mcp", json=ping, headers=h + [("Accept", "application/json;q=0"),
                                                         ("Accept", "text/event-stream")])
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")


async def test_refusals_of_a_body_never_read_carry_a_jsonrpc_error_with_id_null(
        daemon_factory: Callable[..., Daemon]) -> None:
    """``406`` (POST and GET), ``415`` and ``413`` are JSON-RPC errors with ``id: null``, though the
    body names a valid id: it was never read."""
    d = daemon_factory(max_body_bytes=1024)
    ping = {"jsonrpc": "2.0", "id": 4, "method": "ping"}
    async with client(d) as c:
        sid = await open_session(c, d)
        rpc_error(await c.post("/mcp", json=ping, headers=hdrs(d, sid, accept="*/*;q=0")), 406, None)
        rpc_error(await c.post("/mcp", json=ping, headers=hdrs(d, sid, accept="text/html")), 406, None)
        rpc_error(await c.get("/mcp", headers=hdrs(d, sid, accept="application/json")), 406, None)
        rpc_error(await c.post("/mcp", content=b'{"jsonrpc":"2.0","id":4,"method":"ping"}',
                               headers={**hdrs(d, sid), "Content-Type": "text/plain"}), 415, None)
        big = b'{"jsonrpc":"2.0","id":4,"method":"ping","params":{"_meta":{"x":"' + b"y" * 2000 + b'"}}}'
        rpc_error(await c.post("/mcp", content=big, headers=hdrs(d, sid)), 413, None)
        # stateless era too
        body = request("tools/list", rid="s")
        rpc_error(await c.post("/mcp", json=body, headers={**headers(d, body), "Content-Type": "text/plain"}),
                  415, None)
        rpc_error(await c.post("/mcp", json=body, headers=headers(d, body, Accept="image/png")), 406, None)


async def test_stateless_wrong_jsonrpc_member_is_400_like_a_bad_method(daemon: Daemon) -> None:
    """Stateless era: a body that is not one JSON-RPC object with a string method is ``400`` with
    ``-32600``, whatever is wrong: a non-string ``method``, a ``jsonrpc`` other than ``"2.0"`` or
    none; the request's id is kept, a notification's refusal has ``id: null``."""
    async with client(daemon) as c:
        r = await post(c, daemon, {**request("tools/list", rid="m"), "method": 5}, **{"Mcp-Method": "tools/list"})
        rpc_error(r, 400, "m")
        for jsonrpc in ("1.0", 2, None):
            rpc_error(await post(c, daemon, {**request("tools/list", rid="j"), "jsonrpc": jsonrpc}), 400, "j")
        missing = request("tools/list", rid=7)
        del missing["jsonrpc"]
        rpc_error(await post(c, daemon, missing), 400, 7)
        note = request("tools/list")
        del note["id"]
        rpc_error(await post(c, daemon, {**note, "jsonrpc": "1.0"}), 400, None)
        assert (await post(c, daemon, note)).status_code == 202  # (a well-formed notification)
        r = await post(c, daemon, request("tools/list", rid="ok"))
        assert r.status_code == 200 and r.json()["id"] == "ok" and "result" in r.json(), r.text


async def test_a_client_responses_refusal_has_id_null_in_both_eras(daemon: Daemon) -> None:
    """A client response (no ``method``; a ``result`` or ``error``) names no request of the client's:
    refused in the stateless era, or for an unknown session, its answer carries ``id: null``."""
    meta = {"_meta": request("tools/list")["params"]["_meta"]}
    async with client(daemon) as c:
        h = {k: v for k, v in headers(daemon, request("tools/list")).items() if k != "Mcp-Method"}
        responses = [{"jsonrpc": "2.0", "id": "r", "result": {}},
                     {"jsonrpc": "2.0", "id": "r", "error": {"code": 1, "message": "x"}}]
        for response in responses:
            rpc_error(await c.post("/mcp", json=response, headers=h), 400, None)
            rpc_error(await c.post("/mcp", json=response, headers=hdrs(daemon, "0" * 32)), 404, None)
        # (a _meta naming the version makes it the stateless era's, with or without a session id)
        named = {**responses[0], "params": meta}
        rpc_error(await c.post("/mcp", json=named, headers=h), 400, None)
        rpc_error(await c.post("/mcp", json=named, headers=hdrs(daemon, "0" * 32)), 400, None)
        sid = await open_session(c, daemon)
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": "r", "result": {}}, headers=hdrs(daemon, sid))
        assert r.status_code == 202 and r.content == b""  # (in a session it is ignored)
        # a request of an unknown session keeps its id
        rpc_error(await c.post("/mcp", json={"jsonrpc": "2.0", "id": "q", "method": "ping"},
                               headers=hdrs(daemon, "0" * 32)), 404, "q")


async def test_params_null_is_invalid_params(daemon: Daemon) -> None:
    """``params``, when present, must be an object for every method served: ``null`` is ``-32602``
    like an array, a string or a number, in the session era on ``/mcp`` and on ``/sse``; an absent
    ``params`` is fine."""
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        for method in ("tools/list", "ping", "resources/list"):
            for params in (None, [], "x", 3):
                r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": "p", "method": method, "params": params},
                                 headers=hdrs(daemon, sid))
                assert r.status_code == 200, r.text
                assert r.json()["id"] == "p" and r.json()["error"]["code"] == -32602, (method, params, r.text)
            r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": "a", "method": method}, headers=hdrs(daemon, sid))
            assert r.status_code == 200 and "result" in r.json(), r.text
    async with SseSession(daemon) as s:
        await s.initialize()
        assert (await s.post({"jsonrpc": "2.0", "id": "sp", "method": "tools/list", "params": None})).status_code == 202
        assert (await s.reply("sp"))["error"]["code"] == -32602
        assert "result" in await s.request("tools/list")
