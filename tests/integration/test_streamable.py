"""Streamable HTTP at ``/mcp``, session era (docs/REFERENCE.md §1.6), against the real daemon over TLS.

Raw HTTP, so every rule is seen on the wire: the session header, JSON or SSE answers, GET, DELETE,
the protocol-version header, and the same auth, origin, body and session rules as ``/sse``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Daemon, SseSession
from tests.support.streamable import ACCEPT_BOTH, INIT, client, hdrs, open_session, raw_headers, sse_messages
from tests.support.workers import slow_file, worker_pids

pytestmark = pytest.mark.anyio


async def test_initialize_list_call_read_resource_as_json(daemon: Daemon, tmp_path: Path) -> None:
    p = tmp_path / "notes.txt"
    p.write_text("first\nsecond\n")
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        h = hdrs(daemon, sid, **{"MCP-Protocol-Version": "2025-06-18"})
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=h)
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
        assert "files/read" in [t["name"] for t in r.json()["result"]["tools"]]
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": "two", "method": "tools/call",
                                        "params": {"name": "files/read", "arguments": {"path": str(p)}}}, headers=h)
        assert r.json() == {"jsonrpc": "2.0", "id": "two", "result": r.json()["result"]}
        assert r.json()["result"]["content"][0]["text"] == "first\nsecond\n"
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 3, "method": "resources/read",
                                        "params": {"uri": f"file://{p}"}}, headers=h)
        assert r.json()["result"]["contents"][0]["text"] == "first\nsecond\n"
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 4, "method": "ping"}, headers=h)
        assert r.json()["result"] == {}


async def test_progress_request_answered_as_event_stream_then_ends(daemon: Daemon, tmp_path: Path) -> None:
    for d in range(3):
        (tmp_path / f"d{d}").mkdir()
        for i in range(4000):
            (tmp_path / f"d{d}" / f"f{i}").touch()
    call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": "files/find", "arguments": {"root": str(tmp_path), "name": "nomatch"},
                       "_meta": {"progressToken": "p1"}}}
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        r = await c.post("/mcp", json=call, headers=hdrs(daemon, sid))
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["mcp-session-id"] == sid and r.headers["x-accel-buffering"] == "no"
        msgs = sse_messages(r.text)  # the body ended: the stream closes after the reply
        progress = [m for m in msgs if m.get("method") == "notifications/progress"]
        assert progress and all(m["params"]["progressToken"] == "p1" for m in progress)
        assert msgs[-1]["id"] == 9 and msgs[-1]["result"]["structuredContent"]["matches"] == []
        # The same request from a client that accepts only JSON: one JSON reply, no progress.
        r = await c.post("/mcp", json=call, headers=hdrs(daemon, sid, accept="application/json"))
        assert r.headers["content-type"].startswith("application/json") and r.json()["id"] == 9
        # Without a progress token: JSON even though the client accepts a stream.
        plain = {**call, "params": {k: v for k, v in call["params"].items() if k != "_meta"}}
        r = await c.post("/mcp", json=plain, headers=hdrs(daemon, sid))
        assert r.headers["content-type"].startswith("application/json")


async def test_session_header_rules(daemon: Daemon) -> None:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        r = await c.post("/mcp", json=ping, headers=hdrs(daemon))
        assert r.status_code == 400 and r.json()["error"]["code"] == -32600 and r.json()["id"] == 1
        r = await c.post("/mcp", json=ping, headers=hdrs(daemon, "not-hex"))
        assert r.status_code == 400
        r = await c.post("/mcp", json=ping, headers=hdrs(daemon, "0" * 32))
        assert r.status_code == 404
        # Another principal's session id: 404, as if it did not exist.
        r = await c.post("/mcp", json=ping, headers=hdrs(daemon, sid, token=daemon.other_token))
        assert r.status_code == 404
        for method in ("GET", "DELETE"):
            r = await c.request(method, "/mcp", headers=hdrs(daemon, sid, token=daemon.other_token))
            assert r.status_code == 404, method
        r = await c.post("/mcp", json=ping, headers=hdrs(daemon, sid))
        assert r.status_code == 200


async def test_sessions_do_not_cross_transports(daemon: Daemon) -> None:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with client(daemon) as c, SseSession(daemon) as s:
        sse_id = s.endpoint.rsplit("=", 1)[1]
        r = await c.post("/mcp", json=ping, headers=hdrs(daemon, sse_id))
        assert r.status_code == 404
        sid = await open_session(c, daemon)
        r = await c.post(f"/message?session_id={sid}", json=ping, headers=hdrs(daemon))
        assert r.status_code == 404


async def test_protocol_version_header_checked(daemon: Daemon) -> None:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with client(daemon) as c:
        sid = await open_session(c, daemon, version="2025-11-25")
        for bad in ("1999-01-01", "2025-06-18x", ""):
            r = await c.post("/mcp", json=ping, headers=hdrs(daemon, sid, **{"MCP-Protocol-Version": bad}))
            assert r.status_code == 400, bad
            assert "2025-11-25" in r.json()["error"]["message"]
        r = await c.post("/mcp", json=ping, headers=hdrs(daemon, sid, **{"MCP-Protocol-Version": "2025-11-25"}))
        assert r.status_code == 200
        r = await c.post("/mcp", json=ping, headers=hdrs(daemon, sid))  # absent: the negotiated one
        assert r.status_code == 200
        r = await c.post("/mcp", json=INIT, headers=hdrs(daemon, **{"MCP-Protocol-Version": "1999-01-01"}))
        assert r.status_code == 400 and "mcp-session-id" not in r.headers


async def test_delete_checks_the_protocol_version_as_post_and_get_do(daemon: Daemon) -> None:
    """An unsupported or repeated ``MCP-Protocol-Version`` is ``400`` on DELETE as on POST and GET,
    and the session is not ended (before: DELETE ignored the header, answered 200, ended it)."""
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        for bad in ("garbage", "2025-06-18, 2024-11-05", "", "2026-07-28"):
            for method in ("DELETE", "GET", "POST"):
                r = await c.request(method, "/mcp", json=ping if method == "POST" else None,
                                    headers=hdrs(daemon, sid, **{"MCP-Protocol-Version": bad}))
                assert r.status_code == 400, (method, bad, r.status_code)
                assert r.json()["error"]["code"] == -32600 and "2025-11-25" in r.json()["error"]["message"]
        twice = [*hdrs(daemon, sid).items(), ("MCP-Protocol-Version", "2025-06-18"),
                 ("MCP-Protocol-Version", "2025-06-18")]
        r = await c.request("DELETE", "/mcp", headers=twice)
        assert r.status_code == 400 and r.json()["error"]["code"] == -32600
        # An unknown session with a bad version: the version is checked first, as for POST and GET.
        r = await c.delete("/mcp", headers=hdrs(daemon, "0" * 32, **{"MCP-Protocol-Version": "garbage"}))
        assert r.status_code == 400
        r = await c.post("/mcp", json=ping, headers=hdrs(daemon, sid))
        assert r.status_code == 200, "a refused DELETE ended the session"
        r = await c.delete("/mcp", headers=hdrs(daemon, sid, **{"MCP-Protocol-Version": "2025-06-18"}))
        assert r.status_code == 200
        r = await c.post("/mcp", json=ping, headers=hdrs(daemon, sid))
        assert r.status_code == 404


async def test_accept_weights_zero_is_not_acceptable(daemon: Daemon) -> None:
    """``Accept`` ranges carry weights: ``q=0`` is "not acceptable" (RFC 9110), the most specific
    range decides, and a client left accepting neither of the two types gets ``406`` (before, the
    weights were dropped and ``q=0`` counted as acceptance); a malformed header is ``400``."""
    progress = {"jsonrpc": "2.0", "id": 5, "method": "ping", "params": {"_meta": {"progressToken": "p"}}}
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        for accept in ("*/*;q=0", "application/json;q=0, text/event-stream;q=0.000", "application/*;q=0,text/*;Q=0",
                       "*/*, application/json;q=0, text/event-stream;q=0", "text/html", ""):
            r = await c.post("/mcp", json=progress, headers=hdrs(daemon, sid, accept=accept))
            assert r.status_code == 406, (accept, r.status_code, r.text)
        # JSON refused: the reply comes as a one-event stream; the event stream refused: as JSON.
        for accept in ("application/json;q=0, text/event-stream", "*/*;q=0.5, application/json;q=0",
                       "application/*;q=0, */*"):
            r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 6, "method": "ping"},
                             headers=hdrs(daemon, sid, accept=accept))
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), accept
            assert sse_messages(r.text) == [{"jsonrpc": "2.0", "id": 6, "result": {}}]
        for accept in ("application/json, text/event-stream;q=0", "*/*, text/*;q=0", "text/event-stream;q=0, */*;q=1"):
            r = await c.post("/mcp", json=progress, headers=hdrs(daemon, sid, accept=accept))
            assert r.status_code == 200 and r.headers["content-type"].startswith("application/json"), accept
            assert r.json() == {"jsonrpc": "2.0", "id": 5, "result": {}}
        # The header sent twice is one list: its q=0 still counts.
        twice = [(k, v) for k, v in hdrs(daemon, sid).items() if k != "Accept"]
        r = await c.post("/mcp", json=progress, headers=[*twice, ("Accept", "application/json"),
                                                         ("Accept", "text/event-stream;q=0")])
        assert r.headers["content-type"].startswith("application/json")
        # GET needs the event stream acceptable: a weight of 0 is 406, a small one is enough.
        for accept in ("application/json, text/event-stream;q=0", "*/*;q=0", "text/*;q=0, application/json"):
            r = await c.get("/mcp", headers=hdrs(daemon, sid, accept=accept))
            assert r.status_code == 406, accept
        async with c.stream("GET", "/mcp", headers=hdrs(daemon, sid, accept="text/event-stream;q=0.001")) as g:
            assert g.status_code == 200
        for accept in ("application/json;q=2", "application/json;q=.5", "application/json;q=0.5000",
                       "application/json;q=-0", 'application/json;q="1"', "application/json;q=1;q=0",
                       "application/json;q = 1", "json", "*/json", "text/event-stream;charset"):
            for method in ("POST", "GET"):
                r = await c.request(method, "/mcp", json=progress if method == "POST" else None,
                                    headers=hdrs(daemon, sid, accept=accept))
                assert r.status_code == 400 and r.json()["error"]["code"] == -32600, (method, accept, r.text)
                assert "Accept" in r.json()["error"]["message"]


async def test_session_era_refusals_carry_the_requests_id(daemon: Daemon) -> None:
    """A refusal of a POST whose body is one request with a valid id carries that id (JSON-RPC 2.0:
    whenever it could be read): no session header, an unknown session, a bad version header; a
    batch's refusal has none."""
    ping = {"jsonrpc": "2.0", "id": "p-1", "method": "ping"}
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        for h, status in ((hdrs(daemon), 400), (hdrs(daemon, "nothex"), 400), (hdrs(daemon, "0" * 32), 404),
                          (hdrs(daemon, sid, token=daemon.other_token), 404),
                          (hdrs(daemon, sid, **{"MCP-Protocol-Version": "1999-01-01"}), 400)):
            r = await c.post("/mcp", json=ping, headers=h)
            assert r.status_code == status and r.json()["id"] == "p-1", (status, r.text)
            r = await c.post("/mcp", json=[ping], headers=h)
            assert r.status_code == status and r.json()["id"] is None, (status, r.text)


