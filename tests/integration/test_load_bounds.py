"""Hostile load through the real daemon (docs/REFERENCE.md §1.7): what a client can make the
server hold is bounded, and one client's abuse never stops another client from being served.

- a slow reader: 200 reads of 1 MiB posted to a session that never reads its stream;
- one batch whose answer would be far larger than a session's queue, on /sse and /mcp;
- per-principal fairness: one principal over its session and call caps, another one unaffected;
- slowloris: 300 half-sent requests, closed by the header deadline, while a normal client is served.

Memory is asserted with generous bounds; time only as generous timeouts, never as a speed.
Every loop is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Daemon, SseSession, open_raw, tree_rss_kib

MIB = 1024 * 1024
# 2025-03-26: the batches of these tests end with 2025-06-18
INIT = {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
    "protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


def mib_file(folder: Path, name: str = "one-mib.txt") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes((b"x" * 1023 + b"\n") * 1024)
    os.chmod(folder, 0o755)
    return path


def read_call(path: Path, rid: Any, **extra: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {
        "name": "files/read", "arguments": {"path": str(path), "offset": 0, "limit": MIB, **extra}}}


async def many(s: SseSession, method: str, params: dict[str, Any], count: int) -> list[Any]:
    """``count`` requests in flight at once on ``s``; their replies in order."""
    ids = [s.new_id() for _ in range(count)]
    for rid in ids:
        assert (await s.post({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})).status_code == 202
    return [await s.reply(rid) for rid in ids]


def stalled_session(d: Daemon) -> tuple[ssl.SSLSocket, str]:
    """A GET /sse whose client reads the endpoint event and then nothing more."""
    sock = open_raw(d)
    sock.sendall(f"GET /sse HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {d.token}\r\n\r\n".encode())
    head = b""
    while b"session_id=" not in head or not head.rstrip(b" ").endswith(b"\n"):
        head += sock.recv(4096)
    return sock, head.split(b"data: ", 1)[1].split(b"\n", 1)[0].decode().strip()


def test_a_slow_reader_is_dropped_holding_little_while_another_session_is_served(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    # the defaults (session_queue_bytes 16 MiB), but a client that takes nothing while its queue is
    # full is disconnected after 1 s (connections.idle_seconds) rather than 5
    d = daemon_factory(connections={"idle_seconds": 1})
    big = mib_file(tmp_path / "files")
    small = tmp_path / "files" / "small.txt"
    small.write_text("small\n")

    async def go() -> tuple[list[int], int, int, int]:
        async with httpx.AsyncClient(verify=d.ssl_context(), timeout=30, headers=d.auth()) as c, \
                SseSession(d, token=d.other_token) as other:
            await other.initialize()
            async with SseSession(d, client=c) as warm:  # alice's workers (4) started and warm, as bob's
                await warm.initialize()
                for s in (warm, other):
                    await many(s, "tools/call", {"name": "files/read", "arguments": {"path": str(big), "limit": MIB}}, 8)
            await asyncio.sleep(0.5)
            base = tree_rss_kib(d.pid)
            peak, served = base, 0
            sock, endpoint = stalled_session(d)
            try:
                assert (await c.post(d.url + endpoint, json=INIT)).status_code == 202
                statuses = []
                end = asyncio.get_running_loop().time() + 30
                for i in range(400):  # up to 400 MiB of answers for a client that reads none of them
                    statuses.append((await c.post(d.url + endpoint, json=read_call(big, i))).status_code)
                    if i % 10 == 0:  # the other session is served throughout
                        reply = await asyncio.wait_for(other.request("tools/call", {
                            "name": "files/read", "arguments": {"path": str(small)}}), 10)
                        assert reply["result"]["content"][0]["text"] == "small\n"
                        served += 1
                        peak = max(peak, tree_rss_kib(d.pid))
                    if statuses[-1] == 404 or asyncio.get_running_loop().time() > end:
                        break
                for _ in range(20):  # the reads already accepted finish; memory is sampled meanwhile
                    await asyncio.sleep(0.25)
                    peak = max(peak, tree_rss_kib(d.pid))
                reply = await asyncio.wait_for(other.request("ping"), 10)
                assert "result" in reply
                return statuses, base, peak, served
            finally:
                sock.close()

    statuses, base, peak, served = asyncio.run(go())
    print(f"\nslow reader: {len(statuses)} POSTs before the session was dropped; daemon tree RSS "
          f"{base / 1024:.0f} -> peak {peak / 1024:.0f} MiB (+{(peak - base) / 1024:.0f} MiB); other session served "
          f"{served} times")
    assert statuses[-1] == 404, "the session that stopped reading was dropped"
    assert peak - base < 64 * 1024, f"grew by {(peak - base) / 1024:.0f} MiB"
    assert served >= 1


@pytest.mark.parametrize("transport", ["sse", "mcp"])
def test_a_batch_answer_is_bounded_in_bytes(daemon_factory: Callable[..., Daemon], tmp_path: Path,
                                            transport: str) -> None:
    """session_queue_bytes bounds one batch's answer: members past it get -32000, not their 1 MiB."""
    d = daemon_factory(session_queue_bytes=4 * MIB)
    big = mib_file(tmp_path / "files")
    batch = [read_call(big, i) for i in range(12)]

    async def go() -> list[Any]:
        async with httpx.AsyncClient(verify=d.ssl_context(), timeout=60, headers=d.auth()) as c:
            if transport == "mcp":
                h = {"Accept": "application/json"}
                r = await c.post(d.url + "/mcp", json=INIT, headers=h)
                h["Mcp-Session-Id"] = r.headers["mcp-session-id"]
                r = await c.post(d.url + "/mcp", json=batch, headers=h)
                assert r.status_code == 200, r.text[:300]
                assert len(r.content) < 5 * MIB
                return list(r.json())
            async with SseSession(d, client=c) as s:
                await s.initialize("2025-03-26")
                assert (await s.post(batch)).status_code == 202
                ev = await s.next_event(timeout=60)
                assert len(ev.data) < 5 * MIB
                return list(json.loads(ev.data))

    replies = asyncio.run(go())
    assert sorted(r["id"] for r in replies) == list(range(12))
    full = [r for r in replies if "result" in r]
    dropped = [r for r in replies if r.get("error", {}).get("code") == -32000]
    assert 1 <= len(full) <= 4 and len(full) + len(dropped) == 12, [r.get("error") for r in replies]
    assert all(len(r["result"]["content"][0]["text"]) == MIB for r in full)


