"""docs/REFERENCE.md §1.1–§1.3 against the real daemon over TLS: the SSE stream and every row of the POST table."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import socket
import ssl
import warnings
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from mcpd.common import config
from mcpd.front.server import tls_context
from tests.conftest import Daemon, SseSession, open_raw, read_status, start_daemon

pytestmark = pytest.mark.anyio

ENDPOINT_RE = re.compile(r"^/message\?session_id=[0-9a-f]{32}$")
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}


def client(d: Daemon) -> httpx.AsyncClient:
    return httpx.AsyncClient(verify=d.ssl_context(), timeout=20)


# -- §1.1 TLS -----------------------------------------------------------------------------------


async def test_tls_always_plain_http_gets_no_http_answer(daemon: Daemon) -> None:
    host, port = daemon.host_port
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(b"GET /sse HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            data = s.recv(100)
        except ConnectionResetError:
            data = b""
    assert not data.startswith(b"HTTP/")


def _handshake(d: Daemon, version: ssl.TLSVersion) -> str:
    ctx = d.ssl_context()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        ctx.maximum_version = version
    ctx.set_ciphers("ALL:@SECLEVEL=0")  # let this client offer old versions at all
    host, port = d.host_port
    with socket.create_connection((host, port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=host) as s:
            return str(s.version())


async def test_tls_1_2_minimum(daemon: Daemon) -> None:
    assert _handshake(daemon, ssl.TLSVersion.TLSv1_2) == "TLSv1.2"
    with pytest.raises(ssl.SSLError):
        _handshake(daemon, ssl.TLSVersion.TLSv1_1)
    with pytest.raises(ssl.SSLError):
        _handshake(daemon, ssl.TLSVersion.TLSv1)


def _tls12_with(d: Daemon, ciphers: str) -> tuple[str, str]:
    ctx = d.ssl_context()
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(ciphers + ":@SECLEVEL=0")
    host, port = d.host_port
    with socket.create_connection((host, port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=host) as s:
            cipher = s.cipher()
            return str(s.version()), str(cipher[0] if cipher else "")


@pytest.mark.parametrize("offered", ["AES128-SHA", "AES256-SHA256", "ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA384",
                                     "AES128-GCM-SHA256", "DHE-RSA-AES128-GCM-SHA256"])
async def test_tls_1_2_refuses_suites_without_ecdhe_or_aead(daemon: Daemon, offered: str) -> None:
    with pytest.raises(ssl.SSLError):
        _tls12_with(daemon, offered)


@pytest.mark.parametrize("offered", ["ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",  # (an EC key)
                                     "ECDHE-ECDSA-CHACHA20-POLY1305"])
async def test_tls_1_2_serves_ecdhe_aead_suites_and_prefers_1_3(daemon: Daemon, offered: str) -> None:
    assert _tls12_with(daemon, offered) == ("TLSv1.2", offered)
    host, port = daemon.host_port
    with socket.create_connection((host, port), timeout=10) as raw:
        with daemon.ssl_context().wrap_socket(raw, server_hostname=host) as s:
            assert s.version() == "TLSv1.3"


async def test_tls_1_2_minimum_server_context(daemon: Daemon) -> None:
    ctx = tls_context(config.load(daemon.config_path))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2


async def test_tls_certificate_from_config_is_verified_by_private_ca(daemon: Daemon) -> None:
    async with httpx.AsyncClient(timeout=10) as c:  # system trust store: the private CA is unknown
        with pytest.raises(httpx.ConnectError):
            await c.get(f"{daemon.url}/sse", headers=daemon.auth())


# -- §1.2 the stream ----------------------------------------------------------------------------


async def test_sse_headers_and_endpoint_event_first(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        r = s.response
        assert r is not None and r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache, no-transform"
        assert r.headers["x-accel-buffering"] == "no"
        assert ENDPOINT_RE.match(s.endpoint), s.endpoint


async def test_endpoint_honours_base_path(daemon_factory: Any) -> None:
    d = daemon_factory(base_path="/mcp")
    async with SseSession(d) as s:
        assert re.match(r"^/mcp/message\?session_id=[0-9a-f]{32}$", s.endpoint)
        assert (await s.request("ping")) == {"jsonrpc": "2.0", "id": 1, "result": {}}


async def test_later_events_are_message_with_one_data_line(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        rid = "line1\nline2\r\u2028\u2029\x85end"
        r = await s.post({"jsonrpc": "2.0", "id": rid, "method": "ping"})
        assert r.status_code == 202
        ev = await s.next_event()
        assert ev.event == "message"
        assert "\n" not in ev.data  # several data: lines would have been joined with \n
        assert json.loads(ev.data) == {"jsonrpc": "2.0", "id": rid, "result": {}}


async def test_keepalive_ping_comment(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:  # the session daemon uses keepalive_seconds: 1
        ev = await s.next_event(timeout=15, skip_comments=False)
        assert (ev.event, ev.data) == ("comment", "ping")


# -- §1.3 the POST table ------------------------------------------------------------------------


async def test_post_accepted_202_reply_on_stream(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        r = await s.post(PING)
        assert r.status_code == 202
        assert await s.next_message() == {"jsonrpc": "2.0", "id": 1, "result": {}}


@pytest.mark.parametrize("path", ["/sse", "/message?session_id=" + "0" * 32, "/nowhere"])
@pytest.mark.parametrize("auth", [None, "Bearer nope", "Bearer mcpd_000000000000_" + "A" * 43, "Basic YTpi"])
async def test_no_or_bad_token_401_on_any_route(daemon: Daemon, path: str, auth: str | None) -> None:
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = auth
    async with client(daemon) as c:
        method = "GET" if path != "/message?session_id=" + "0" * 32 else "POST"
        r = await c.request(method, f"{daemon.url}{path}", headers=headers, content=b"{}")
    assert r.status_code == 401
    if auth is None or auth.startswith("Basic"):  # no bearer token: a challenge without an error (RFC 6750 §3.1)
        assert r.headers["www-authenticate"] == "Bearer"
    else:  # a refused one: says so, so clients report a bad token instead of starting OAuth
        assert r.headers["www-authenticate"].startswith('Bearer error="invalid_token", error_description="')


@pytest.mark.parametrize("path", ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp",
                                  "/.well-known/oauth-authorization-server", "/.well-known/openid-configuration",
                                  "/base/.well-known/oauth-protected-resource"])
@pytest.mark.parametrize("auth", [None, "Bearer nope"])
async def test_no_oauth_discovery_documents(daemon_factory: Any, path: str, auth: str | None) -> None:
    d = daemon_factory(base_path="/base")
    async with client(d) as c:
        r = await c.get(f"{d.url}{path}", headers={"Authorization": auth} if auth else {})
        assert r.status_code == 404
        r = await c.get(f"{d.url}{path}", headers=d.auth())
        assert r.status_code == 404
        r = await c.get(f"{d.url}/sse/.well-known/oauth-protected-resource")  # only the prefix is open
        assert r.status_code == 401


async def test_bad_token_post_reaches_no_stream(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        r = await s.post({"jsonrpc": "2.0", "id": "bad", "method": "ping"}, token="mcpd_000000000000_" + "A" * 43)
        assert r.status_code == 401
        assert (await s.request("ping", req_id="good"))["id"] == "good"
        assert "bad" not in [json.loads(k) for k in s.pending]


@pytest.mark.parametrize("param", ["access_token", "token", "auth"])
async def test_query_string_token_never_accepted(daemon: Daemon, param: str) -> None:
    async with client(daemon) as c:
        r = await c.get(f"{daemon.url}/sse?{param}={daemon.token}")
    assert r.status_code == 401


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "BeArEr"])
async def test_bearer_scheme_case_insensitive(daemon: Daemon, scheme: str) -> None:
    async with client(daemon) as c:
        async with c.stream("GET", f"{daemon.url}/sse", headers={"Authorization": f"{scheme} {daemon.token}"}) as r:
            assert r.status_code == 200


async def test_other_principals_session_404(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        r = await s.post(PING, token=daemon.other_token)
        assert r.status_code == 404
        assert (await s.post(PING)).status_code == 202


async def test_unknown_session_404(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        r = await s.post(PING, path="/message?session_id=" + "ab" * 16)
        assert r.status_code == 404


@pytest.mark.parametrize("query", [
    "", "?session_id=", "?session_id=" + "A" * 32, "?session_id=" + "a" * 31, "?session_id=" + "a" * 33,
    "?session_id=" + "g" * 32, "?sessionId=" + "a" * 32, "?session_id=" + "a" * 32 + "&session_id=" + "b" * 32,
])
async def test_missing_or_malformed_session_id_400(daemon: Daemon, query: str) -> None:
    async with SseSession(daemon) as s:
        r = await s.post(PING, path="/message" + query)
        assert r.status_code == 400


@pytest.mark.parametrize("raw,code", [
    (b"{not json", -32700), (b"", -32700), (b"\xff\xfe", -32700), (b"NaN", -32700),
    (b"42", -32600), (b'"ping"', -32600), (b"null", -32600), (b"true", -32600),
])
async def test_body_not_json_or_not_object_or_array_400(daemon: Daemon, raw: bytes, code: int) -> None:
    async with SseSession(daemon) as s:
        r = await s.post(None, raw=raw)
        assert r.status_code == 400
        assert r.json() == {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": r.json()["error"]["message"]}}


async def test_well_formed_object_with_bad_envelope_202_error_on_stream(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        r = await s.post({"id": 7, "method": "ping"})
        assert r.status_code == 202
        m = await s.next_message()
        assert m["id"] == 7 and m["error"]["code"] == -32600


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded", "application/jsonx"])
async def test_missing_or_wrong_content_type_415(daemon: Daemon, ctype: str | None) -> None:
    async with SseSession(daemon) as s:
        headers = {"Authorization": f"Bearer {daemon.token}"}
        if ctype:
            headers["Content-Type"] = ctype
        r = await s.client.post(f"{daemon.url}{s.endpoint}", content=json.dumps(PING).encode(), headers=headers)
        assert r.status_code == 415


async def test_content_type_with_charset_accepted(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        r = await s.post(PING, headers={"Content-Type": "Application/JSON; charset=utf-8"})
        assert r.status_code == 202


async def test_body_over_cap_413(daemon_factory: Any) -> None:
    d = daemon_factory(max_body_bytes=1000)
    async with SseSession(d) as s:
        ok = {"jsonrpc": "2.0", "id": "x" * 900, "method": "ping"}
        assert (await s.post(ok)).status_code == 202
        big = {"jsonrpc": "2.0", "id": "x" * 1000, "method": "ping"}
        assert (await s.post(big)).status_code == 413


def _raw_post_head(d: Daemon, endpoint: str, extra: str) -> bytes:
    return (f"POST {endpoint} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {d.token}\r\n"
            f"Content-Type: application/json\r\n{extra}\r\n").encode()


async def test_body_over_cap_413_content_length_judged_before_reading(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        with open_raw(daemon) as sock:  # announces 1 GiB, sends none of it
            sock.sendall(_raw_post_head(daemon, s.endpoint, f"Content-Length: {1 << 30}\r\n"))
            assert read_status(sock) == 413


async def test_body_over_cap_413_chunked_never_buffered_past_cap(daemon_factory: Any) -> None:
    d = daemon_factory(max_body_bytes=64 * 1024)
    async with SseSession(d) as s:
        with open_raw(d) as sock:  # sends cap+1 bytes in chunks and never finishes the body
            sock.sendall(_raw_post_head(d, s.endpoint, "Transfer-Encoding: chunked\r\n"))
            chunk = b"[" * 4096
            for _ in range(17):
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            assert read_status(sock) == 413


@pytest.mark.parametrize("path", ["/sse", "/message"])
async def test_origin_not_allowed_403(daemon_factory: Any, path: str) -> None:
    d = daemon_factory(allowed_origins=["https://ok.example"])
    async with SseSession(d) as s:
        url = f"{d.url}{s.endpoint if path == '/message' else path}"
        bad = {**d.auth(), "Content-Type": "application/json", "Origin": "https://evil.example"}
        r = await s.client.request("POST" if path == "/message" else "GET", url, headers=bad, content=b"{}")
        assert r.status_code == 403
        good = {**bad, "Origin": "https://ok.example"}
        r = await s.post(PING, headers=good)
        assert r.status_code == 202


async def test_any_origin_refused_when_none_allowed(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        r = await s.post(PING, headers={"Origin": f"{daemon.url}"})
        assert r.status_code == 403


async def test_mcp_protocol_version_header_ignored(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        for value in ("2025-06-18", "1999-01-01", "garbage"):
            r = await s.post({"jsonrpc": "2.0", "id": value, "method": "ping"}, headers={"MCP-Protocol-Version": value})
            assert r.status_code == 202
            assert (await s.reply(value))["result"] == {}


async def test_endpoint_event_exact_bytes(daemon: Daemon) -> None:
    with open_raw(daemon) as sock:
        sock.sendall(f"GET /sse HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {daemon.token}\r\n\r\n".encode())
        buf = b""
        while b"\n\n" not in buf.split(b"\r\n\r\n", 1)[-1]:
            buf += sock.recv(4096)
        body = buf.split(b"\r\n\r\n", 1)[1]
        assert re.search(rb"\r\nevent: endpoint\ndata: /message\?session_id=[0-9a-f]{32}\n\n", body), body


# -- allowed_hosts: the Host header (DNS-rebinding defence) ---------------------------------------


async def test_allowed_hosts_auto_refuses_other_hosts_421_before_auth(daemon_factory: Any) -> None:
    d = daemon_factory(allowed_hosts="auto")  # the test certificate names localhost and 127.0.0.1
    _, port = d.host_port
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    mcp_headers = {**d.auth(), "Accept": "application/json, text/event-stream"}
    async with client(d) as c:
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST"):
            r = await c.post(f"{d.url}/mcp", json=init, headers={**mcp_headers, "Host": host})
            assert r.status_code == 200, host
        for host in ("attacker.example", f"attacker.example:{port}", f"127.0.0.2:{port}", "localhost.attacker.example"):
            for method, path in (("POST", "/mcp"), ("GET", "/sse"), ("POST", "/login"), ("POST", "/message")):
                r = await c.request(method, f"{d.url}{path}", json=init, headers={**mcp_headers, "Host": host})
                assert r.status_code == 421, (host, path)
            r = await c.get(f"{d.url}/sse", headers={"Host": host})  # no token: still 421, not 401
            assert r.status_code == 421
        async with c.stream("GET", f"{d.url}/sse", headers=d.auth()) as s:
            assert s.status_code == 200


def test_allowed_hosts_malformed_entry_is_a_config_error(tmp_path: Any) -> None:
    with pytest.raises(RuntimeError, match="exited with 78"):
        start_daemon(tmp_path / "state", allowed_hosts=["a:b"])


@contextlib.asynccontextmanager
async def raw_session(daemon: Daemon, initialize: bool,
                      version: str = "2025-06-18") -> AsyncIterator[tuple[httpx.AsyncClient, Any, str]]:
    """A bare SSE session over httpx (no MCP client in the way): yields ``(client, the stream's
    line iterator, the POST endpoint)``, after ``initialize`` (of protocol ``version``) when asked."""
    async with httpx.AsyncClient(verify=daemon.ssl_context(), timeout=30,
                                 headers={"Authorization": f"Bearer {daemon.token}"}) as c:
        async with c.stream("GET", daemon.url + "/sse") as stream:
            lines = stream.aiter_lines()
            endpoint = ""
            async for line in lines:
                if line.startswith("data:"):
                    endpoint = line.split(":", 1)[1].strip()
                    break
            assert endpoint
            if initialize:
                init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
                assert (await c.post(daemon.url + endpoint, json=init)).status_code == 202
            yield c, lines, endpoint


@pytest.mark.parametrize("depth", [65, 1000, 100_000])
async def test_json_nested_deeper_than_64_levels_is_a_parse_error_and_the_stream_lives(daemon: Daemon,
                                                                                       depth: int) -> None:
    """On /message, /mcp and /login: 400 with -32700 (or the login's 400), never a 500 or a dead
    stream; a well-formed request on the same session still works after it."""
    deep = ("[" * depth + "]" * depth).encode()
    deep_obj = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": ' + deep + b"}}"
    async with raw_session(daemon, initialize=False) as (c, lines, endpoint):
        for body in (deep, deep_obj):
            r = await c.post(daemon.url + endpoint, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and r.json()["error"]["code"] == -32700, r.text
        r = await c.post(daemon.url + endpoint, json={"jsonrpc": "2.0", "id": 2, "method": "ping"})
        assert r.status_code == 202
        async for line in lines:
            if line.startswith("data:") and '"id":2' in line.replace(" ", ""):
                break
        r = await c.post(daemon.url + "/mcp", content=deep_obj,
                         headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
        assert r.status_code == 400 and r.json()["error"]["code"] == -32700, r.text
        r = await c.post(daemon.url + "/login", content=b'{"user": ' + deep + b', "password": "x"}',
                         headers={"Content-Type": "application/json"})
        assert r.status_code in (400, 413, 503), r.text  # 413: over the login body cap; 503: no root helper here


async def test_a_non_finite_id_is_an_invalid_request_and_every_reply_stays_json(daemon: Daemon) -> None:
    """``1e400`` parses as infinity: the request is refused -32600 with ``id: null`` (alone and in a
    batch, whose other members are answered, on a 2025-03-26 session: later ones take no batch),
    and the stream goes on carrying valid JSON."""
    async with raw_session(daemon, initialize=True, version="2025-03-26") as (c, lines, endpoint):
        raw = b'[{"jsonrpc": "2.0", "id": 1e400, "method": "ping"}, {"jsonrpc": "2.0", "id": 7, "method": "ping"}]'
        r = await c.post(daemon.url + endpoint, content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 202, r.text
        single = b'{"jsonrpc": "2.0", "id": -1e400, "method": "ping"}'
        r = await c.post(daemon.url + endpoint, content=single, headers={"Content-Type": "application/json"})
        assert r.status_code == 202, r.text
        messages = []
        async for line in lines:
            if line.startswith("data:"):
                strict = functools.partial(json.loads, parse_constant=lambda c: pytest.fail(f"{c} in a reply"))
                messages.append(strict(line.split(":", 1)[1]))  # every reply is valid JSON
                if len(messages) == 3:
                    break
    # (the two POSTs' replies may come in either order: requests run concurrently)
    batch = next((m for m in messages[1:] if isinstance(m, list)), None)
    alone = next((m for m in messages[1:] if isinstance(m, dict)), None)
    assert isinstance(batch, list) and len(batch) == 2, messages
    assert isinstance(alone, dict), messages
    bad = [m for m in batch if m["id"] is None]
    assert len(bad) == 1 and bad[0]["error"]["code"] == -32600
    assert [m for m in batch if m["id"] == 7 and "result" in m]
    assert alone["id"] is None and alone["error"]["code"] == -32600


async def test_a_lone_surrogate_in_a_path_is_invalid_argument_and_the_stream_lives(daemon: Daemon) -> None:
    """A path that is not valid UTF-8 (a lone surrogate, sent as a JSON escape) answers
    INVALID_ARGUMENT on both routes; the reply is valid JSON and the stream carries the next one."""
    async with raw_session(daemon, initialize=True) as (c, lines, endpoint):
        for rid, privileged in ((2, "false"), (3, "true")):
            raw = ('{"jsonrpc": "2.0", "id": %d, "method": "tools/call", "params": {"name": "files/read", '
                   '"arguments": {"path": "/etc/\\ud800x", "privileged": %s}}}' % (rid, privileged)).encode()
            r = await c.post(daemon.url + endpoint, content=raw, headers={"Content-Type": "application/json"})
            assert r.status_code == 202, r.text
        r = await c.post(daemon.url + endpoint, json={"jsonrpc": "2.0", "id": 4, "method": "ping"})
        assert r.status_code == 202
        replies = {}
        async for line in lines:
            if line.startswith("data:"):
                msg = json.loads(line.split(":", 1)[1])
                replies[msg.get("id")] = msg
                if 4 in replies:
                    break
    for rid in (2, 3):
        err = replies[rid]["result"]["structuredContent"]["error"]
        assert err["code"] == "INVALID_ARGUMENT", replies[rid]
    assert replies[4]["result"] == {}
