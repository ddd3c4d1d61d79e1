"""Reproducer: four principals stalling just within their own outgoing budgets fill the total
budget, and every other principal's large answer is then cut (dev daemon on loopback).

Scale: principal_queue_bytes 7 MiB, total_queue_bytes 28 MiB (the defaults' 1:4). alice, carol,
dave and erin each stall one 6 MiB answer on an /sse stream that reads nothing; bob reads a 6 MiB
answer steadily (64 KiB receive buffer). Prints the bytes bob got and what the log says.

Usage: .venv/bin/python attacks13c/total_budget_weapon.py

Fixed: past the total, the principal holding the most gives up what it holds (the one charging
when none other holds more); bob now gets his whole answer (``bob_got_bytes`` about 6.3 MB) and
``total_cut_logged`` names a staller's cut. Still exits 0: it prints.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import start_daemon, stop_daemon  # noqa: E402
from tests.integration.test_attack13c import add_dev_principals, post_raw  # noqa: E402
from tests.integration.test_metrics import free_port  # noqa: E402
from tests.integration.test_outgoing_budgets import (  # noqa: E402
    MIB, Metrics, answer_ends, answer_file, stall, stateless_read,
)
from tests.integration.test_stream_takeover_attacks import Raw  # noqa: E402


def main() -> None:  # noqa: D103
    tmp = Path(tempfile.mkdtemp(prefix="mcpd-13c-"))
    port = free_port()
    d = start_daemon(tmp / "d", metrics_listen=f"127.0.0.1:{port}", principal_queue_bytes=7 * MIB,
                     total_queue_bytes=28 * MIB)
    streams: list[Raw] = []
    try:
        big, m = answer_file(tmp), Metrics(port)
        tokens = {"alice": d.token, **add_dev_principals(d, ["carol", "dave", "erin"])}
        with httpx.Client(verify=d.ssl_context(), timeout=60) as c:
            for token in tokens.values():
                streams.append(stall(d, c, big, 1, token=token, m=m)[0])
            held = m.outgoing()
            bob = post_raw(d, *stateless_read(d, big, 7, d.other_token), 64 * 1024)
            streams.append(bob)
            status, whole = answer_ends(bob)
        print(json.dumps({"stalled_held_bytes": held, "bob_status": status, "bob_got_bytes": len(whole),
                          "total_cut_logged": "over total_queue_bytes" in d.log()}))
    finally:
        for s in streams:
            s.close()
        stop_daemon(d)


if __name__ == "__main__":
    main()
