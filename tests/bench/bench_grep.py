"""Benchmark: ``files/grep`` over real TLS against GNU ``grep -rn`` on the same generated tree.

Run: ``.venv/bin/python tests/bench/bench_grep.py [--log-mb 64] [--gz-mb 32] [--configs 20000]
[--runs 3]``. Generates a tree in a temporary folder: ``--log-mb`` MiB of plain log files (8 MiB
each), ``--gz-mb`` MiB of log text in ``.gz`` files, and ``--configs`` small configuration files
(20 to 40 lines, 100 per folder). Starts a real ``mcpd serve`` (``tests/conftest.py``'s
``start_daemon``) and times, best of ``--runs``:

* a rare pattern (a few lines in the whole tree): one ``files/grep`` call that searches
  everything, against ``grep -rn`` (which skips the ``.gz`` files as binary) plus ``zgrep -n``
  over the ``.gz`` files (what it takes GNU tools to search the same text);
* a common pattern: the first page of 1000 matches (``max_matches: 1000``), against
  ``grep -rn ... | head -1000``;
* the configuration files alone (a rare pattern over ``--configs`` small files).

Where ``rg`` (ripgrep) is installed, each search is also timed with it (``rg -n``, with
``--search-zip`` for the rare pattern so it reads the ``.gz`` files too). Prints a table of seconds and MiB/s; asserts nothing about time. Bounded by the tool's own
60 s budget per call and the generated sizes; the defaults take about a minute or two.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcpd.client.api import Client  # noqa: E402
from tests.conftest import start_daemon, stop_daemon  # noqa: E402

RARE, COMMON = "kernel: oom-killer invoked", "GET /api"
LOG_FILE_MB = 8
RG = shutil.which("rg")


def log_lines(rng: random.Random, size: int) -> bytes:
    """About ``size`` bytes of access-log-like lines; every 200,000th holds the rare pattern."""
    out, n = [], 0
    while n < size:
        i = rng.randrange(1 << 30)
        line = (f"2026-05-0{i % 9 + 1}T12:{i % 60:02}:{i % 59:02}Z host{i % 17} "
                + (RARE if i % 200_000 == 0 else f"{'GET' if i % 3 else 'POST'} /api/v{i % 4}/items/{i} "
                   f"{200 + i % 5} {i % 9000}b ua=client/{i % 13}") + "\n").encode()
        out.append(line)
        n += len(line)
    return b"".join(out)


def make_tree(root: Path, log_mb: int, gz_mb: int, configs: int) -> int:
    """Write the tree; returns the bytes of text it holds (decompressed)."""
    rng = random.Random(7)
    total = 0
    logs = root / "var" / "log"
    logs.mkdir(parents=True)
    for i in range(max(log_mb // LOG_FILE_MB, 1) if log_mb else 0):
        data = log_lines(rng, LOG_FILE_MB << 20)
        (logs / f"access.log.{i}").write_bytes(data)
        total += len(data)
    for i in range(max(gz_mb // LOG_FILE_MB, 1) if gz_mb else 0):
        data = log_lines(rng, LOG_FILE_MB << 20)
        (logs / f"access.log.{i}.gz").write_bytes(gzip.compress(data, 1))
        total += len(data)
    etc = root / "etc"
    for i in range(configs):
        d = etc / f"svc{i // 100:03}"
        if i % 100 == 0:
            d.mkdir(parents=True)
        text = "".join(f"option_{j} = value{rng.randrange(1000)}\n" for j in range(rng.randrange(20, 40)))
        if i % 5000 == 1:
            text += "listen = 0.0.0.0:31337\n"
        (d / f"unit{i}.conf").write_text(text)
        total += len(text)
    return total


async def tool(client: Client, args: dict[str, Any]) -> tuple[float, int]:
    start = time.perf_counter()
    res = await client.call_tool("files/grep", dict(args, time_budget_seconds=60), timeout=120)
    data = res["structuredContent"]
    return time.perf_counter() - start, len(data["matches"])


def shell(cmd: str) -> tuple[float, int]:
    start = time.perf_counter()
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, check=False).stdout
    return time.perf_counter() - start, out.count(b"\n")


def best(runs: int, fn: Any) -> tuple[float, int]:
    results = [fn() for _ in range(runs)]
    return min(r[0] for r in results), results[0][1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-mb", type=int, default=64, help="MiB of plain log text")
    parser.add_argument("--gz-mb", type=int, default=32, help="MiB of log text in .gz files")
    parser.add_argument("--configs", type=int, default=20000, help="small configuration files")
    parser.add_argument("--runs", type=int, default=3, help="runs of each measurement (the best is shown)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-grep-") as tmp:
        root = Path(tmp) / "tree"
        total = make_tree(root, opts.log_mb, opts.gz_mb, opts.configs)
        os.chmod(tmp, 0o755)
        daemon = start_daemon(Path(tmp) / "state", workers={"timeout_seconds": 120})
        try:
            async def measure() -> list[tuple[str, tuple[float, int], tuple[float, int]]]:
                async with Client(daemon.url, daemon.token, daemon.cacert, timeout=120) as c:
                    await tool(c, {"pattern": "warm-up", "path": str(root / "etc"), "max_depth": 1})
                    rows = []
                    for label, args, cmd, rg_cmd in (
                        ("rare pattern, whole tree", {"pattern": RARE, "path": str(root), "max_matches": 1000},
                         f"grep -rn '{RARE}' {root}; zgrep -n '{RARE}' {root}/var/log/*.gz",
                         f"rg -n --search-zip '{RARE}' {root}"),
                        ("common pattern, first 1000", {"pattern": COMMON, "path": str(root), "max_matches": 1000},
                         f"grep -rn '{COMMON}' {root} | head -1000", f"rg -n '{COMMON}' {root} | head -1000"),
                        ("config files only", {"pattern": "listen = ", "path": str(root / "etc"),
                                               "max_matches": 1000}, f"grep -rn 'listen = ' {root}/etc",
                         f"rg -n 'listen = ' {root}/etc"),
                    ):
                        ours = [await tool(c, args) for _ in range(opts.runs)]
                        rows.append((label, (min(o[0] for o in ours), ours[0][1]), best(opts.runs, lambda: shell(cmd)),
                                     best(opts.runs, lambda: shell(rg_cmd)) if RG else None))
                    return rows

            rows = asyncio.run(measure())
        finally:
            stop_daemon(daemon)
            shutil.rmtree(root, ignore_errors=True)
    mib = total / (1 << 20)
    print(f"tree: {opts.log_mb} MiB plain logs, {opts.gz_mb} MiB of log text in .gz, {opts.configs} config files "
          f"({mib:.0f} MiB of text); best of {opts.runs}")
    head = f"{'search':<28} {'files/grep s':>12} {'lines':>7} {'GNU grep s':>11} {'lines':>7} {'ratio':>6}"
    print(head + (f" {'rg s':>8} {'lines':>7} {'ratio':>6}" if RG else "  (rg not installed)"))
    for label, (ours, n), (gnu, m), rg in rows:
        line = f"{label:<28} {ours:>12.3f} {n:>7} {gnu:>11.3f} {m:>7} {ours / gnu if gnu else 0:>6.2f}"
        if rg is not None:
            line += f" {rg[0]:>8.3f} {rg[1]:>7} {ours / rg[0] if rg[0] else 0:>6.2f}"
        print(line)
    print(f"files/grep over the whole tree: {mib / rows[0][1][0]:.0f} MiB/s of text")


if __name__ == "__main__":
    main()
