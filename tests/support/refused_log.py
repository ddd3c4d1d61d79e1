"""The daemon's log of refused requests, as the tests read it."""

from __future__ import annotations

import re
import time

from tests.conftest import Daemon

LINE_RE = re.compile(r"mcpd\.front\.refused: refused (\d{3}) (\S+) (\S+) from 127\.0\.0\.1:\d+: (.*)$")


def refused_lines(d: Daemon, count: int) -> list[tuple[int, str, str, str]]:
    """The daemon log's refusal lines, waiting (bounded) until there are ``count`` of them."""
    deadline = time.monotonic() + 10
    while True:
        found = [(int(m[1]), m[2], m[3], m[4]) for line in d.log().splitlines() if (m := LINE_RE.search(line))]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)
