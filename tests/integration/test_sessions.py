"""docs/REFERENCE.md §1.4–§1.5 against the real daemon: session lifetime, bounded queues, caps, concurrency, leaks."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Daemon, SseSession, open_raw
from tests.support.workers import slow_file, worker_pids

pytestmark = pytest.mark.anyio

PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}


async def wait_for_404(d: Daemon, endpoint: str, tries: int = 200) -> bool:
    """POST a ping to ``endpoint`` until it answers 404 (the server noticed the stream's end)."""
    async with httpx.AsyncClient(verify=d.ssl_context(), timeout=20) as c:
        for _ in range(tries):
            r = await c.post(f"{d.url}{endpoint}", json=PING, headers=d.auth())
            if r.status_code == 404:
                return True
            assert r.status_code == 202
            await asyncio.sleep(0.05)
    return False


async def test_stream_close_ends_session_later_posts_404(daemon: Daemon) -> None:
    s = SseSession(daemon)
    await s.__aenter__()
    await s.initialize()
    endpoint = s.endpoint
    assert (await s.post(PING)).status_code == 202
    await s.close()
    assert await wait_for_404(daemon, endpoint)


async def test_stream_close_cancels_in_flight_and_stops_worker(daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory(workers={"timeout_seconds": 120})
    path = slow_file(tmp_path)
    s = SseSession(d)
    await s.__aenter__()
    await s.initialize()
    before = worker_pids(d.pid)
    await s.post({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                  "params": {"name": "files/read", "arguments": {"path": str(path), "start_line": 3}}})
    busy: set[int] = set()
    for _ in range(200):
        busy = worker_pids(d.pid) - before
        if busy:
            break
        await asyncio.sleep(0.05)
    assert busy, "no worker started for the slow read"
    await s.close()
    for _ in range(400):  # the deadline is 120 s: only the session's end can stop it this soon
        if not busy & worker_pids(d.pid):
            break
        await asyncio.sleep(0.05)
    assert not busy & worker_pids(d.pid)


async def test_slow_request_delays_no_other_request_or_session(daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory(workers={"timeout_seconds": 120})
    path = slow_file(tmp_path)
    small = tmp_path / "small.txt"
    small.write_text("ok\n")
    async with SseSession(d) as a, SseSession(d) as b:
        await a.initialize()
        await b.initialize()
        await a.post({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                      "params": {"name": "files/read", "arguments": {"path": str(path), "start_line": 3}}})
        for s in (a, b):
            r = await s.request("tools/call", {"name": "files/read", "arguments": {"path": str(small)}})
            assert r["result"]["content"][0]["text"] == "ok\n"
            assert (await s.request("ping"))["result"] == {}
        assert '"slow"' not in a.pending  # still running, yet everything else was answered


async def test_client_that_stops_reading_is_disconnected(daemon_factory: Any) -> None:
    """A client that reads nothing while ~1 MB replies pile up: its queue of 4 messages fills, the
    next requests wait for room, and once it has taken nothing for ``connections.idle_seconds``
    (here 1 s) the session is closed (404) and the stream ended."""
    d = daemon_factory(session_queue_size=4, connections={"idle_seconds": 1})
    sock = open_raw(d)
    try:
        sock.sendall(f"GET /sse HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {d.token}\r\n\r\n".encode())
        head = b""
        while not (m := re.search(rb"data: (/message\?session_id=[0-9a-f]{32})\n", head)):
            head += sock.recv(4096)
        endpoint = m.group(1).decode()
        # never read again; each reply is ~1 MB, far beyond socket buffers plus 4 queued messages
        big = {"jsonrpc": "2.0", "id": "x" * 1_000_000, "method": "ping"}
        statuses = []
        async with httpx.AsyncClient(verify=d.ssl_context(), timeout=20) as c:
            end = asyncio.get_running_loop().time() + 30
            while asyncio.get_running_loop().time() < end:
                r = await c.post(f"{d.url}{endpoint}", content=json.dumps(big), headers={
                    **d.auth(), "Content-Type": "application/json"})
                statuses.append(r.status_code)
                if r.status_code == 404:
                    break
                await asyncio.sleep(0.05)
        assert statuses[-1] == 404, statuses
        sock.settimeout(20)
        while sock.recv(1 << 20):  # drain: the server closed the stream, so this reaches EOF
            pass
    finally:
        sock.close()
    async with SseSession(d) as s:  # the daemon is unharmed
        assert (await s.request("ping"))["result"] == {}


async def test_max_sessions_503(daemon_factory: Any) -> None:
    d = daemon_factory(max_sessions=2)
    async with SseSession(d) as s1, SseSession(d):
        async with httpx.AsyncClient(verify=d.ssl_context(), timeout=20) as c:
            r = await c.get(f"{d.url}/sse", headers=d.auth())
            assert r.status_code == 503
        ep = s1.endpoint
        await s1.close()
        assert await wait_for_404(d, ep)
        async with SseSession(d) as s3:
            assert (await s3.request("ping"))["result"] == {}


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.slow
async def test_2000_session_cycles_leave_rss_and_fds_flat(daemon_factory: Any) -> None:
    d = daemon_factory(max_sessions=20)  # a session left in the table would soon give 503
    cycles, warmup, budget = 2000, 200, 300.0
    async with httpx.AsyncClient(verify=d.ssl_context(), timeout=20) as c:

        async def cycle() -> None:
            async with SseSession(d, client=c) as s:
                r = await s.initialize()
                assert r["result"]["serverInfo"]["name"] == "mcpd"

        start = time.monotonic()
        for _ in range(warmup):
            await cycle()
        await asyncio.sleep(1)
        rss0, fds0 = rss_kib(d.pid), fd_count(d.pid)
        done = warmup
        while done < cycles and time.monotonic() - start < budget:
            await cycle()
            done += 1
        elapsed = time.monotonic() - start
    fds1 = fd_count(d.pid)
    for _ in range(100):  # closed connections are released once the server sees them go
        if fds1 <= fds0:
            break
        await asyncio.sleep(0.1)
        fds1 = fd_count(d.pid)
    rss1 = rss_kib(d.pid)
    print(f"\n{done} cycles in {elapsed:.1f} s; RSS {rss0} -> {rss1} KiB; fds {fds0} -> {fds1}")
    assert done == cycles, f"only {done} cycles within {budget} s"
    assert fds1 <= fds0 + 2
    assert rss1 - rss0 < 4 * 1024


async def test_16_sessions_200_reads_each_matched_by_id(daemon: Daemon, tmp_path: Path) -> None:
    n_sessions, n_reads = 16, 200
    files = []
    for i in range(n_sessions):
        p = tmp_path / f"f{i}.txt"
        p.write_text("".join(f"s{i}-line-{n}\n" for n in range(1, n_reads + 1)))
        files.append(p)

    async def one(i: int) -> int:
        async with SseSession(daemon) as s:
            await s.initialize()
            ids = [f"s{i}-r{n}" for n in range(1, n_reads + 1)]
            posts = [s.post({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {
                "name": "files/read", "arguments": {"path": str(files[i]), "start_line": n, "end_line": n}}})
                for n, rid in enumerate(ids, start=1)]
            for chunk in range(0, n_reads, 25):
                statuses = await asyncio.gather(*posts[chunk:chunk + 25])
                assert all(r.status_code == 202 for r in statuses)
            good = 0
            for n, rid in enumerate(ids, start=1):
                reply = await s.reply(rid)
                assert reply["result"]["content"][0]["text"] == f"s{i}-line-{n}\n", reply
                good += 1
            return good

    counts = await asyncio.gather(*(one(i) for i in range(n_sessions)))
    assert counts == [n_reads] * n_sessions
