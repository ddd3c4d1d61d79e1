"""Load benchmark: N sessions over the real TLS transport, M ``files/read`` calls each (issue 2).

Run: ``.venv/bin/python tests/bench/bench_load.py [--sessions 16] [--reads 200] [--size 4096]
[--transport sse|http]`` (``http``: Streamable HTTP at ``/mcp``, one POST answered per call).
Starts a real ``mcpd serve`` (``tests/conftest.py``'s ``start_daemon``: private CA, a token, a
free port on 127.0.0.1), opens the sessions with :class:`mcpd.client.api.Client`, and has each one
read a file of ``--size`` bytes ``--reads`` times, one call at a time per session, all sessions at
once. Every answer is checked against the file. Prints total calls/s and p50/p99/max latency in
milliseconds, plus a single-session baseline measured in the same run, so the figures can be read
as a ratio. Bounded: at most ``sessions * reads`` calls and a 300 s overall deadline. Not a test:
it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcpd.client.api import Client, text_of  # noqa: E402
from tests.conftest import start_daemon, stop_daemon  # noqa: E402

DEADLINE_SECONDS = 300.0


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_session(url: str, token: str, cacert: str, path: str, expected: str, reads: int,
                      transport: str) -> list[float]:
    """Open one session and make ``reads`` sequential reads; return each latency in seconds."""
    latencies: list[float] = []
    async with Client(url, token, cacert, timeout=60, transport=transport) as client:
        for _ in range(reads):
            start = time.perf_counter()
            result = await client.call_tool("files/read", {"path": path})
            latencies.append(time.perf_counter() - start)
            if text_of(result) != expected:
                raise RuntimeError("a read came back with the wrong content")
    return latencies


async def run(url: str, token: str, cacert: str, path: str, expected: str, transport: str, sessions: int,
              reads: int) -> tuple[list[float], float]:
    """All sessions at once; return the latencies and the wall time in seconds."""
    start = time.perf_counter()
    async with asyncio.timeout(DEADLINE_SECONDS):
        results = await asyncio.gather(
            *(one_session(url, token, cacert, path, expected, reads, transport) for _ in range(sessions))
        )
    return [x for r in results for x in r], time.perf_counter() - start


def report(label: str, latencies: list[float], wall: float) -> None:
    """Print one line of figures."""
    print(
        f"{label:<28} calls={len(latencies):>6}  calls/s={len(latencies) / wall:8.1f}  "
        f"p50={statistics.median(latencies) * 1000:7.2f} ms  p99={percentile(latencies, 0.99) * 1000:7.2f} ms  "
        f"max={max(latencies) * 1000:7.2f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--size", type=int, default=4096, help="file size in bytes (at most 10240)")
    parser.add_argument("--transport", choices=("sse", "http"), default="sse")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mcpd-bench-") as tmp:
        state = Path(tmp) / "state"
        target = Path(tmp) / "file.txt"
        line = "0123456789abcdef" * 4 + "\n"
        text = (line * (opts.size // len(line) + 1))[: opts.size]
        target.write_text(text)
        daemon = start_daemon(state)
        try:
            args = (daemon.url, daemon.token, str(daemon.cacert), str(target), text, opts.transport)
            asyncio.run(run(*args, 1, 20))  # warm-up: workers spawned, TLS and imports hot
            base, base_wall = asyncio.run(run(*args, 1, opts.reads))
            lat, wall = asyncio.run(run(*args, opts.sessions, opts.reads))
        finally:
            stop_daemon(daemon)
    name = {"sse": "SSE (/sse)", "http": "Streamable HTTP (/mcp)"}[opts.transport]
    print(f"mcpd load benchmark: {opts.size}-byte file, TLS + {name} on 127.0.0.1")
    report("baseline 1 session", base, base_wall)
    report(f"{opts.sessions} sessions x {opts.reads}", lat, wall)
    print(f"throughput ratio (loaded / baseline): {(len(lat) / wall) / (len(base) / base_wall):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
