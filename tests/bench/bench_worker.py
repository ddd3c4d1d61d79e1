"""Benchmark: calls/s through the worker pool for a 4 KiB file (the per-account worker of docs/PRIVSEP.md).

Run: ``.venv/bin/python tests/bench/bench_worker.py [--calls N]``. Prints figures only; the
baseline is the same op run in-process (``mcpd.core.ops.run``), measured in the same run, so the
ratio shows what the process boundary costs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from mcpd.common import config
from mcpd.core import fileopen, ops
from mcpd.front.workers.pool import WorkerPool
from mcpd.front.workers.spawner import LocalSpawner


def baseline(path: str, calls: int, limits: config.ReadLimits) -> float:
    """In-process calls/s of the same op (no worker, no frames)."""
    ctx = ops.OpContext(limits=limits, open_file=fileopen.open_regular, open_dir=fileopen.open_directory)
    frame = {"id": 1, "op": "files/read", "args": {"path": path}}
    start = time.perf_counter()
    for _ in range(calls):
        reply = ops.run(frame, ctx)
        if not reply.get("ok"):
            raise SystemExit(f"baseline read failed: {reply}")
    return calls / (time.perf_counter() - start)


async def through_pool(path: str, calls: int, in_flight: int, cfg: config.Config) -> float:
    """Calls/s through a warmed pool with ``in_flight`` concurrent callers."""
    pool = WorkerPool(LocalSpawner(cfg.read), cfg)
    try:
        await asyncio.gather(*(pool.call("bench", "files/read", {"path": path}) for _ in range(in_flight)))
        remaining = calls

        async def caller() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await pool.call("bench", "files/read", {"path": path})

        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(in_flight)))
        return calls / (time.perf_counter() - start)
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000, help="calls per measurement")
    opts = parser.parse_args()
    cfg = config.from_dict({"workers": {"per_account": 4, "timeout_seconds": 30}})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "4k.txt"
        path.write_bytes((b"0123456789abcdef" * 4 + b"\n")[:64] * 64)  # 4096 bytes, 64-byte lines
        base = baseline(str(path), opts.calls, cfg.read)
        print(f"in-process baseline        : {base:9.0f} calls/s")
        for in_flight in (1, 4, 16):
            rate = asyncio.run(through_pool(str(path), opts.calls, in_flight, cfg))
            print(f"pool, {in_flight:2d} in flight (cpus={os.cpu_count()}): {rate:9.0f} calls/s  ratio {rate / base:.3f}")


if __name__ == "__main__":
    main()
