"""Reproducer (attack 14): a /mcp session is evicted as idle the moment its long request is
answered (idleness was counted from the request's start).

Real TLS daemon (tests.conftest.start_daemon): max_sessions 1, mcp_session_evict_seconds 1,
workers.timeout_seconds 2. Alice's read of a sparse file's far line runs 2 s (TIMEOUT); at once
bob opens a session at the full total. Exits 0 while the flaw is present (alice's session answers
404), 1 when it holds. Run: .venv/bin/python attacks14/evict_just_answered.py [TREE] (TREE: the source
tree whose mcpd to run, default this one; e.g. /work/main for the unfixed code).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

from _mcp import INIT, PING, headers  # (first: it puts the tree to run on the path)

import httpx  # noqa: E402

from tests.conftest import start_daemon, stop_daemon  # noqa: E402


async def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        sparse = Path(tmp) / "sparse.log"
        with open(sparse, "wb") as f:
            f.write(b"a\n" + b"b" * 9000)
            f.truncate(1 << 40)
        os.chmod(tmp, 0o755)
        d = start_daemon(Path(tmp) / "d", max_sessions=1, mcp_session_evict_seconds=1, workers={"timeout_seconds": 2})
        slow = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "files/read", "arguments": {"path": str(sparse), "start_line": 3}}}
        try:
            async with httpx.AsyncClient(base_url=d.url, verify=d.ssl_context(), timeout=30) as c:
                r = await c.post("/mcp", json=INIT, headers=headers(d.token))  # alice
                alice = r.headers["mcp-session-id"]
                r = await c.post("/mcp", json=slow, headers=headers(d.token, alice))
                print("alice's slow read:", r.status_code, r.text[:120])
                r = await c.post("/mcp", json=INIT, headers=headers(d.other_token))  # bob, at the full total
                print("bob's session:", r.status_code)
                r = await c.post("/mcp", json=PING, headers=headers(d.token, alice))
                print("alice's next request:", r.status_code)
                if r.status_code == 404:
                    print("FLAW: alice's session was evicted as idle right after its answer")
                    return 0
                return 1
        finally:
            stop_daemon(d)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
