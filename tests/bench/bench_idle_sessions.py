"""Idle sessions benchmark (issue "hostile load", the shared benchmark's workload e): what an idle SSE
session costs the daemon, and whether closing them gives the memory back.

Run: ``.venv/bin/python tests/bench/bench_idle_sessions.py [--sessions 500] [--hold 10] [--rounds 2]``.
Starts a real ``mcpd serve`` (``tests/conftest.py``'s ``start_daemon``), warms it with one session
and one read, then for each round: opens ``--sessions`` SSE streams over TLS (each one
``initialize`` + ``notifications/initialized`` over a POST connection that is then closed, as
workload e does), holds them ``--hold`` seconds, pings each one, closes them all and waits ``--settle`` seconds.
Prints the front's RSS and the workers' RSS (KiB) before, loaded and after close, KiB per
session, and after-close as a percentage of before (the front's RSS is also printed every 0.5 s
of ``--settle``: freed memory is handed back a second or so after the last close). Bounded: at most ``sessions * rounds`` sessions
and a 300 s deadline per round. Not a test: it prints figures and decides nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.conftest import Daemon, process_tree, start_daemon, stop_daemon, tree_rss_kib  # noqa: E402

ROUND_DEADLINE = 300.0
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}


def rss_kib(pid: int) -> int:
    """VmRSS of one process (KiB)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def snapshot(d: Daemon) -> tuple[int, int]:
    """(front RSS, every descendant's RSS together), KiB."""
    front = rss_kib(d.pid)
    return front, tree_rss_kib(d.pid) - front


