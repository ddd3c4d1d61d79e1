"""What the front pays, in-process, to parse a POST body (``parse_json``) with and without the
hook that tells a number's exact text from its float (``json_float``, which makes an id such as
``9007199254740993.0`` invalid rather than answered as ``9007199254740992.0``), for the usual
bodies and for bodies full of numbers with a fraction.

    .venv/bin/python tests/bench/bench_envelope.py [--number 5000] [--repeat 30]

"plain" parses as the front did before the hook (the same parser, floats made by ``float``);
"hook" is what ``parse_json`` does now. The two run interleaved, in one process, and the best of
``--repeat`` runs of each is printed, per body. No daemon, no network. Compare figures within one
run (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import timeit
from collections.abc import Callable
from typing import Any

from mcpd.common import frames
from mcpd.front.transport import body as body_module
from mcpd.front.transport.body import parse_json

CALL = {"jsonrpc": "2.0", "id": 17, "method": "tools/call",
        "params": {"name": "files/read", "arguments": {"path": "/var/log/syslog", "start_line": 100,
                                                       "end_line": 200}}}
SMALL = {
    "tools/call, integer id": json.dumps(CALL).encode(),
    "tools/call, string id": json.dumps({**CALL, "id": "c0ffee-17"}).encode(),
    "tools/call, float id 17.5": json.dumps({**CALL, "id": 17.5}).encode(),
    "tools/call, id 9007199254740993.0": json.dumps(CALL).replace('"id": 17', '"id": 9007199254740993.0').encode(),
    "files/find, time_budget_seconds 2.5": json.dumps({**CALL, "params": {"name": "files/find", "arguments": {
        "path": "/var/log", "name": "*.log", "time_budget_seconds": 2.5}}}).encode(),
    "batch of 256 pings": json.dumps([{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(256)]).encode(),
}
BIG = {  # about 1 MiB each
    "1 MiB of 0.25 (shortest forms)": b"[" + b",".join([b"0.25"] * 200_000) + b"]",
    "1 MiB of 1E2 (exponent forms)": b"[" + b",".join([b"1E2"] * 250_000) + b"]",
    "1 MiB of 0.30000000000000004": b"[" + b",".join([b"0.30000000000000004"] * 52_000) + b"]",
    "1 MiB of 1.00000000000000000001 (inexact)": b"[" + b",".join([b"1.00000000000000000001"] * 45_000) + b"]",
    "1 MiB of integers": b"[" + b",".join([b"1234"] * 200_000) + b"]",
}


def plain(data: bytes) -> Any:
    """The parse as it was before the hook (same parser and checks, floats by ``float``)."""
    return frames.loads(data, parse_constant=body_module._reject_constant)


def best_pair(a: Callable[[], Any], b: Callable[[], Any], number: int, repeat: int) -> tuple[float, float]:
    """Best seconds per call of ``a`` and of ``b``, their runs interleaved."""
    ta, tb = [], []
    for _ in range(repeat):
        ta.append(timeit.timeit(a, number=number) / number)
        tb.append(timeit.timeit(b, number=number) / number)
    return min(ta), min(tb)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--number", type=int, default=5000, help="calls per run for the small bodies")
    ap.add_argument("--repeat", type=int, default=30, help="runs of each; the best is printed")
    a = ap.parse_args()
    print(f"{'body':45s} {'bytes':>8s} {'plain':>10s} {'hook':>10s} {'ratio':>6s}")
    for name, data in SMALL.items():
        p, h = best_pair(lambda: plain(data), lambda: parse_json(data), a.number, a.repeat)
        print(f"{name:45s} {len(data):8d} {p * 1e6:8.2f}us {h * 1e6:8.2f}us {h / p:6.2f}")
    for name, data in BIG.items():
        p, h = best_pair(lambda: plain(data), lambda: parse_json(data), 1, max(3, a.repeat // 5))
        print(f"{name:45s} {len(data):8d} {p * 1e3:8.1f}ms {h * 1e3:8.1f}ms {h / p:6.2f}")


if __name__ == "__main__":
    main()
