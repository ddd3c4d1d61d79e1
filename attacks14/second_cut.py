"""Reproducer (attack 14): the total outgoing budget's rule cuts a second, innocent principal.

When the total (``total_queue_bytes``) is passed, the principal holding the most is cut. An
answer being written (``PiecedAnswer``) is cut by dropping its connection; its bytes are released
only when its writer runs again. A charge arriving before that (another of the attacker's
connections falling behind) sees the first victim still "holding" them, cuts it again for nothing,
and then cuts the next largest holder, though the total is under the budget once the first cut's
bytes are released.

Driven on the daemon's own SessionManager (deterministic: on a daemon it depends on when the
dropped connection's writer next runs). Exits 0 while the flaw is present, 1 when it holds.
Run: .venv/bin/python attacks14/second_cut.py [TREE] (TREE: the source tree, e.g. /work/main).
"""

from __future__ import annotations

import sys
from pathlib import Path

TREE = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, TREE)

from mcpd.common.config import Config  # noqa: E402
from mcpd.front.protocol import Dispatcher  # noqa: E402
from mcpd.front.transport.sse import SessionManager  # noqa: E402

KIB = 1024


def main() -> int:
    m = SessionManager(Config(principal_queue_bytes=1024 * KIB, total_queue_bytes=120 * KIB),
                       Dispatcher(pool=None, privileged=None))  # type: ignore[arg-type]
    cut: list[str] = []
    m.hold_answer("victim1", 60 * KIB, lambda: cut.append("victim1"))  # a large answer, client slow
    m.hold_answer("victim2", 50 * KIB, lambda: cut.append("victim2"))
    attacker = lambda: cut.append("attacker")  # noqa: E731
    m.hold_answer("attacker", 20 * KIB, attacker)  # 130 KiB > 120: victim1 cut (fair: holds most)
    m.hold_answer("attacker", 5 * KIB, attacker)  # before victim1's writer released its 60 KiB
    print("cut:", cut)
    if "victim2" in cut:
        print("FLAW: victim2 was cut though the total is 75 KiB once victim1's cut bytes are released")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
