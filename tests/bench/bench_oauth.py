"""OAuth access tokens against static tokens: the same reads, one session each, on the real
privilege-separated daemon (root), interleaved rounds so both see the same machine.

Prints reads per second and the median latency for a static token and for an RS256 OAuth token
of an issuer of test keys (tests/support/jwtkeys.py), and their ratio; decides nothing.

    sudo .venv/bin/python tests/bench/bench_oauth.py --reads 300 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcpd.client.api import Client  # noqa: E402
from tests.support.jwtkeys import ISSUER, TestIssuer  # noqa: E402
from tests.support.osaccounts import AccountFactory, ensure_user  # noqa: E402
from tests.support.privsep_fixture import start_privsep, stop_privsep  # noqa: E402

RESOURCE = "https://files.bench.example/mcp"


async def reads(url: str, token: str, cacert: str, path: str, count: int) -> list[float]:
    """``count`` files/read calls on one session; each call's seconds."""
    out = []
    async with Client(url, token, cacert, timeout=30) as c:
        for _ in range(count):
            t = time.perf_counter()
            res = await c.call_tool("files/read", {"path": path}, check=False)
            out.append(time.perf_counter() - t)
            if res.get("isError"):
                raise RuntimeError(f"read failed: {res}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=300, help="reads per session and round (1..5000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (1..20)")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (root helper, OS accounts)", file=sys.stderr)
        return 2
    reads_n, rounds = max(1, min(opts.reads, 5000)), max(1, min(opts.rounds, 20))
    factory = AccountFactory()
    jwks_dir = Path(f"/tmp/mcpd-bench-jwks-{secrets.token_hex(4)}")
    jwks_dir.mkdir(mode=0o755)
    os.chmod(jwks_dir, 0o755)
    d = None
    try:
        password = secrets.token_urlsafe(12)
        acct = factory.user(password=password)
        ensure_user(acct.name, password=password)
        idp = TestIssuer(jwks_dir / "corp.json", audience=RESOURCE)
        oauth = {"resource": RESOURCE, "issuers": [{"name": "corp", "issuer": ISSUER,
                                                     "jwks_file": str(jwks_dir / "corp.json"),
                                                     "audiences": [RESOURCE], "accounts": [acct.name]}]}
        d = start_privsep(factory, oauth=oauth)
        target = Path(acct.home, "bench.txt")
        target.write_text("x" * 1024)
        os.chown(target, acct.uid, acct.gid)
        os.chmod(target, 0o644)
        oauth_token = idp.token(acct.name, exp=int(time.time()) + 3600)
        figures: dict[str, list[float]] = {"static": [], "oauth": []}
        tokens = [("static", d.tokens["alice"]), ("oauth", oauth_token)]
        for _, token in tokens:  # warm-up: workers started, caches filled
            asyncio.run(reads(d.url, token, d.cacert, str(target), 20))
        for i in range(rounds):
            for kind, token in tokens if i % 2 == 0 else tokens[::-1]:  # alternate who goes first
                figures[kind] += asyncio.run(reads(d.url, token, d.cacert, str(target), reads_n))
        rate = {k: len(v) / sum(v) for k, v in figures.items()}
        for kind, times in figures.items():
            print(f"{kind:<7} {rate[kind]:8.1f} reads/s  median {statistics.median(times) * 1000:6.2f} ms  "
                  f"p95 {sorted(times)[int(len(times) * 0.95) - 1] * 1000:6.2f} ms  ({len(times)} reads)")
        print(f"oauth / static: {rate['oauth'] / rate['static']:.3f}")
    finally:
        if d is not None:
            stop_privsep(d)
        factory.cleanup()
        shutil.rmtree(jwks_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