def test_one_principal_over_its_caps_never_makes_another_wait_or_get_refused(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = daemon_factory(max_sessions=8, max_sessions_per_principal=5, max_calls_per_principal=4,
                       max_in_flight=64)
    folder = tmp_path / "files"
    folder.mkdir()
    huge = folder / "huge.log"
    with open(huge, "wb") as f:
        f.write(b"a\n" * 8192)
        f.truncate(8 * 1024 ** 3)  # a hole: counting its lines keeps a worker busy for seconds
    (folder / "small.txt").write_text("bob's\n")
    os.chmod(folder, 0o755)
    slow = {"name": "files/read", "arguments": {"path": str(huge), "start_line": 10 ** 9}}

    async def go() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with httpx.AsyncClient(verify=d.ssl_context(), timeout=30) as c:
            alice: list[SseSession] = []
            try:
                for _ in range(5):
                    s = SseSession(d, client=c)
                    await s.__aenter__()
                    await s.initialize()
                    alice.append(s)
                sixth = await c.get(d.url + "/sse", headers=d.auth())  # over alice's session cap
                out["alice_sixth_session"] = sixth.status_code
                await sixth.aclose()
                rid = 0
                # 20 slow calls, 4 per session (what one session runs at once of calls that may answer large)
                for s in alice:
                    for _ in range(4):
                        rid += 1
                        assert (await s.post({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                                              "params": slow})).status_code == 202
                refused = []
                for s in alice[1:]:  # the first session's 4 run; the 16 after them are refused at once
                    for _ in range(4):
                        m = await s.next_message(timeout=20)
                        refused.append(m["result"]["structuredContent"]["error"]["code"])
                out["alice_refused"] = refused
                async with SseSession(d, token=d.other_token, client=c) as bob:  # bob still opens a session
                    await bob.initialize()
                    replies = await asyncio.wait_for(many(bob, "tools/call", {
                        "name": "files/read", "arguments": {"path": str(folder / "small.txt")}}, 5), 20)
                    out["bob"] = [r["result"]["content"][0]["text"] for r in replies]
                    out["bob_slow"] = await asyncio.wait_for(bob.request("ping"), 10)
            finally:
                for s in alice:
                    await s.close()
        return out

    out = asyncio.run(go())
    assert out["alice_sixth_session"] == 429
    assert out["alice_refused"] == ["RATE_LIMITED"] * 16
    assert out["bob"] == ["bob's\n"] * 5  # within his own caps, all served
    assert "result" in out["bob_slow"]


def test_slowloris_half_sent_requests_are_all_closed_while_a_normal_client_is_served(
        daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory(connections={"header_seconds": 10})  # the default deadline, written out
    host, port = d.host_port
    count, deadline = 300, 30.0

    async def go() -> tuple[int, int, bool]:
        ctx = d.ssl_context()
        conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        gate = asyncio.Semaphore(50)

        async def half() -> None:
            async with gate:
                r, w = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=ctx, server_hostname=host), 30)
                w.write(b"POST /message?session_id=" + b"0" * 32 + b" HTTP/1.1\r\nHost: x\r\nContent-Type: appli")
                await w.drain()
                conns.append((r, w))

        await asyncio.gather(*(half() for _ in range(count)))
        sent = time.monotonic()
        async with httpx.AsyncClient(verify=ctx, timeout=10) as c:  # served during the attack
            r = await c.get(d.url + "/sse", headers={"Authorization": "Bearer nope"})
            normal_ok = r.status_code == 401
            async with SseSession(d, client=c) as s:
                await s.initialize()
                normal_ok = normal_ok and (await s.request("ping"))["result"] == {}

        async def closed(r: asyncio.StreamReader) -> bool:
            try:
                left = deadline - (time.monotonic() - sent)
                return await asyncio.wait_for(r.read(), max(left, 0.1)) == b""
            except TimeoutError:
                return False
            except (OSError, ssl.SSLError):
                return True

        results = await asyncio.gather(*(closed(r) for r, _ in conns))
        for _, w in conns:
            w.close()
        return len(conns), sum(results), normal_ok

    opened, closed_count, normal_ok = asyncio.run(go())
    print(f"\nslowloris: {opened} half-sent requests, {closed_count} closed by the server within {deadline:.0f} s")
    assert opened == count
    assert closed_count == count
    assert normal_ok


def test_the_daemon_stops_on_sigterm_while_streams_are_open(daemon_factory: Callable[..., Daemon]) -> None:
    """Shutdown closes the sessions first, which ends their streams (a stalled one included), so
    the daemon exits, and every response was completed (none cut by the shutdown)."""
    d = daemon_factory()
    stalled, _ = stalled_session(d)

    async def go() -> list[bool]:
        async with SseSession(d) as a, SseSession(d, token=d.other_token) as b:
            await a.initialize()
            await b.initialize()
            d.proc.terminate()
            ended = []
            for s in (a, b):
                try:
                    while True:
                        await s.next_event(timeout=15)
                except EOFError:
                    ended.append(True)
            return ended

    try:
        assert asyncio.run(go()) == [True, True]
        assert d.proc.wait(timeout=15) in (0, -15)  # (uvicorn re-raises the stop signal once it is done)
        assert "Traceback" not in d.log() and "without completing response" not in d.log(), d.log()[-2000:]
    finally:
        stalled.close()
