"""Attacks on Streamable HTTP at ``/mcp`` (both eras) and on the file resource, against the real
daemon over TLS (attacker session 13).

Tests marked ``xfail(strict=True)`` record a flaw found and not fixed here (see their reason);
they pass once it is fixed, and the mark must then go. The others record a flaw fixed here, or
what held, so it stays so.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Daemon
from tests.support.privsep_fixture import (  # noqa: F401  (fixture)
    LOG_TEXT,
    SECRET_TEXT,
    PrivsepDaemon,
    privsep_daemon,
)
from tests.support.workers import slow_file, worker_pids
from tests.support.streamable import client, hdrs, open_session
from tests.support.streamable import headers as modern_headers
from tests.support.streamable import request as modern_request

pytestmark = pytest.mark.anyio


def raw_headers(pairs: dict[str, str], *repeated: tuple[str, str]) -> list[tuple[str, str]]:
    """``pairs`` as a header list, then the ``repeated`` ones (a header sent twice)."""
    return [*pairs.items(), *repeated]


# -- session era --------------------------------------------------------------------------------


async def test_cancelled_request_does_not_say_its_session_ended(daemon_factory: Any, tmp_path: Path) -> None:
    """A request cancelled by ``notifications/cancelled`` (SPEC §2.3: no reply is sent for it) on a
    live session must not have its POST answered ``404``: that is the answer for an unknown or
    ended session (SPEC §1.3, §1.6), and SDK clients take it as "session terminated"."""
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
    """``Mcp-Session-Id`` and ``MCP-Protocol-Version`` carry one value (SPEC §1.6): sent twice, a
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


# -- stateless era ----------------------------------------------------------------------------


async def test_repeated_mirror_header_is_refused(daemon: Daemon, tmp_path: Path) -> None:
    """The 2026-07-28 ``Mcp-Method``/``Mcp-Name``/``MCP-Protocol-Version`` headers mirror the body
    so that gateways can route and authorize without reading it (SPEC §1.6). Sent twice, mcpd
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
    body in the session era (SPEC §2.3, §1.6); a stateless request with the same id got ``200``."""
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


# -- slow clients ---------------------------------------------------------------------------------


def _unread_post(d: Daemon, sid: str, body: bytes) -> Any:
    """A raw TLS connection with a small receive window that sends one POST /mcp and reads nothing."""
    host, port = d.host_port
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window stays small
    sock.settimeout(30)
    sock.connect((host, port))
    tls: ssl.SSLSocket = d.ssl_context().wrap_socket(sock, server_hostname=host)
    tls.sendall((f"POST /mcp HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {d.token}\r\n"
                 f"Content-Type: application/json\r\nAccept: application/json\r\nMcp-Session-Id: {sid}\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    return tls


def _read_all(tls: Any) -> int:
    """Bytes read until the server ends the connection (or 10 s of silence)."""
    tls.settimeout(10)
    got = 0
    try:
        while chunk := tls.recv(1 << 16):
            got += len(chunk)
    except OSError:
        pass
    return got


async def test_unread_json_answers_are_bounded_like_a_sessions_queue(daemon_factory: Any, tmp_path: Path) -> None:
    """Each POST /mcp answered as JSON (up to the 10 MiB response cap) that its client never reads
    is held by the front until the connection ends: 16 such POSTs made the front hold ~370 MiB.
    SPEC §1.7 bounds what a client makes the server hold per principal and in total, and
    disconnects a client that stops reading: such answers count
    against the principal's ``principal_queue_bytes`` (here 32 MiB), so 8 unread answers of 9 MiB
    on one session (72 MiB) must not all be delivered in full."""
    d = daemon_factory(principal_queue_bytes=32 * 1024 * 1024)
    big = tmp_path / "big.txt"
    big.write_bytes((b"x" * 99 + b"\n") * (9 * 1024 * 1024 // 100))
    n = 8
    async with client(d) as c:
        sid = await open_session(c, d)
        conns = []
        for i in range(n):
            body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
                "name": "files/read", "arguments": {"path": str(big), "offset": 0, "limit": 9 * 1024 * 1024}}}).encode()
            conns.append(await asyncio.to_thread(_unread_post, d, sid, body))
        try:
            access = d.state_dir / "access.jsonl"
            for _ in range(600):  # until every read is done (its record written)
                done = [json.loads(x) for x in access.read_text().splitlines()] if access.exists() else []
                if sum(1 for r in done if r.get("tool") == "files/read" and r.get("bytes")) >= n:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the reads did not finish")
            r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": "p", "method": "ping"}, headers=hdrs(d, sid))
            assert r.status_code == 200  # the front still answers others meanwhile
            got = [await asyncio.to_thread(_read_all, t) for t in conns]
        finally:
            for t in conns:
                t.close()
    full = sum(1 for g in got if g > 9 * 1024 * 1024)
    assert full < n, f"all {n} unread answers of 9 MiB were held and delivered in full: {got}"


# -- the file resource on the privilege-separated daemon (real accounts, root helper) ---------------


async def _mcp_read(d: PrivsepDaemon, who: str, uri: str, **params: Any) -> dict[str, Any]:
    """``resources/read`` of ``uri`` as ``who`` over a fresh /mcp session; the reply object."""
    auth = {"Authorization": f"Bearer {d.tokens[who]}", "Accept": "application/json",
            "Content-Type": "application/json"}
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=d.cacert), base_url=d.url, timeout=60) as c:
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "a13", "version": "1"}}}
        r = await c.post("/mcp", json=init, headers=auth)
        assert r.status_code == 200, r.text
        h = {**auth, "Mcp-Session-Id": r.headers["mcp-session-id"]}
        await c.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=h)
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "resources/read",
                                       "params": {"uri": uri, **params}}, headers=h)
        assert r.status_code == 200, r.text
        reply: dict[str, Any] = r.json()
        await c.delete("/mcp", headers=h)
        return reply


