"""A bounded fuzz test over the real transport (issue "hostile load"): a few thousand hostile bodies
from a fixed seed (``tests/fuzzgen.py``) POSTed over TLS to ``/message`` (four SSE sessions) and
``/mcp`` (a Streamable HTTP session), against the real daemon and its workers.

Asserted: no ``5xx``; no SSE stream ended by the server; every request answered (each valid id
exactly once, each invalid id as one ``id: null`` reply); no reply is an internal error (a
JSON-RPC ``-32603`` or a tool's ``INTERNAL_ERROR``); every reply strict JSON; the daemon alive and
still serving at the end. Every loop is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Daemon, SseSession, start_daemon, stop_daemon
from tests.fuzzgen import Generator, expectation, strict

SEED = 20261201
SSE_SESSIONS = 4
SSE_BODIES = 350  # per SSE session
MCP_BODIES = 600
CONCURRENCY = 8  # POSTs in flight per session
DEADLINE = 120.0  # seconds for the whole exchange (it takes far less; a hang fails instead of blocking CI)




def files(root: Path) -> list[str]:
    (root / "small.txt").write_text("one\ntwo\r\nthree")
    (root / "utf8.txt").write_text("é€\u2028x\n" * 50)
    (root / "empty.txt").write_bytes(b"")
    (root / "binary.bin").write_bytes(b"\0\1\2")
    (root / "long.txt").write_bytes(b"y" * 70_000 + b"\nshort\n")
    (root / "latin.txt").write_bytes(b"caf\xe9\n")
    os.mkfifo(root / "fifo")
    (root / "dir").mkdir()
    with open(os.path.join(os.fsencode(root / "dir"), b"caf\xe9.txt"), "wb") as f:  # a name that is not UTF-8
        f.write(b"x\n")
    os.chmod(root, 0o755)
    return [str(root / n) for n in ("small.txt", "utf8.txt", "empty.txt", "binary.bin", "long.txt", "latin.txt",
                                    "fifo", "dir")]


def internal_errors(reply: Any) -> list[Any]:
    """The internal errors in one reply: a JSON-RPC -32603, or a tool result with INTERNAL_ERROR."""
    out = []
    for r in reply if isinstance(reply, list) else [reply]:
        if not isinstance(r, dict):
            continue
        if isinstance(r.get("error"), dict) and r["error"].get("code") == -32603:
            out.append(r)
        err = (r.get("result") or {}).get("structuredContent", {}).get("error") if isinstance(r.get("result"), dict) \
            else None
        if isinstance(err, dict) and err.get("code") == "INTERNAL_ERROR":
            out.append(r)
    return out


class Tally:
    """Expected and received replies of one SSE session (ids by their JSON text)."""

    def __init__(self) -> None:
        self.want: collections.Counter[str] = collections.Counter()
        self.got: collections.Counter[str] = collections.Counter()
        self.nulls_want = 0
        self.nulls_got = 0
        self.internal: list[Any] = []
        self.statuses: collections.Counter[int] = collections.Counter()

    def expect(self, ids: list[Any], nulls: int) -> None:
        self.want.update(json.dumps(i) for i in ids)
        self.nulls_want += nulls

    def receive(self, reply: Any) -> None:
        self.internal += internal_errors(reply)
        for r in reply if isinstance(reply, list) else [reply]:
            if isinstance(r, dict) and "method" not in r:
                if r.get("id") is None:
                    self.nulls_got += 1
                else:
                    self.got[json.dumps(r["id"])] += 1

    def complete(self) -> bool:
        return self.got == self.want and self.nulls_got == self.nulls_want


async def fuzz_sse(d: Daemon, client: httpx.AsyncClient, gen: Generator, count: int) -> Tally:
    tally = Tally()
    async with SseSession(d, client=client) as s:
        await s.initialize()
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one() -> None:
            body, ctype = gen.body()
            want = expectation(body, ctype)
            if want is not None:
                _, ids, nulls, _ = want
                tally.expect(ids, nulls)
            async with gate:
                r = await s.post(None, raw=body, headers={"Content-Type": ctype} if ctype else {"Content-Type": ""})
            tally.statuses[r.status_code] += 1
            if want is None:
                assert 400 <= r.status_code < 500, (body[:200], r.status_code)
                if r.headers.get("content-type", "").startswith("application/json"):
                    strict(r.text)
            else:
                assert r.status_code == 202, (body[:200], r.status_code, r.text[:200])

        posted = asyncio.Event()

        async def drain() -> None:
            while not (posted.is_set() and tally.complete()):
                try:
                    ev = await s.next_event(timeout=0.5)
                except asyncio.TimeoutError:
                    continue  # (the loop is bounded by the wait below)
                if ev.event == "message":
                    tally.receive(strict(ev.data))

        reader = asyncio.create_task(drain())
        await asyncio.gather(*(one() for _ in range(count)))
        posted.set()
        try:
            await asyncio.wait_for(asyncio.shield(reader), 60)
        except (asyncio.TimeoutError, EOFError):
            pass
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        # the stream is still open and the session still answers
        assert await s.request("ping") == {"jsonrpc": "2.0", "id": s._next_id, "result": {}}
    return tally


async def fuzz_mcp(d: Daemon, client: httpx.AsyncClient, gen: Generator, count: int) -> Tally:
    tally = Tally()
    base = {**d.auth(), "Accept": "application/json"}
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "0"}}}
    r = await client.post(d.url + "/mcp", json=init, headers=base)
    assert r.status_code == 200, r.text
    sid = r.headers["mcp-session-id"]
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one() -> None:
        body, ctype = gen.body()
        want = expectation(body, ctype)
        async with gate:
            r = await client.post(d.url + "/mcp", content=body,
                                  headers={**base, "Mcp-Session-Id": sid, "Content-Type": ctype})
        tally.statuses[r.status_code] += 1
        assert r.status_code < 500, (body[:200], r.status_code, r.text[:300])
        if want is None:
            assert 400 <= r.status_code < 500, (body[:200], r.status_code)
            return
        _, ids, nulls, anything = want
        tally.expect(ids, nulls)
        if not anything:
            assert r.status_code == 202, (body[:200], r.status_code, r.text[:200])
            return
        assert r.status_code in (200, 400), (body[:200], r.status_code, r.text[:200])
        tally.receive(strict(r.text))

    await asyncio.gather(*(one() for _ in range(count)))
    return tally


@pytest.fixture
def fuzz_daemon(tmp_path: Path) -> Any:
    (tmp_path / "files").mkdir()
    paths = files(tmp_path / "files")
    d = start_daemon(tmp_path / "d", keepalive_seconds=1.0)
    yield d, paths
    stop_daemon(d)


def test_fuzzed_bodies_over_sse_and_mcp_are_all_answered_and_break_nothing(fuzz_daemon: Any) -> None:
    d, paths = fuzz_daemon

    async def go() -> list[Tally]:
        limits = httpx.Limits(max_connections=40, max_keepalive_connections=40)
        async with httpx.AsyncClient(verify=d.ssl_context(), timeout=30, limits=limits) as client:
            gens = [Generator(SEED + i, paths, i) for i in range(SSE_SESSIONS + 1)]
            jobs = [fuzz_sse(d, client, gens[i], SSE_BODIES) for i in range(SSE_SESSIONS)]
            jobs.append(fuzz_mcp(d, client, gens[-1], MCP_BODIES))
            return await asyncio.wait_for(asyncio.gather(*jobs), DEADLINE)

    started = time.monotonic()
    tallies = asyncio.run(go())
    took = time.monotonic() - started
    for i, t in enumerate(tallies):
        kind = "mcp" if i == SSE_SESSIONS else f"sse{i}"
        assert not t.internal, f"{kind}: internal errors: {t.internal[:3]}"
        assert t.got == t.want, (kind, t.want - t.got, t.got - t.want)
        assert t.nulls_got == t.nulls_want, (kind, t.nulls_got, t.nulls_want)
        assert not any(s >= 500 for s in t.statuses), (kind, t.statuses)
    assert d.proc.poll() is None, "the daemon died"
    with httpx.Client(verify=d.ssl_context(), timeout=10) as c:
        assert c.get(d.url + "/sse", headers={"Authorization": "Bearer nope"}).status_code == 401
    print(f"fuzz: {SSE_SESSIONS * SSE_BODIES + MCP_BODIES} bodies in {took:.1f} s; "
          + "; ".join(f"{dict(t.statuses)}" for t in tallies))
