"""Reproducer (fixed in 108c5e1): bytes a stream's client already took stayed charged against its
principal's and the total outgoing budget once the keep-alive comment was the stream's next write.

Replays the scenario of ``tests/unit/test_outgoing_bytes.py::
test_a_stream_its_client_caught_up_on_is_released_by_its_keep_alive_comment`` on the real
SessionManager: a 2 MiB answer the client was behind on, the client reads it all, the ticker's
``: ping`` goes out; prints what is still charged (before the fix: about 2 MiB, for as long as the
session idled) and whether alice's second session survives her next 2 MiB answer (budget 3 MiB).

Usage: .venv/bin/python attacks13c/stale_charge_after_ping.py
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.unit.test_outgoing_bytes import two_streams  # noqa: E402


async def main() -> None:  # noqa: D103
    m, first, second, conns, message = two_streams()
    first.send(message)
    conns[0].read()
    m.keep_alive(now=first.last_write + 5)  # the comment is due
    conns[0].read()
    m.keep_alive(now=first.last_write + 1)
    stale = m.outgoing.total
    second.send(message)
    print(json.dumps({"charged_after_the_client_read_everything": stale, "second_session_closed": second.closed}))
    m.close_all()


if __name__ == "__main__":
    asyncio.run(main())
