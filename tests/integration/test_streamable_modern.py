"""Streamable HTTP at ``/mcp``, stateless era (2026-07-28; docs/REFERENCE.md §1.6): ``server/discover``, the
per-request ``_meta``, the ``Mcp-Method``/``Mcp-Name`` headers held against the body, ``resultType``
and caching hints, the revision's error codes, and no session minted."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Daemon, SseSession
from tests.support.streamable import (
    ACCEPT_BOTH,
    META,
    V,
    client,
    hdrs,
    headers,
    open_session,
    post,
    raw_headers,
    request,
    sse_messages,
)
from tests.support.streamable import (
    headers as modern_headers,
)
from tests.support.streamable import (
    request as modern_request,
)
from tests.support.workers import slow_file, worker_pids

pytestmark = pytest.mark.anyio


def check_modern_result(r: httpx.Response, ttl: int | None = None, scope: str | None = None) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    assert "mcp-session-id" not in r.headers
    result: dict[str, Any] = r.json()["result"]
    assert result["resultType"] == "complete"
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcpd"
    if ttl is not None:
        assert (result["ttlMs"], result["cacheScope"]) == (ttl, scope)
    return result


async def test_discover_lists_and_reads_statelessly(daemon: Daemon, tmp_path: Path) -> None:
    f = tmp_path / "é.txt"
    f.write_text("hello\n")
    async with client(daemon) as c:
        disc = check_modern_result(await post(c, daemon, request("server/discover")), 300_000, "public")
        assert disc["supportedVersions"][0] == V and "2025-11-25" in disc["supportedVersions"]
        assert set(disc["capabilities"]) == {"tools", "resources", "extensions"} and disc["instructions"]
        assert disc["capabilities"]["extensions"] == {"io.modelcontextprotocol/tasks": {}}
        tools = check_modern_result(await post(c, daemon, request("tools/list")), 300_000, "public")
        assert "files/read" in [t["name"] for t in tools["tools"]]
        check_modern_result(await post(c, daemon, request("resources/templates/list")), 300_000, "public")
        check_modern_result(await post(c, daemon, request("resources/list")), 300_000, "public")
        call = request("tools/call", {"name": "files/read", "arguments": {"path": str(f)}})
        res = check_modern_result(await post(c, daemon, call))
        assert res["content"][0]["text"] == "hello\n" and "ttlMs" not in res
        # A URI that is not plain ASCII travels base64-encoded in Mcp-Name.
        uri = f"file://{f}"
        encoded = "=?base64?" + base64.b64encode(uri.encode()).decode() + "?="
        read = request("resources/read", {"uri": uri})
        res = check_modern_result(await post(c, daemon, read, Mcp_Name=encoded), 0, "private")
        assert res["contents"][0]["text"] == "hello\n"
        assert res["contents"][0]["_meta"]["size"] == 6  # the file's metadata stays on the content item


async def test_progress_streams_then_the_result(daemon: Daemon, tmp_path: Path) -> None:
    for d in range(3):
        (tmp_path / f"d{d}").mkdir()
        for i in range(4000):
            (tmp_path / f"d{d}" / f"f{i}").touch()
    call = request("tools/call", {"name": "files/find", "arguments": {"root": str(tmp_path), "name": "x"}},
                   meta={**META, "progressToken": "p"})
    async with client(daemon) as c:
        r = await post(c, daemon, call)
        assert r.headers["content-type"].startswith("text/event-stream")
        msgs = sse_messages(r.text)
        assert any(m.get("method") == "notifications/progress" for m in msgs)
        assert msgs[-1]["id"] == 1 and msgs[-1]["result"]["resultType"] == "complete"


@pytest.mark.parametrize(("override", "code"), [
    ({"Mcp_Name": "files/list"}, -32020),             # the header routes one tool, the body calls another
    ({"Mcp_Name": None}, -32020),
    ({"Mcp_Method": "tools/list"}, -32020),
    ({"Mcp_Method": None}, -32020),
    ({"MCP_Protocol_Version": None}, -32020),
    ({"MCP_Protocol_Version": "2025-11-25"}, -32020),
    ({"Mcp_Name": "=?base64?!!notbase64!!?="}, -32020),
    ({"Mcp_Name": "=?base64?" + base64.b64encode(b"files/list").decode() + "?="}, -32020),
])
async def test_header_mismatch_refused_400(daemon: Daemon, tmp_path: Path, override: dict[str, Any], code: int) -> None:
    call = request("tools/call", {"name": "files/read", "arguments": {"path": "/etc/hostname"}}, rid="x")
    async with client(daemon) as c:
        r = await post(c, daemon, call, **override)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == code and r.json()["id"] == "x"


async def test_meta_required_version_supported_methods_known(daemon: Daemon) -> None:
    async with client(daemon) as c:
        no_caps = request("tools/list", meta={"io.modelcontextprotocol/protocolVersion": V})
        r = await post(c, daemon, no_caps)
        assert r.status_code == 400 and r.json()["error"]["code"] == -32602
        future = request("tools/list", meta={**META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"})
        r = await post(c, daemon, future, MCP_Protocol_Version="2099-01-01")
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["code"] == -32022 and err["data"]["requested"] == "2099-01-01"
        assert V in err["data"]["supported"]
        for gone in ("ping", "initialize", "subscriptions/listen", "nope"):
            r = await post(c, daemon, request(gone))
            assert r.status_code == 404 and r.json()["error"]["code"] == -32601, gone
        r = await c.post("/mcp", json=[request("tools/list")], headers=headers(daemon, request("tools/list")))
        assert r.status_code == 400 and r.json()["error"]["code"] == -32600
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"_meta": META}}
        r = await c.post("/mcp", json=note, headers=headers(daemon, note))
        assert r.status_code == 202


async def test_a_refused_stateless_request_keeps_its_readable_id(daemon: Daemon) -> None:
    """A stateless request refused for its envelope (``method`` not a string) is answered ``400``
    with its id, as in the session era (before: ``id: null``); an id that is not valid, or a
    batch, still gets ``null``."""
    h = {**daemon.auth(), "Accept": ACCEPT_BOTH, "Content-Type": "application/json", "MCP-Protocol-Version": V}
    async with client(daemon) as c:
        for body, rid in (({"jsonrpc": "2.0", "id": 1300, "method": None}, 1300),
                          ({"id": "abc", "method": 5}, "abc"),
                          ({"jsonrpc": "2.0", "id": 0, "method": ["x"], "params": {"_meta": META}}, 0),
                          ({"jsonrpc": "2.0", "id": 2.5, "params": {"_meta": META}}, 2.5),
                          ({"jsonrpc": "2.0", "id": True, "method": None}, None),
                          ([{"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": META}}], None)):
            r = await c.post("/mcp", json=body, headers=h)
            assert r.status_code == 400, (body, r.status_code, r.text)
            assert r.json() == {"jsonrpc": "2.0", "id": rid, "error": r.json()["error"]}, (body, r.text)
            assert r.json()["error"]["code"] == -32600


async def test_resource_errors_use_the_revisions_codes(daemon: Daemon, tmp_path: Path) -> None:
    missing, folder = f"file://{tmp_path}/missing.txt", f"file://{tmp_path}"
    async with client(daemon) as c:
        r = await post(c, daemon, request("resources/read", {"uri": missing}))
        assert r.json()["error"]["code"] == -32602 and r.json()["error"]["data"]["code"] == "FILE_NOT_FOUND"
        r = await post(c, daemon, request("resources/read", {"uri": folder}))
        assert r.json()["error"]["code"] == -32602 and r.json()["error"]["data"]["code"] == "NOT_A_REGULAR_FILE"
    async with SseSession(daemon) as s:  # the session era keeps -32002 for a missing resource
        await s.initialize()
        assert (await s.request("resources/read", {"uri": missing}))["error"]["code"] == -32002
        assert (await s.request("resources/read", {"uri": folder}))["error"]["code"] == -32602


async def test_stateless_requests_mint_no_session(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory(max_sessions=1)
    async with client(d) as c, SseSession(d):  # the only session slot is taken
        for _ in range(5):
            check_modern_result(await post(c, d, request("tools/list")))
        # A stale session id from an older client is ignored, not honoured or echoed.
        r = await post(c, d, request("tools/list"), Mcp_Session_Id="0" * 32)
        check_modern_result(r)
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
            headers={**d.auth(), "Accept": ACCEPT_BOTH})
        assert r.status_code == 503


async def test_auth_and_origin_apply(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory(allowed_origins=["https://ok.example"])
    body = request("tools/list")
    async with client(d) as c:
        r = await post(c, d, body, Authorization=None)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = await post(c, d, body, Authorization="Bearer nope")
        assert r.status_code == 401 and 'error="invalid_token"' in r.headers["www-authenticate"]
        r = await post(c, d, body, Origin="https://evil.example")
        assert r.status_code == 403


# -- cancellation: closing is cancelling in the stateless era; DELETE ends a session's work ----------


async def _wait_worker(d: Daemon, before: set[int]) -> set[int]:
    for _ in range(200):
        busy = worker_pids(d.pid) - before
        if busy:
            return busy
        await asyncio.sleep(0.05)
    raise AssertionError("no worker started for the slow read")


async def _wait_gone(d: Daemon, busy: set[int]) -> None:
    for _ in range(400):  # the deadline is 120 s: only the cancellation can stop it this soon
        if not busy & worker_pids(d.pid):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the worker of the abandoned request still runs")


@pytest.mark.parametrize("stream", [False, True])
async def test_closing_the_answer_cancels_the_request(daemon_factory: Callable[..., Daemon], tmp_path: Path,
                                                      stream: bool) -> None:
    d = daemon_factory(workers={"timeout_seconds": 120})
    path = slow_file(tmp_path)
    meta = {**META, "progressToken": "p"} if stream else META
    call = request("tools/call", {"name": "files/read", "arguments": {"path": str(path), "start_line": 3}}, meta=meta)
    before = worker_pids(d.pid)
    async with client(d) as c:
        task = asyncio.ensure_future(post(c, d, call))
        busy = await _wait_worker(d, before)
        task.cancel()  # the client gives up: httpx closes the connection
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await _wait_gone(d, busy)


async def test_delete_cancels_a_sessions_requests(daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = daemon_factory(workers={"timeout_seconds": 120})
    path = slow_file(tmp_path)
    before = worker_pids(d.pid)
    async with client(d) as c:
        sid = await open_session(c, d)
        call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                "params": {"name": "files/read", "arguments": {"path": str(path), "start_line": 3}}}
        task = asyncio.ensure_future(c.post("/mcp", json=call, headers=hdrs(d, sid)))
        busy = await _wait_worker(d, before)
        r = await c.delete("/mcp", headers=hdrs(d, sid))
        assert r.status_code == 200
        await _wait_gone(d, busy)
        r = await task  # the POST ends too: its session is gone
        assert r.status_code == 404


async def test_large_answers_arrive_whole_as_json_and_as_one_event(daemon: Daemon, tmp_path: Path) -> None:
    """An answer larger than the front's 256 KiB write pieces (a 3 MiB read) goes out a piece at a
    time: a client that reads it gets all of it, as JSON, and as the one event of a stream for a
    client that accepts only event streams, in both eras."""
    big = tmp_path / "three-mib.txt"
    text = "y" * 1023 + "\n"
    big.write_text(text * 3 * 1024)
    read = {"name": "files/read", "arguments": {"path": str(big), "limit": 4 * 1024 * 1024}}
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": read}
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        for accept in ("application/json", "text/event-stream"):
            r = await c.post("/mcp", json=call, headers=hdrs(daemon, sid, accept=accept))
            assert r.status_code == 200 and r.headers["content-type"].startswith(accept)
            reply = r.json() if accept == "application/json" else sse_messages(r.text)[-1]
            assert reply["id"] == 7 and reply["result"]["content"][0]["text"] == text * 3 * 1024
            modern = request("tools/call", read, 8)
            r = await c.post("/mcp", json=modern, headers=headers(daemon, modern, Accept=accept))
            assert r.status_code == 200 and r.headers["content-type"].startswith(accept)
            reply = r.json() if accept == "application/json" else sse_messages(r.text)[-1]
            assert reply["id"] == 8 and reply["result"]["content"][0]["text"] == text * 3 * 1024


async def test_repeated_mirror_header_is_refused(daemon: Daemon, tmp_path: Path) -> None:
    """The 2026-07-28 ``Mcp-Method``/``Mcp-Name``/``MCP-Protocol-Version`` headers mirror the body
    so that gateways can route and authorize without reading it (docs/REFERENCE.md §1.6). Sent twice, mcpd
    checked only the first copy: ``Mcp-Name: <the body's uri>`` then ``Mcp-Name: <another>``
    passed, so a gateway reading the last copy authorized one file while mcpd served another.
    Any repeat is ``400``/``-32020``."""
    p = tmp_path / "served.txt"
    p.write_text("served\n")
    body = modern_request("resources/read", {"uri": f"file://{p}"})
    base = modern_headers(daemon, body)
    async with client(daemon) as c:
        for name, other in (("Mcp-Name", "file:///etc/hostname"), ("Mcp-Method", "tools/list"),
                            ("MCP-Protocol-Version", "2025-06-18")):
            r = await c.post("/mcp", content=json.dumps(body).encode(), headers=raw_headers(base, (name, other)))
            assert r.status_code == 400, (name, r.text)
            assert r.json() == {"jsonrpc": "2.0", "id": 1, "error": r.json()["error"]}
            assert r.json()["error"]["code"] == -32020
            assert "served" not in r.text
        r = await c.post("/mcp", content=json.dumps(body).encode(), headers=base)
        assert r.status_code == 200 and r.json()["result"]["contents"][0]["text"] == "served\n"


async def test_stateless_error_without_id_is_400_like_session_era(daemon: Daemon) -> None:
    """An error without a usable id (``id: null``, ``1e400``) is answered ``400`` with its JSON-RPC
    body in the session era (docs/REFERENCE.md §2.3, §1.6); a stateless request with the same id got ``200``."""
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": None, "method": "ping"}, headers=hdrs(daemon, sid))
        assert r.status_code == 400 and r.json()["error"]["code"] == -32600
        body = modern_request("tools/list", rid=None)
        r = await c.post("/mcp", json=body, headers=modern_headers(daemon, body))
        assert r.json() == {"jsonrpc": "2.0", "id": None, "error": r.json()["error"]}
        assert r.json()["error"]["code"] == -32600
        assert r.status_code == 400
        raw = json.dumps(modern_request("tools/list", rid=7)).replace("7", "1e400", 1).encode()
        r = await c.post("/mcp", content=raw, headers=modern_headers(daemon, modern_request("tools/list")))
        assert r.status_code == 400 and r.json()["id"] is None and r.json()["error"]["code"] == -32600
