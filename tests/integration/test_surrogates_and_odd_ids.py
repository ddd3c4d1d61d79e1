"""Inputs that broke a stream (found by fuzzing), each through the real daemon:
a lone surrogate in an id, in a path and in a file name, and a non-finite id, on ``/sse`` and on
``/mcp``. Each gets a valid JSON answer and the stream goes on serving."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx

from tests.conftest import Daemon, SseSession
from tests.support.fuzzgen import strict

HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}




def test_a_lone_surrogate_id_is_invalid_and_the_sse_stream_survives(daemon: Daemon) -> None:
    async def go() -> None:
        async with SseSession(daemon) as s:
            await s.initialize()
            for raw in (b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}',
                        b'[{"jsonrpc":"2.0","id":"a\\udfff","method":"ping"},{"jsonrpc":"2.0","id":"ok","method":"ping"}]',
                        b'{"jsonrpc":"2.0","id":1e400,"method":"ping"}'):
                assert (await s.post(None, raw=raw)).status_code == 202
                reply = strict((await s.next_event()).data)
                members = reply if isinstance(reply, list) else [reply]
                assert members[0]["id"] is None and members[0]["error"]["code"] == -32600, reply
                if len(members) > 1:
                    assert members[1] == {"jsonrpc": "2.0", "id": "ok", "result": {}}
            assert await s.request("ping", req_id="after") == {"jsonrpc": "2.0", "id": "after", "result": {}}

    asyncio.run(go())


def test_a_lone_surrogate_id_on_mcp_is_answered_as_json_not_500(daemon: Daemon) -> None:
    with httpx.Client(verify=daemon.ssl_context(), timeout=20, headers={**daemon.auth(), **HEADERS}) as c:
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        r = c.post(daemon.url + "/mcp", json=init)
        sid = r.headers["mcp-session-id"]
        r = c.post(daemon.url + "/mcp", content=b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}',
                   headers={"Mcp-Session-Id": sid})
        assert r.status_code == 400 and strict(r.text)["id"] is None, r.text
        stateless = {"jsonrpc": "2.0", "id": "\ud800", "method": "nope", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}}
        body = json.dumps(stateless).encode()  # ensure_ascii: the surrogate travels as \\ud800
        r = c.post(daemon.url + "/mcp", content=body, headers={"MCP-Protocol-Version": "2026-07-28",
                                                               "Mcp-Method": "nope"})
        assert r.status_code < 500 and strict(r.text)["id"] is None, (r.status_code, r.text)


def test_surrogates_in_paths_and_file_names_give_tool_answers(daemon: Daemon, tmp_path: Path) -> None:
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "ok.txt").write_text("ok")
    with open(os.path.join(os.fsencode(odd), b"caf\xe9.txt"), "wb") as f:  # a name that is not UTF-8
        f.write(b"latin name\n")
    os.chmod(tmp_path, 0o755)
    os.chmod(odd, 0o755)

    async def go() -> None:
        async with SseSession(daemon) as s:
            await s.initialize()
            raw = json.dumps({"jsonrpc": "2.0", "id": "p", "method": "tools/call", "params": {
                "name": "files/read", "arguments": {"path": f"{odd}/\ud800.txt"}}}).encode()
            assert (await s.post(None, raw=raw)).status_code == 202
            reply = await s.reply("p")
            assert reply["result"]["structuredContent"]["error"]["code"] == "INVALID_ARGUMENT", reply
            listing = await s.request("tools/call", {"name": "files/list", "arguments": {"path": str(odd)}})
            assert "error" not in listing, listing
            assert "caf\\xe9.txt" in listing["result"]["content"][0]["text"], listing  # shown as ls -b does
            assert await s.request("ping", req_id="after") == {"jsonrpc": "2.0", "id": "after", "result": {}}

    asyncio.run(go())
