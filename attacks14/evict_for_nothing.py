"""Reproducer (attack 14): a principal at its own session cap, asking for one more session while
max_sessions is full, gets another principal's idle /mcp session closed and is refused anyway.

Real TLS daemon (tests.conftest.start_daemon): max_sessions 2, max_sessions_per_principal 1,
mcp_session_evict_seconds 1. Exits 0 while the flaw is present (bob's session answers 404),
1 when it holds. Run: .venv/bin/python attacks14/evict_for_nothing.py [TREE] (TREE: the source
tree whose mcpd to run, default this one; e.g. /work/main for the unfixed code).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from _mcp import INIT, PING, headers  # (first: it puts the tree to run on the path)

import httpx  # noqa: E402

from tests.conftest import start_daemon, stop_daemon  # noqa: E402


async def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        d = start_daemon(Path(tmp) / "d", max_sessions=2, max_sessions_per_principal=1, mcp_session_evict_seconds=1)
        try:
            async with httpx.AsyncClient(base_url=d.url, verify=d.ssl_context(), timeout=10) as c:
                r = await c.post("/mcp", json=INIT, headers=headers(d.other_token))  # bob
                bob = r.headers["mcp-session-id"]
                await asyncio.sleep(1.5)  # bob's client idles
                r = await c.post("/mcp", json=INIT, headers=headers(d.token))  # alice: her one session
                assert r.status_code == 200, r.text
                r = await c.post("/mcp", json=INIT, headers=headers(d.token))  # alice: one more
                print("alice's second session:", r.status_code)
                r = await c.post("/mcp", json=PING, headers=headers(d.other_token, bob))
                print("bob's next request:", r.status_code)
                if r.status_code == 404:
                    print("FLAW: bob's session was evicted for a session that was refused")
                    return 0
                return 1
        finally:
            stop_daemon(d)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
