"""Reproducer (fixed): each session-era POST event stream whose client leaves before its reply
left the reply's size charged to its principal's and the total outgoing budget for good.

Posts N batches (a read that takes a second or so, then a 6 MiB read; a progress token, so the
answer is an event stream), each on a connection its client closes once the stream's headers
came; prints ``mcpd_outgoing_bytes`` after each (before the fix: about 6 MiB more each time,
never released; about 21 fill a principal's 128 MiB, about 85 the total 512 MiB).

Usage: .venv/bin/python attacks13c/abandoned_post_streams.py [N]   (default 3; dev daemon, loopback)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import start_daemon, stop_daemon  # noqa: E402
from tests.integration.test_attack13c import abandoned_post_stream  # noqa: E402
from tests.integration.test_metrics import free_port  # noqa: E402
from tests.integration.test_outgoing_budgets import Metrics, answer_file, session_of  # noqa: E402


def main(n: int) -> None:  # noqa: D103
    tmp = Path(tempfile.mkdtemp(prefix="mcpd-13c-"))
    port = free_port()
    d = start_daemon(tmp / "d", metrics_listen=f"127.0.0.1:{port}")
    try:
        big, m = answer_file(tmp), Metrics(port)
        with httpx.Client(verify=d.ssl_context(), timeout=60) as c:
            sid = session_of(d, c)["Mcp-Session-Id"]
        for k in range(n):
            abandoned_post_stream(d, sid, big, k)
            print(json.dumps({"abandoned": k + 1, "outgoing_bytes": m.outgoing()}), flush=True)
    finally:
        stop_daemon(d)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