async def test_auth_origin_content_type_body_cap(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory(max_body_bytes=1024, allowed_origins=["https://ok.example"])
    async with client(d) as c:
        r = await c.post("/mcp", json=INIT, headers={"Accept": ACCEPT_BOTH})
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        r = await c.post("/mcp", json=INIT, headers=hdrs(d, token="wrong"))
        assert r.status_code == 401
        r = await c.post("/mcp", json=INIT, headers=hdrs(d, Origin="https://evil.example"))
        assert r.status_code == 403
        r = await c.post("/mcp", json=INIT, headers=hdrs(d, Origin="https://ok.example"))
        assert r.status_code == 200
        sid = r.headers["mcp-session-id"]
        r = await c.post("/mcp", content=b"{}", headers={**hdrs(d, sid), "Content-Type": "text/plain"})
        assert r.status_code == 415
        r = await c.post("/mcp", content=b"{" + b" " * 2000 + b"}", headers=hdrs(d, sid))
        assert r.status_code == 413
        r = await c.post("/mcp", content=b"{nope", headers=hdrs(d, sid))
        assert r.status_code == 400 and r.json()["error"]["code"] == -32700
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                         headers=hdrs(d, sid, accept="text/html"))
        assert r.status_code == 406


async def test_failed_initialize_leaves_no_session(daemon_factory: Callable[..., Daemon]) -> None:
    daemon = daemon_factory(max_sessions=1)
    async with client(daemon) as c:
        bad = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 7}}
        with_progress = {**bad, "params": {**bad["params"], "_meta": {"progressToken": "p"}}}
        for body in (bad, with_progress):  # answered as JSON either way, with no session left behind
            r = await c.post("/mcp", json=body, headers=hdrs(daemon))
            assert r.status_code == 200 and r.json()["error"]["code"] == -32602
            assert "mcp-session-id" not in r.headers
        await open_session(c, daemon)  # the only slot is still free