def _refused(reply: dict[str, Any], code: str) -> None:
    assert "result" not in reply, reply
    assert reply["error"]["data"]["code"] == code, reply
    assert SECRET_TEXT not in json.dumps(reply) and "do not leak" not in json.dumps(reply)


async def test_resource_symlinks_and_tricks_leak_nothing_across_accounts(privsep_daemon: PrivsepDaemon) -> None:
    """The file resource on the real daemon (SPEC §1.6, §3, §4.3–4.4, §5.1): a symlink alice
    plants in her own home (her workspace) to bob's private file, or to root's secret, reads as
    alice's account would (the kernel refuses); ``..``, percent-encoding and double slashes in a
    privileged URI are judged on the cleaned path (outside the grant: refused), and a privileged
    read through alice's symlink is refused though the link's target is granted."""
    d = privsep_daemon
    alice, bob = d.accounts["alice"], d.accounts["bob"]
    private = Path(bob.home) / "a13-private.txt"
    private.write_text(SECRET_TEXT)
    os.chown(private, bob.uid, bob.uid)
    os.chmod(private, 0o600)
    links = {"to-bob": private, "to-secret": d.secret, "to-log": d.log_file}
    for name, target in links.items():
        link = Path(alice.home) / f"a13-{name}"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        os.lchown(link, alice.uid, alice.uid)
    try:
        for uri in ("file:a13-to-bob", f"file://{alice.home}/a13-to-bob", f"file://{private}",
                    "file:a13-to-secret", f"file://{d.secret}"):
            _refused(await _mcp_read(d, "alice", uri), "PERMISSION_DENIED")
        app = str(d.app)
        for uri in (f"file://{app}/../secret", f"file://{app}/%2e%2e/secret", f"file://{app}%2F..%2Fsecret",
                    f"file:///{app}//..//secret", f"file://{app}-evil/x", f"file://{alice.home}/a13-to-log",
                    "file:a13-to-log", f"file://{alice.home}/a13-to-secret"):
            reply = await _mcp_read(d, "alice", uri, privileged=True)
            _refused(reply, "PERMISSION_DENIED")
        # existence is not revealed: a missing file outside the grant, or inside a folder alice
        # cannot search, is refused exactly like a present one
        for uri, privileged in ((f"file://{app}-evil/x", True), (f"file://{app}-evil/missing", True),
                                (f"file://{app}/log.txt", False), (f"file://{app}/missing", False)):
            reply = await _mcp_read(d, "alice", uri, privileged=privileged)
            _refused(reply, "PERMISSION_DENIED")
        ok = await _mcp_read(d, "alice", f"file://{app}//log.txt?privileged=true")
        assert ok["result"]["contents"][0]["text"] == LOG_TEXT
        _refused(await _mcp_read(d, "bob", f"file://{app}/log.txt", privileged=True), "PERMISSION_DENIED")
    finally:
        for name in links:
            (Path(alice.home) / f"a13-{name}").unlink(missing_ok=True)
        private.unlink(missing_ok=True)
