"""Benchmark: unprivileged vs privileged reads of a 4 KiB file through the real daemon.

Run as root: ``.venv/bin/python tests/bench/bench_privileged.py [--calls N]``. Starts the
privilege-separated daemon of ``tests/support/privsep_fixture.py`` (helper as root, front as
``mcpd``, workers as a test account), then times N sequential ``files/read`` calls of the same
file on each route over one TLS session, after a warm-up. Prints median and p99 latency in
milliseconds and calls/s; asserts nothing about time. The privileged route pays a helper
connection, a token check, a grant decision and a fork per call; the unprivileged one a pooled
worker round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcpd.client.api import Client  # noqa: E402
from tests.support.osaccounts import AccountFactory  # noqa: E402
from tests.support.privsep_fixture import start_privsep, stop_privsep  # noqa: E402

WARMUP = 20


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(url: str, token: str, cacert: str, path: str, calls: int) -> dict[str, list[float]]:
    """Latencies in seconds per route, interleaved in blocks so both see the same machine state."""
    out: dict[str, list[float]] = {"unprivileged": [], "privileged": []}
    async with Client(url, token, cacert, timeout=60) as c:
        for privileged in (False, True):
            for _ in range(WARMUP):
                await c.call_tool("files/read", {"path": path, "privileged": privileged})
        block = 50
        for start in range(0, calls, block):
            for privileged, key in ((False, "unprivileged"), (True, "privileged")):
                for _ in range(min(block, calls - start)):
                    t0 = time.perf_counter()
                    await c.call_tool("files/read", {"path": path, "privileged": privileged})
                    out[key].append(time.perf_counter() - t0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per route (default 1000)")
    ns = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_privileged: needs root (starts the root helper, creates accounts)", file=sys.stderr)
        return 2
    factory = AccountFactory()
    d = None
    try:
        d = start_privsep(factory)
        target = d.srv / "bench.txt"
        target.write_text(("x" * 63 + "\n") * 64)  # 4096 bytes, readable by the account too
        os.chmod(target, 0o644)
        grants = d.default_grants()
        for rule in grants["users"][d.accounts["alice"].name]["privileged"]["tools"].values():
            rule["paths"].append(str(target))
        d.write_grants(grants)
        time.sleep(1.0)  # the helper polls for the change; SIGHUP was sent too
        lat = asyncio.run(measure(d.url, d.tokens["alice"], d.cacert, str(target), ns.calls))
    finally:
        if d is not None:
            stop_privsep(d)
        factory.cleanup()
    print(f"files/read of a 4 KiB file, {ns.calls} calls per route, one TLS session, sequential")
    for key, values in lat.items():
        med, p99 = statistics.median(values) * 1000, percentile(values, 0.99) * 1000
        print(f"  {key:13s} median {med:7.2f} ms   p99 {p99:7.2f} ms   {len(values) / sum(values):7.1f} calls/s")
    ratio = statistics.median(lat["privileged"]) / statistics.median(lat["unprivileged"])
    print(f"  privileged / unprivileged median: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
