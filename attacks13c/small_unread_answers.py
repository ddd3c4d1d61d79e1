"""Reproducer: /mcp answers up to one piece (256 KiB) that their client never reads are held by
the front outside every outgoing budget (``mcpd_outgoing_bytes`` stays 0), one per connection,
for as long as the client keeps its connection: the connection caps (1024 per address, 4096 in
all) are the only bound, about 1 GiB of a budget of 512 MiB.

Usage: python attacks13c/small_unread_answers.py [CONNECTIONS]   (default 150; dev daemon, loopback)
Prints the front's RSS growth, the gauge, and whether the connections are still held 8 s later
(past connections.idle_seconds).

Fixed: an answer over 64 KiB, once written, is charged what its connection still holds (the
kernel's send queue included) until it holds no more; the gauge now shows about 250 KiB per
connection, and past principal_queue_bytes (about 530 such connections at 128 MiB) the newest
are dropped (600: the gauge stays just under 128 MiB, the rest are cut). Still exits 0: it prints.
The front's RSS per held connection (about 520 KiB) stays about twice what is charged (the TLS
layer's buffers keep their size): the budget bounds it, at that ratio.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import start_daemon, stop_daemon, tree_rss_kib
from tests.integration.test_metrics import free_port, samples
from tests.integration.test_attack13c import SMALL_ANSWER, stalled_small_answer
from tests.integration.test_stream_takeover_attacks import Raw, server_connections
from tests.integration.test_streamable_modern import headers as modern_headers
from tests.integration.test_streamable_modern import request as modern_request

WAIT = float(sys.argv[2]) if len(sys.argv) > 2 else 8.0  # seconds to wait before counting the held connections


def main(n: int) -> dict[str, float]:  # noqa: D103
    state = Path(tempfile.mkdtemp(prefix="mcpd-13c-"))
    port = free_port()
    d = start_daemon(state / "d", metrics_listen=f"127.0.0.1:{port}")
    raws: list[Raw] = []
    try:
        path = state / "quarter.txt"
        path.write_bytes((b"y" * 1023 + b"\n") * (SMALL_ANSWER // 1024))
        state.chmod(0o755)
        with httpx.Client(verify=d.ssl_context(), timeout=30, headers=d.auth()) as c:  # warm up
            m = modern_request("tools/call", {"name": "files/read", "arguments": {"path": str(path), "limit": 10}}, 0)
            c.post(d.url + "/mcp", json=m, headers=modern_headers(d, m))
        time.sleep(1)
        before = tree_rss_kib(d.pid)
        for i in range(n):
            raws.append(stalled_small_answer(d, path, i + 1))
        time.sleep(1)
        after = tree_rss_kib(d.pid)
        gauge = samples(httpx.get(f"http://127.0.0.1:{port}/metrics").text)[("mcpd_outgoing_bytes", ())]
        time.sleep(WAIT)  # past connections.idle_seconds (5 s)
        held = sum(server_connections(d, r.port) for r in raws)
        out = {"connections": n, "rss_growth_mib": round((after - before) / 1024, 1),
               "per_connection_kib": round((after - before) / max(n, 1), 1), "outgoing_bytes_gauge": gauge,
               "still_held_after_idle": held}
        print(json.dumps(out))
        return out
    finally:
        for r in raws:
            r.sock.close()
        stop_daemon(d)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 150)
