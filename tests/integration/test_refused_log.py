"""The front logs every refused request in one line, with the reason and the peer, never the
token (mcpd/front/refused.py). Read from the real daemon's log."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import Daemon, SseSession
from tests.support.refused_log import refused_lines
from tests.support.streamable import INIT, client, hdrs, open_session

pytestmark = pytest.mark.anyio


async def test_each_refusal_is_one_line_with_reason_and_peer_never_the_token(
        daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory(max_body_bytes=1024, allowed_origins=["https://ok.example"], allowed_hosts="auto",
                       max_sessions_per_principal=1)
    forged = "mcpd_0123456789ab_" + "S" * 43  # token-shaped, unknown
    _, port = d.host_port
    async with client(d) as c:
        assert (await c.get("/sse")).status_code == 401
        assert (await c.post("/mcp", json=INIT, headers=hdrs(d, token=forged))).status_code == 401
        assert (await c.post("/mcp", json=INIT, headers=hdrs(d, Origin="https://evil.example"))).status_code == 403
        assert (await c.get("/.well-known/oauth-protected-resource", headers=d.auth())).status_code == 404
        assert (await c.post("/mcp", json=INIT, headers=hdrs(d, Host=f"attacker.example:{port}"))).status_code == 421
        sid = await open_session(c, d)
        r = await c.post("/mcp", content=b"{}", headers={**hdrs(d, sid), "Content-Type": "text/plain"})
        assert r.status_code == 415
        assert (await c.post("/mcp", content=b"{" + b" " * 2000 + b"}", headers=hdrs(d, sid))).status_code == 413
        assert (await c.post("/mcp", json=INIT, headers=hdrs(d))).status_code == 429  # alice's one session
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=hdrs(d, "0" * 32))
        assert r.status_code == 404
        assert (await c.post(f"/mcp/{forged}", json=INIT, headers=hdrs(d))).status_code == 404

    lines = refused_lines(d, 10)
    got = [(status, method, path) for status, method, path, _ in lines]
    assert got == [(401, "GET", "/sse"), (401, "POST", "/mcp"), (403, "POST", "/mcp"),
                   (404, "GET", "/.well-known/oauth-protected-resource"), (421, "POST", "/mcp"),
                   (415, "POST", "/mcp"), (413, "POST", "/mcp"), (429, "POST", "/mcp"), (404, "POST", "/mcp"),
                   (404, "POST", "/mcp/mcpd_0123456789ab_…")], lines
    reasons = [reason for *_, reason in lines]
    assert reasons[0] == "bearer token required (no bearer token)"
    assert reasons[1] == "invalid token (token id 0123456789ab)"
    assert reasons[2] == "origin not allowed"
    assert "content type" in reasons[5] and "too large" in reasons[6] and "too many sessions" in reasons[7]
    assert reasons[8] == "no such session"
    log = d.log()
    assert "S" * 43 not in log and d.token not in log and d.token.split("_", 2)[2] not in log


@pytest.mark.parametrize("base", ["", "/base"])
async def test_every_refusal_of_post_message_is_answered_and_logged_like_any_other(
        daemon_factory: Callable[..., Daemon], base: str) -> None:
    """``POST /message`` runs on a lean route of its own (mcpd/front/app.py ``PostRoute``): each
    check the stack makes must still refuse there, in the stack's order, with the same answer and
    one log line, at the root and under ``base_path``."""
    d = daemon_factory(max_body_bytes=1024, allowed_origins=["https://ok.example"], allowed_hosts="auto",
                       base_path=base)
    forged = "mcpd_0123456789ab_" + "S" * 43
    _, port = d.host_port
    async with SseSession(d) as s:
        assert s.endpoint.startswith(f"{base}/message?session_id=")
        url = f"{d.url}{s.endpoint}"
        ping = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
        good = {**d.auth(), "Content-Type": "application/json"}
        c = s.client
        cases: list[tuple[int, dict[str, str], bytes, str]] = [
            (401, {"Content-Type": "application/json"}, ping, url),
            (401, {**good, "Authorization": f"Bearer {forged}"}, ping, url),
            (403, {**good, "Origin": "https://evil.example", "Authorization": "Bearer nope"}, ping, url),  # before auth
            (421, {**good, "Host": f"attacker.example:{port}", "Authorization": "Bearer nope"}, ping, url),
            (400, good, ping, f"{d.url}{base}/message?session_id=xyz"),
            (404, good, ping, f"{d.url}{base}/message?session_id={'0' * 32}"),
            (415, {**good, "Content-Type": "text/plain"}, ping, url),
            (413, good, b"{" + b" " * 2000 + b"}", url),
            (400, good, b"{nope", url),
        ]
        for status, headers, body, target in cases:
            r = await c.post(target, content=body, headers=headers)
            assert r.status_code == status, (status, r.text)
        r = await c.post(url, content=b"{", headers={"Content-Type": "application/json"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = await c.post(url, content=ping, headers={**good, "Authorization": f"Bearer {forged}"})
        assert r.headers["www-authenticate"].startswith('Bearer error="invalid_token"')
        assert (await c.get(url, headers=good)).status_code == 405  # not the lean route: the stack's answer
        assert (await c.post(url, content=ping, headers={**good, "Origin": "https://ok.example"})).status_code == 202
        assert (await s.reply(1))["result"] == {}
    lines = refused_lines(d, len(cases) + 5)
    got = [(status, method, path) for status, method, path, _ in lines]
    path = f"{base}/message"
    assert got == [(status, "POST", path) for status, *_ in cases] + [(401, "POST", path)] * 2 + \
        [(405, "GET", path)], lines
    reasons = [reason for *_, reason in lines]
    assert reasons[:8] == ["bearer token required (no bearer token)", "invalid token (token id 0123456789ab)",
                           "origin not allowed", "host not allowed", "missing or malformed session_id",
                           "no such session", "content type must be application/json", "body too large"]
    assert reasons[8] == "parse error"
    log = d.log()
    assert "S" * 43 not in log and d.token not in log and d.token.split("_", 2)[2] not in log


async def test_the_refusal_line_names_the_token_the_bearer_check_read(daemon_factory: Callable[..., Daemon]) -> None:
    """With two ``Authorization`` headers the check reads the first, and so does the line; a
    ``Bearer`` credential the check cannot parse is called malformed, not absent."""
    d = daemon_factory()
    first, second = "mcpd_00000000000a_" + "A" * 43, "mcpd_00000000000b_" + "B" * 43
    async with client(d) as c:
        r = await c.get("/sse", headers=[("Authorization", f"Bearer {first}"), ("Authorization", f"Bearer {second}")])
        assert r.status_code == 401
        r = await c.get("/sse", headers={"Authorization": f"Bearer\t{first}"})
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith('Bearer error="invalid_token"')
    reasons = [reason for *_, reason in refused_lines(d, 2)]
    assert reasons == ["invalid token (token id 00000000000a)", "invalid token (malformed bearer token)"], reasons
    assert "A" * 43 not in d.log() and "B" * 43 not in d.log()


@pytest.mark.parametrize("base", ["", "/base"])
async def test_every_refusal_of_post_mcp_is_answered_and_logged_like_any_other(
        daemon_factory: Callable[..., Daemon], base: str) -> None:
    """``POST /mcp`` (Streamable HTTP) runs on the same lean route as ``POST /message``
    (``PostRoute``): each check the stack makes must still refuse there, in the stack's order, with
    the same answer and one log line, at the root and under ``base_path``; and a good request
    still opens and uses its session."""
    d = daemon_factory(max_body_bytes=1024, allowed_origins=["https://ok.example"], allowed_hosts="auto",
                       base_path=base)
    forged = "mcpd_0123456789ab_" + "S" * 43
    _, port = d.host_port
    url = f"{d.url}{base}/mcp"
    init = (b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
            b'"capabilities":{},"clientInfo":{"name":"t","version":"1"}}}')
    ping = b'{"jsonrpc":"2.0","id":2,"method":"ping"}'
    good = {**d.auth(), "Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    async with client(d) as c:
        cases: list[tuple[int, dict[str, str], bytes]] = [
            (401, {"Content-Type": "application/json"}, init),
            (401, {**good, "Authorization": f"Bearer {forged}"}, init),
            (403, {**good, "Origin": "https://evil.example", "Authorization": "Bearer nope"}, init),  # before auth
            (421, {**good, "Host": f"attacker.example:{port}", "Authorization": "Bearer nope"}, init),
            (406, {**good, "Accept": "text/plain"}, init),
            (404, {**good, "Mcp-Session-Id": "0" * 32, "Mcp-Protocol-Version": "2025-06-18"}, ping),
            (415, {**good, "Content-Type": "text/plain"}, init),
            (413, good, b"{" + b" " * 2000 + b"}"),
            (400, good, b"{nope"),
        ]
        for status, headers, body in cases:
            r = await c.post(url, content=body, headers=headers)
            assert r.status_code == status, (status, r.text)
        r = await c.post(url, content=init, headers={"Content-Type": "application/json"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = await c.post(url, content=init, headers={**good, "Origin": "https://ok.example"})
        assert r.status_code == 200, r.text
        sid = r.headers["mcp-session-id"]
        r = await c.post(url, content=ping, headers={**good, "Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"})
        assert r.status_code == 200 and r.json() == {"jsonrpc": "2.0", "id": 2, "result": {}}
        assert (await c.put(url, content=ping, headers=good)).status_code == 405  # not the lean route: the stack's
    lines = refused_lines(d, len(cases) + 2)
    got = [(status, method, path) for status, method, path, _ in lines]
    path = f"{base}/mcp"
    assert got == [(status, "POST", path) for status, *_ in cases] + [(401, "POST", path), (405, "PUT", path)], lines
    reasons = [reason for *_, reason in lines]
    assert reasons[:4] == ["bearer token required (no bearer token)", "invalid token (token id 0123456789ab)",
                           "origin not allowed", "host not allowed"], reasons
    log = d.log()
    assert "S" * 43 not in log and d.token not in log and d.token.split("_", 2)[2] not in log