async def test_requests_before_initialized_and_envelope_errors(daemon: Daemon) -> None:
    async with client(daemon) as c:
        r = await c.post("/mcp", json=INIT, headers=hdrs(daemon))
        sid = r.headers["mcp-session-id"]
        r = await c.post("/mcp", json=[], headers=hdrs(daemon, sid))
        assert r.status_code == 400 and r.json()["error"]["code"] == -32600
        r = await c.post("/mcp", json={"jsonrpc": "1.0", "id": 5, "method": "ping"}, headers=hdrs(daemon, sid))
        assert r.status_code == 200 and r.json()["error"]["code"] == -32600 and r.json()["id"] == 5
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 6, "method": "nope"}, headers=hdrs(daemon, sid))
        assert r.json()["error"]["code"] == -32601
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 7, "result": {}}, headers=hdrs(daemon, sid))
        assert r.status_code == 202  # a client's response: accepted, nothing to answer


async def test_an_id_not_exactly_representable_is_an_invalid_id_in_both_eras(daemon: Daemon) -> None:
    """As on /sse: 9007199254740993.0 is refused -32600 with id null (400: no usable id), never
    answered as 9007199254740992.0; so in the stateless era, whatever the method (there, as for
    any invalid id, the refusal comes with 200, or 404 for an unknown method)."""
    raw = b'{"jsonrpc":"2.0","id":9007199254740993.0,"method":"%s"%s}'
    meta = (b',"params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
            b'"io.modelcontextprotocol/clientCapabilities":{}}}')
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        r = await c.post("/mcp", content=raw % (b"ping", b""), headers=hdrs(daemon, sid))
        assert r.status_code == 400 and r.json()["id"] is None and r.json()["error"]["code"] == -32600, r.text
        for method in (b"tools/list", b"nope"):
            r = await c.post("/mcp", content=raw % (method, meta), headers=hdrs(
                daemon, **{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method.decode()}))
            assert r.status_code < 500 and r.json()["id"] is None, (method, r.status_code, r.text)
            assert r.json()["error"]["code"] in (-32600, -32601), r.text
        r = await c.post("/mcp", content=raw.replace(b"993.0", b"992.0") % (b"tools/list", meta), headers=hdrs(
            daemon, **{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"}))
        assert r.status_code == 200 and r.json()["id"] == 9007199254740992.0, r.text


async def test_a_batch_far_past_max_batch_is_refused_whole(daemon_factory: Callable[..., Daemon]) -> None:
    """As on /sse: a batch of 50,000 members (max_batch 256) is refused whole with one -32600
    without an id (HTTP 400), none of its members run, in a short answer (before: 100,000 members
    took 8 s and a 9.3 MB answer; then 513 replies and nothing for the rest); the session goes on."""
    d = daemon_factory(session_queue_bytes=1024 * 1024)
    async with client(d) as c:
        sid = await open_session(c, d, version="2025-03-26")  # (batches end with 2025-06-18)
        body = json.dumps([{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(50_000)]).encode()
        r = await c.post("/mcp", content=body, headers=hdrs(d, sid), timeout=120)
        assert r.status_code == 400 and len(r.content) < 1024, (r.status_code, len(r.content))
        answer = r.json()
        assert answer["id"] is None and answer["error"]["code"] == -32600, answer
        assert "50000 members" in answer["error"]["message"] and "none of them was run" in answer["error"]["message"]
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=hdrs(d, sid))
        assert r.json() == {"jsonrpc": "2.0", "id": 1, "result": {}}


async def test_a_batch_past_max_batch_asking_for_progress_is_refused_on_its_stream(
        daemon_factory: Callable[..., Daemon]) -> None:
    """A batch past max_batch whose members ask for progress (so it would be answered as an event
    stream) gets its one refusal on that stream, not an empty stream."""
    d = daemon_factory(max_batch=2)
    async with client(d) as c:
        sid = await open_session(c, d, version="2025-03-26")  # (batches end with 2025-06-18)
        batch = [{"jsonrpc": "2.0", "id": i, "method": "ping", "params": {"_meta": {"progressToken": i}}}
                 for i in range(3)]
        r = await c.post("/mcp", json=batch, headers=hdrs(d, sid))
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
        data = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
        assert len(data) == 1, r.text
        refusal = json.loads(data[0])
        assert refusal["id"] is None and refusal["error"]["code"] == -32600, refusal


async def test_get_stream_and_delete(daemon: Daemon) -> None:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        r = await c.get("/mcp", headers=hdrs(daemon))
        assert r.status_code == 400
        r = await c.get("/mcp", headers=hdrs(daemon, sid, accept="application/json"))
        assert r.status_code == 406
        async with c.stream("GET", "/mcp", headers=hdrs(daemon, sid, accept="text/event-stream")) as g:
            assert g.status_code == 200 and g.headers["content-type"].startswith("text/event-stream")
            assert g.headers["cache-control"] == "no-cache, no-transform"
            r = await c.get("/mcp", headers=hdrs(daemon, sid, accept="text/event-stream"))
            assert r.status_code == 409
        # The GET stream's end does not end the session.
        await asyncio.sleep(0.3)
        r = await c.post("/mcp", json=ping, headers=hdrs(daemon, sid))
        assert r.status_code == 200
        r = await c.delete("/mcp", headers=hdrs(daemon, sid))
        assert r.status_code == 200
        r = await c.post("/mcp", json=ping, headers=hdrs(daemon, sid))
        assert r.status_code == 404
        r = await c.delete("/mcp", headers=hdrs(daemon, sid))
        assert r.status_code == 404


async def test_delete_ends_an_open_get_stream(daemon: Daemon) -> None:
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        async with c.stream("GET", "/mcp", headers=hdrs(daemon, sid, accept="text/event-stream")) as g:
            assert g.status_code == 200
            r = await c.delete("/mcp", headers=hdrs(daemon, sid))
            assert r.status_code == 200
            async with asyncio.timeout(10):
                try:
                    async for _ in g.aiter_bytes():
                        pass  # returns once the server ended the stream
                except httpx.RemoteProtocolError:
                    pass  # cut like a /sse stream whose session ends


async def test_session_cap_shared_with_sse(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory(max_sessions=2)
    async with client(d) as c:
        sid = await open_session(c, d)
        async with SseSession(d):
            r = await c.post("/mcp", json=INIT, headers=hdrs(d))
            assert r.status_code == 503 and "mcp-session-id" not in r.headers
            r = await c.get("/sse", headers=d.auth())
            assert r.status_code == 503
        # The /sse session ended with its stream: one slot is free again, for either transport.
        deadline = time.monotonic() + 10
        while (r := await c.post("/mcp", json=INIT, headers=hdrs(d))).status_code == 503:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert r.status_code == 200
        async with c.stream("GET", "/sse", headers=d.auth()) as s:
            assert s.status_code == 503
        r = await c.delete("/mcp", headers=hdrs(d, sid))
        assert r.status_code == 200
        async with SseSession(d) as s:
            assert s.endpoint.startswith("/message?session_id=")


async def test_idle_session_expires(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory(mcp_session_idle_seconds=1)
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with client(d) as c:
        idle = await open_session(c, d)
        streaming = await open_session(c, d)
        async with c.stream("GET", "/mcp", headers=hdrs(d, streaming, accept="text/event-stream")) as g:
            assert g.status_code == 200
            await asyncio.sleep(3.5)  # idle 1 s, swept once a second (each request would renew it)
            r = await c.post("/mcp", json=ping, headers=hdrs(d, idle))
            assert r.status_code == 404
            # A session with an open GET stream is not idle.
            r = await c.post("/mcp", json=ping, headers=hdrs(d, streaming))
            assert r.status_code == 200


async def test_a_full_principal_cap_evicts_its_longest_idle_mcp_session(daemon_factory: Callable[..., Daemon]) -> None:
    """docs/REFERENCE.md §1.7 (a bound reached gives a clear refusal) against clients that never end their
    sessions (one client per task, no ``DELETE``): at a full ``max_sessions_per_principal``, a
    ``/mcp`` session idle for ``mcp_session_evict_seconds`` makes room, the longest idle first;
    one just used, one with a GET stream, and another principal's never do (one with a request
    in flight: tests/unit/test_session_evict.py). Its client gets 404 (and initializes again)."""
    d = daemon_factory(max_sessions_per_principal=3, mcp_session_evict_seconds=1)
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with client(d) as c:
        oldest = await open_session(c, d)
        used = await open_session(c, d)
        streaming = await open_session(c, d)
        bobs = await open_session(c, d, token=d.other_token)
        r = await c.post("/mcp", json=INIT, headers=hdrs(d))
        assert r.status_code == 429, "a session idle less than mcp_session_evict_seconds was evicted"
        async with c.stream("GET", "/mcp", headers=hdrs(d, streaming, accept="text/event-stream")) as g:
            assert g.status_code == 200
            await asyncio.sleep(1.5)
            assert (await c.post("/mcp", json=ping, headers=hdrs(d, used))).status_code == 200
            r = await c.post("/mcp", json=INIT, headers=hdrs(d))
            assert r.status_code == 200, r.text
            newest = r.headers["mcp-session-id"]
            assert (await c.post("/mcp", json=ping, headers=hdrs(d, oldest))).status_code == 404
            for sid in (used, streaming, newest):
                assert (await c.post("/mcp", json=ping, headers=hdrs(d, sid))).status_code == 200, sid
            assert (await c.post("/mcp", json=ping, headers=hdrs(d, bobs, token=d.other_token))).status_code == 200
            # Now every one of alice's is in use or fresh: the cap refuses again.
            r = await c.post("/mcp", json=INIT, headers=hdrs(d))
            assert r.status_code == 429
            async with c.stream("GET", "/sse", headers=d.auth()) as s:
                assert s.status_code == 429


async def test_session_eviction_can_be_turned_off(daemon_factory: Callable[..., Daemon]) -> None:
    """``mcp_session_evict_seconds: 0``: a full cap is always 429, however long a session idles."""
    d = daemon_factory(max_sessions_per_principal=1, mcp_session_evict_seconds=0)
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with client(d) as c:
        sid = await open_session(c, d)
        await asyncio.sleep(1.5)
        assert (await c.post("/mcp", json=INIT, headers=hdrs(d))).status_code == 429
        assert (await c.post("/mcp", json=ping, headers=hdrs(d, sid))).status_code == 200


async def test_the_total_cap_evicts_an_idle_mcp_session_of_anyone(daemon_factory: Callable[..., Daemon]) -> None:
    """At ``max_sessions`` (503), the longest idle ``/mcp`` session of any principal makes room,
    so abandoned sessions of one principal do not shut every other one out for an hour."""
    d = daemon_factory(max_sessions=2, mcp_session_evict_seconds=1)
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with client(d) as c:
        abandoned = await open_session(c, d)
        kept = await open_session(c, d)
        assert (await c.post("/mcp", json=INIT, headers=hdrs(d, token=d.other_token))).status_code == 503
        await asyncio.sleep(1.5)
        assert (await c.post("/mcp", json=ping, headers=hdrs(d, kept))).status_code == 200
        await open_session(c, d, token=d.other_token)
        assert (await c.post("/mcp", json=ping, headers=hdrs(d, abandoned))).status_code == 404
        assert (await c.post("/mcp", json=ping, headers=hdrs(d, kept))).status_code == 200


async def test_rotated_token_ends_its_mcp_session(daemon_factory: Callable[..., Daemon]) -> None:
    """The once-a-second token re-check covers /mcp sessions too: after ``mcpd users rotate``, the
    session opened with the old token is gone even for the principal's new token."""
    d = daemon_factory()
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with client(d) as c:
        sid = await open_session(c, d, token=d.other_token)
        out = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "mcpd.admin.cli", "users", "rotate", "bob", "--file", str(d.state_dir / "users.yaml")],
            capture_output=True, text=True, timeout=60, check=True)
        new = out.stdout.strip()
        deadline = time.monotonic() + 10
        while (r := await c.post("/mcp", json=ping, headers=hdrs(d, sid, token=new))).status_code == 200:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        assert r.status_code == 404
        r = await c.post("/mcp", json=ping, headers=hdrs(d, sid, token=d.other_token))
        assert r.status_code == 401


async def test_per_principal_session_cap_counts_both_transports(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory(max_sessions_per_principal=2)
    async with client(d) as c, SseSession(d):  # alice: one /sse session ...
        sid = await open_session(c, d)  # ... and one /mcp session: her cap
        r = await c.post("/mcp", json=INIT, headers=hdrs(d))
        assert r.status_code == 429 and "mcp-session-id" not in r.headers
        async with c.stream("GET", "/sse", headers=d.auth()) as s:
            assert s.status_code == 429
        # Another principal is not held back by alice's sessions.
        await open_session(c, d, token=d.other_token)
        async with SseSession(d, token=d.other_token):
            pass
        r = await c.delete("/mcp", headers=hdrs(d, sid))
        assert r.status_code == 200
        await open_session(c, d)  # a slot of alice's is free again


async def test_on_a_daemon_a_principal_at_its_cap_does_not_evict_anothers_idle_session(
        daemon_factory: Callable[..., Daemon]) -> None:
    """The same rule on a daemon (severity low-medium): ``max_sessions`` 2, one per principal,
    eviction after 1 s. Bob's session idles; alice, holding her one, asks for another at the full
    total: she is refused, and bob's session must still answer (before the fix it was closed to
    make room and his next request got 404)."""
    d = daemon_factory(max_sessions=2, max_sessions_per_principal=1, mcp_session_evict_seconds=1)
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with client(d) as c:
        bobs = await open_session(c, d, token=d.other_token)
        await asyncio.sleep(1.5)
        await open_session(c, d)
        r = await c.post("/mcp", json=INIT, headers=hdrs(d))
        assert r.status_code in (429, 503)
        r = await c.post("/mcp", json=ping, headers=hdrs(d, bobs, token=d.other_token))
        assert r.status_code == 200, "bob's idle session was evicted for a session that was refused"


async def test_a_session_whose_request_just_ended_is_not_evicted_as_idle(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """Rule (the eviction: a ``/mcp`` session with no request for ``mcp_session_evict_seconds``
    makes room at a full cap). Severity: low (a client that just got its answer loses its
    session; its next request is 404). Idleness was counted from the request's start, so a request
    that ran longer than the threshold (here a read cut by a 2 s worker deadline; a ``files/find``
    may run 60 s, the default threshold) left its session evictable the moment it was answered."""
    d = daemon_factory(max_sessions=1, mcp_session_evict_seconds=1, workers={"timeout_seconds": 2})
    path = slow_file(tmp_path)
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    slow = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "files/read", "arguments": {"path": str(path), "start_line": 3}}}
    async with client(d) as c:
        sid = await open_session(c, d)
        r = await c.post("/mcp", json=slow, headers=hdrs(d, sid))  # about 2 s, then TIMEOUT
        assert r.status_code == 200 and "TIMEOUT" in r.text, r.text
        await c.post("/mcp", json=INIT, headers=hdrs(d, token=d.other_token))  # bob, at the full total
        r = await c.post("/mcp", json=ping, headers=hdrs(d, sid))
        assert r.status_code == 200, "a session answered a moment ago was evicted as idle"


async def test_cancelled_request_does_not_say_its_session_ended(daemon_factory: Any, tmp_path: Path) -> None:
    """A request cancelled by ``notifications/cancelled`` (docs/REFERENCE.md §2.3: no reply is sent for it) on a
    live session must not have its POST answered ``404``: that is the answer for an unknown or
    ended session (docs/REFERENCE.md §1.3, §1.6), and SDK clients take it as "session terminated"."""
    d = daemon_factory(workers={"timeout_seconds": 30})
    path = slow_file(tmp_path)
    slow = {"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
            "params": {"name": "files/read", "arguments": {"path": str(path), "start_line": 3}}}
    async with client(d) as c, client(d) as c2:
        sid = await open_session(c, d)
        pending = await running(d, c2.post("/mcp", json=slow, headers=hdrs(d, sid)))
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/cancelled",
                                       "params": {"requestId": "slow"}}, headers=hdrs(d, sid))
        assert r.status_code == 202
        answer = await asyncio.wait_for(pending, 20)
        assert answer.status_code != 404, answer.text
        assert answer.status_code == 202 and answer.content == b""
        assert answer.headers["mcp-session-id"] == sid
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "ping"}, headers=hdrs(d, sid))
        assert r.status_code == 200 and r.json()["result"] == {}
        # A DELETE while a request runs still answers that request's POST 404 (the session ended).
        pending = await running(d, c2.post("/mcp", json={**slow, "id": "slow2"}, headers=hdrs(d, sid)))
        assert (await c.delete("/mcp", headers=hdrs(d, sid))).status_code == 200
        answer = await asyncio.wait_for(pending, 20)
        assert answer.status_code == 404, answer.text[:300]


