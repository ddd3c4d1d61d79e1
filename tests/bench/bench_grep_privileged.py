"""Benchmark: privileged vs ordinary ``files/grep`` on the same tree, through the real privilege-separated daemon.

Run as root: ``.venv/bin/python tests/bench/bench_grep_privileged.py [--log-mb 64] [--gz-mb 16]
[--configs 20000] [--runs 3]``. Starts the daemon of ``tests/support/privsep_fixture.py`` (root
helper, front as ``mcpd``, workers as a test account), writes ``bench_grep.py``'s tree under its
``/srv`` folder, readable by the account (so both routes search the same files), grants the
account ``files/grep`` on it, and times, best of ``--runs``, the same calls on both routes: a rare
pattern over the whole tree, the first 1000 lines of a common one, and the config files alone.
The privileged route pays a walker, a grant decision per file, one root ``open`` per file and
the descriptors' passing in batches of 4. Prints seconds and the ratio; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcpd.client.api import Client  # noqa: E402
from tests.bench.bench_grep import COMMON, RARE, make_tree  # noqa: E402
from tests.support.osaccounts import AccountFactory  # noqa: E402
from tests.support.privsep_fixture import start_privsep, stop_privsep  # noqa: E402


async def timed(c: Client, args: dict[str, Any]) -> tuple[float, int, int]:
    start = time.perf_counter()
    res = await c.call_tool("files/grep", dict(args, time_budget_seconds=60), timeout=120)
    data = res["structuredContent"]
    assert "error" not in data, data
    return time.perf_counter() - start, len(data["matches"]), data["files_searched"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-mb", type=int, default=64, help="MiB of plain log text")
    parser.add_argument("--gz-mb", type=int, default=16, help="MiB of log text in .gz files")
    parser.add_argument("--configs", type=int, default=20000, help="small configuration files")
    parser.add_argument("--runs", type=int, default=3, help="runs of each measurement (the best is shown)")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_grep_privileged: needs root (starts the root helper, creates accounts)", file=sys.stderr)
        return 2
    factory = AccountFactory()
    d = None
    rows: list[tuple[str, tuple[float, int, int], tuple[float, int, int]]] = []
    try:
        d = start_privsep(factory, workers={"timeout_seconds": 120})
        root = d.srv / "tree"
        total = make_tree(root, opts.log_mb, opts.gz_mb, opts.configs)
        for p in [root, *root.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        rule = {"allowed": True, "paths": [str(root)]}
        d.write_grants({"users": {d.accounts["alice"].name: {"privileged": {"tools": {"files/grep": rule}}}}})
        time.sleep(1.5)  # the helper re-reads the grants file when it changes (SIGHUP sent too)

        async def measure() -> None:
            async with Client(d.url, d.tokens["alice"], d.cacert, timeout=120) as c:
                for privileged in (False, True):
                    await timed(c, {"pattern": "warm-up", "path": str(root / "etc"), "max_depth": 1,
                                    "privileged": privileged})
                for label, args in (
                    ("rare pattern, whole tree", {"pattern": RARE, "path": str(root), "max_matches": 1000}),
                    ("common pattern, first 1000", {"pattern": COMMON, "path": str(root), "max_matches": 1000}),
                    ("config files only", {"pattern": "listen = ", "path": str(root / "etc"), "max_matches": 1000}),
                ):
                    got: dict[bool, list[tuple[float, int, int]]] = {False: [], True: []}
                    for _ in range(opts.runs):  # interleaved: both routes see the same machine state
                        for privileged in (False, True):
                            got[privileged].append(await timed(c, dict(args, privileged=privileged)))
                    rows.append((label, min(got[False]), min(got[True])))

        asyncio.run(measure())
    finally:
        if d is not None:
            stop_privsep(d)
        factory.cleanup()
    print(f"tree: {opts.log_mb} MiB plain logs, {opts.gz_mb} MiB of log text in .gz, {opts.configs} config files "
          f"({total / (1 << 20):.0f} MiB of text); best of {opts.runs}")
    print(f"{'search':<28} {'ordinary s':>10} {'files':>6} {'privileged s':>12} {'files':>6} {'ratio':>6}")
    for label, (o, _, of), (p, _, pf) in rows:
        print(f"{label:<28} {o:>10.3f} {of:>6} {p:>12.3f} {pf:>6} {p / o if o else 0:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
