"""docs/REFERENCE.md §2.3 against the real daemon: an object naming a key twice, at any depth, is
refused on both transports (never "the last one wins"); batches only in the eras that have them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Daemon, SseSession
from tests.support.streamable import client, hdrs, open_session

pytestmark = pytest.mark.anyio

# a tools/call whose duplicate sits deep in its arguments: the later "path" would be the one read
DEEP = (b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"files/read",'
        b'"arguments":{"path":"/etc/hostname","path":"/etc/shadow"}}}')
DUPLICATES = [
    b'{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}',
    b'{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/list"}',
    b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"_meta":{"progressToken":1,"progressToken":2}}}',
    DEEP,
    # the same key, spelt with an escape: the same name once parsed
    b'{"jsonrpc":"2.0","id":1,"method":"ping","\\u006dethod":"ping"}',
    # a duplicate hidden among colons inside strings (the check then parses the slow way)
    b'{"jsonrpc":"2.0","id":"a:b:c","method":"resources/read","params":{"uri":"file:///x:y","uri":"file:///z"}}',
]
# no duplicate, though strings hold colons and the same key sits in sibling objects
DISTINCT = [
    b'{"jsonrpc":"2.0","id":"a:b","method":"ping","params":{"_meta":{"x":{"k":1},"y":{"k":2}}}}',
    b'{"jsonrpc":"2.0","id":3,"method":"ping","params":{"_meta":{"k:":"::","k":":"}}}',
]


def refused_duplicate(r: Any, key: str | None = None) -> None:
    assert r.status_code == 400, (r.status_code, r.text)
    body = r.json()
    assert body["id"] is None and body["error"]["code"] == -32600, body
    assert "twice" in body["error"]["message"], body
    if key is not None:
        assert key in body["error"]["message"], body


async def test_a_duplicate_key_at_any_depth_is_refused_on_mcp(daemon: Daemon) -> None:
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        for raw in DUPLICATES:
            refused_duplicate(await c.post("/mcp", content=raw, headers=hdrs(daemon, sid)))
        refused_duplicate(await c.post("/mcp", content=DEEP, headers=hdrs(daemon, sid)), "path")
        for raw in DISTINCT:
            r = await c.post("/mcp", content=raw, headers=hdrs(daemon, sid))
            assert r.status_code == 200 and "result" in r.json(), r.text
        # the stateless era parses the same way: refused before its headers are looked at
        r = await c.post("/mcp", content=DUPLICATES[0], headers=hdrs(
            daemon, **{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "ping"}))
        refused_duplicate(r)


async def test_a_duplicate_key_at_any_depth_is_refused_on_sse(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        await s.initialize()
        for raw in DUPLICATES:
            refused_duplicate(await s.post(None, raw=raw))
        for raw in DISTINCT:
            assert (await s.post(None, raw=raw)).status_code == 202
        assert await s.request("ping", req_id="after") == {"jsonrpc": "2.0", "id": "after", "result": {}}


async def test_a_forged_key_is_shown_escaped_and_short(daemon: Daemon) -> None:
    """The key named in the refusal is the client's text: control characters escaped, cut short."""
    key = "\\u001b[31m" + "k" * 500
    raw = ('{"jsonrpc":"2.0","id":1,"method":"ping","%s":1,"%s":2}' % (key, key)).encode()
    async with client(daemon) as c:
        sid = await open_session(c, daemon)
        r = await c.post("/mcp", content=raw, headers=hdrs(daemon, sid))
        refused_duplicate(r)
        message = r.json()["error"]["message"]
        assert "\x1b" not in message and len(message) < 200, message


BATCH = [{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]


def refused_batch(answer: Any, version: str) -> None:
    assert isinstance(answer, dict) and answer["id"] is None and answer["error"]["code"] == -32600, answer
    message = answer["error"]["message"]
    assert f"batches are not part of MCP {version}" in message and "none of the batch's members was run" in message


@pytest.mark.parametrize("version", ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"])
async def test_batches_only_in_sessions_that_negotiated_a_version_with_them_on_mcp(
        daemon: Daemon, version: str) -> None:
    async with client(daemon) as c:
        sid = await open_session(c, daemon, version=version)
        h = hdrs(daemon, sid, **{"MCP-Protocol-Version": version})
        r = await c.post("/mcp", json=BATCH, headers=h)
        if version < "2025-06-18":
            assert r.status_code == 200, r.text
            assert sorted(m["id"] for m in r.json()) == [1, 2] and all("result" in m for m in r.json()), r.text
        else:
            assert r.status_code == 400, r.text
            refused_batch(r.json(), version)
        r = await c.post("/mcp", json=BATCH[0], headers=h)  # one message at a time: served
        assert r.json() == {"jsonrpc": "2.0", "id": 1, "result": {}}


@pytest.mark.parametrize("version", ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"])
async def test_batches_only_in_sessions_that_negotiated_a_version_with_them_on_sse(
        daemon: Daemon, version: str) -> None:
    async with SseSession(daemon) as s:
        await s.initialize(version)
        assert (await s.post(BATCH)).status_code == 202
        answer = await s.next_message()
        if version < "2025-06-18":
            assert isinstance(answer, list) and sorted(m["id"] for m in answer) == [1, 2], answer
        else:
            refused_batch(answer, version)
            # none ran: the next message on the stream is the reply to what is sent next
        assert await s.request("ping", req_id="after") == {"jsonrpc": "2.0", "id": "after", "result": {}}