async def running(d: Daemon, call: Coroutine[Any, Any, httpx.Response]) -> asyncio.Future[httpx.Response]:
    """Start ``call`` (a POST of a slow file read) and return once a new worker runs it."""
    before = worker_pids(d.pid)
    pending = asyncio.ensure_future(call)
    for _ in range(400):
        if worker_pids(d.pid) - before:
            return pending
        await asyncio.sleep(0.05)
    pytest.fail("the slow request never reached a worker")


async def test_repeated_session_or_version_header_is_refused(daemon: Daemon) -> None:
    """``Mcp-Session-Id`` and ``MCP-Protocol-Version`` carry one value (docs/REFERENCE.md §1.6): sent twice, a
    proxy that reads the last copy and mcpd, which read the first, would disagree on the session
    or version of one request. A repeat is refused with ``400``, whichever copy is valid."""
    ping = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        other = await open_session(c, daemon)
        base = hdrs(daemon)
        for repeated in ([("Mcp-Session-Id", sid), ("Mcp-Session-Id", other)],
                         [("Mcp-Session-Id", sid), ("MCP-Protocol-Version", "2025-06-18"),
                          ("MCP-Protocol-Version", "1999-01-01")]):
            for method in ("POST", "GET", "DELETE"):
                r = await c.request(method, "/mcp", content=ping if method == "POST" else b"",
                                    headers=raw_headers(base, *repeated))
                assert r.status_code == 400, (method, repeated, r.status_code, r.text)
                assert r.json()["error"]["code"] == -32600
        # both sessions are untouched by the refused DELETEs
        for s in (sid, other):
            r = await c.post("/mcp", content=ping, headers=hdrs(daemon, s))
            assert r.status_code == 200