class IdleSession:
    """One SSE stream held open by a raw TLS connection; messages parsed into a queue."""

    def __init__(self, d: Daemon, ctx: ssl.SSLContext) -> None:
        self.d, self.ctx = d, ctx
        self.messages: asyncio.Queue[Any] = asyncio.Queue()
        self.endpoint = ""
        self.writer: asyncio.StreamWriter | None = None
        self.reader_task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        host, port = self.d.host_port
        reader, self.writer = await asyncio.open_connection(host, port, ssl=self.ctx, server_hostname=host)
        self.writer.write(f"GET /sse HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {self.d.token}\r\n"
                          f"Accept: text/event-stream\r\n\r\n".encode())
        got = asyncio.get_running_loop().create_future()
        self.reader_task = asyncio.create_task(self._read(reader, got))
        self.endpoint = await asyncio.wait_for(got, 30)

    async def _read(self, reader: asyncio.StreamReader, got: asyncio.Future[str]) -> None:
        event = ""
        while line := await reader.readline():
            text = line.decode().rstrip("\r\n")
            if text.startswith("event:"):
                event = text[6:].strip()
            elif text.startswith("data:"):
                data = text[5:].strip()
                if event == "endpoint" and not got.done():
                    got.set_result(data)
                elif event == "message":
                    self.messages.put_nowait(json.loads(data))

    async def post(self, message: dict[str, Any]) -> None:
        """POST on a connection of its own, closed afterwards (workload e keeps only the stream)."""
        host, port = self.d.host_port
        reader, writer = await asyncio.open_connection(host, port, ssl=self.ctx, server_hostname=host)
        body = json.dumps(message).encode()
        writer.write(f"POST {self.endpoint} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {self.d.token}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                     .encode() + body)
        await writer.drain()
        status = await reader.readline()
        writer.close()
        if b" 202 " not in status:
            raise RuntimeError(f"POST: {status!r}")

    async def request(self, message: dict[str, Any]) -> Any:
        await self.post(message)
        return await asyncio.wait_for(self.messages.get(), 30)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.reader_task is not None:
            self.reader_task.cancel()


async def bounded(limit: int, coros: list[Any]) -> list[Any]:
    gate = asyncio.Semaphore(limit)

    async def one(c: Any) -> Any:
        async with gate:
            return await c

    return await asyncio.gather(*(one(c) for c in coros), return_exceptions=True)


async def one_round(d: Daemon, count: int, hold: float, settle: float) -> dict[str, Any]:
    ctx = d.ssl_context()
    sessions = [IdleSession(d, ctx) for _ in range(count)]
    before = snapshot(d)

    async def setup(s: IdleSession) -> None:
        await s.open()
        reply = await s.request(INIT)
        assert "result" in reply, reply
        await s.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    res = await bounded(32, [setup(s) for s in sessions])
    failed = [r for r in res if isinstance(r, BaseException)]
    await asyncio.sleep(1.0)
    loaded = snapshot(d)
    await asyncio.sleep(hold)
    held = snapshot(d)
    pings = await bounded(32, [s.request({"jsonrpc": "2.0", "id": 1, "method": "ping"}) for s in sessions])
    alive = sum(1 for p in pings if isinstance(p, dict) and p.get("result") == {})
    for s in sessions:
        s.close()
    settling = []
    for _ in range(int(settle * 2)):
        await asyncio.sleep(0.5)
        settling.append(snapshot(d)[0])
    after = snapshot(d)
    opened = count - len(failed)
    peak_front = max(loaded[0], held[0])
    return {"opened": opened, "alive": alive, "settling": settling, "failed": [repr(f)[:120] for f in failed[:3]], "before": before,
            "loaded": loaded, "held": held, "after": after,
            "front_kib_per_session": (peak_front - before[0]) / max(opened, 1),
            "tree_kib_per_session": (max(sum(loaded), sum(held)) - sum(before)) / max(opened, 1)}


async def main_async(d: Daemon, count: int, hold: float, rounds: int, settle: float) -> None:
    warm = IdleSession(d, d.ssl_context())  # the first session and the worker's start are not per-session costs
    await warm.open()
    await warm.request(INIT)
    await warm.request({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "files/read", "arguments": {"path": os.path.abspath(__file__)}}})
    warm.close()
    await asyncio.sleep(1.0)
    start = snapshot(d)
    print(f"start: front {start[0]} KiB, workers {start[1]} KiB ({len(process_tree(d.pid)) - 1} processes)")
    for n in range(rounds):
        r = await asyncio.wait_for(one_round(d, count, hold, settle), ROUND_DEADLINE)
        b, lo, h, a = r["before"], r["loaded"], r["held"], r["after"]
        print(f"round {n + 1}: opened {r['opened']}/{count}, alive after hold {r['alive']}, failures {r['failed']}")
        print(f"  front   KiB: before {b[0]}, loaded {lo[0]}, held {h[0]}, after close {a[0]} "
              f"({100 * a[0] / b[0]:.1f} % of before; {100 * a[0] / start[0]:.1f} % of start)")
        print(f"  front   KiB every 0.5 s after close: {r['settling']}")
        print(f"  workers KiB: before {b[1]}, loaded {lo[1]}, held {h[1]}, after close {a[1]}")
        print(f"  per idle session: front {r['front_kib_per_session']:.1f} KiB, "
              f"tree {r['tree_kib_per_session']:.1f} KiB")
        tree_before, tree_after = sum(b), sum(a)
        print(f"  tree after close: {100 * tree_after / tree_before:.1f} % of before the round")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=500)
    p.add_argument("--hold", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--settle", type=float, default=3.0, help="seconds after closing before the last RSS read")
    o = p.parse_args()
    if not (1 <= o.sessions <= 5000 and 1 <= o.rounds <= 10 and 0 <= o.hold <= 120 and 0.5 <= o.settle <= 60):
        p.error("--sessions 1..5000, --rounds 1..10, --hold 0..120, --settle 0.5..60")
    with tempfile.TemporaryDirectory() as tmp:
        d = start_daemon(Path(tmp) / "d", max_sessions=o.sessions + 10, max_sessions_per_principal=o.sessions + 10)
        try:
            asyncio.run(main_async(d, o.sessions, o.hold, o.rounds, o.settle))
        finally:
            stop_daemon(d)


if __name__ == "__main__":
    main()
