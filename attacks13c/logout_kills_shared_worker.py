"""Reproducer (run as root from the worktree): a logout kills the worker another token of the
same principal is using, so that token's call fails "worker crashed".

The scenario is
``tests/integration/test_attack13c.py::test_a_logout_does_not_kill_the_worker_serving_the_principals_other_token``
(the privilege-separated daemon, PAM logins): a login reads once, the static
token's session starts a read that takes seconds on that same worker, the login logs out, and the
policy process's revocation sweep kills the worker under the static token's call. This runs it
and prints what the call got and the sweep's ``kill`` record. Fixed: the front's pool serves a
call only with a worker its own token spawned, so the test passes (exit 1: no flaw shown).

Usage: .venv/bin/python attacks13c/logout_kills_shared_worker.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/integration/test_attack13c.py::test_a_logout_does_not_kill_the_worker_serving_the_principals_other_token"

if __name__ == "__main__":
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--runxfail", "-p", "no:cacheprovider", TEST],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    print("\n".join(line[:400] for line in out.stdout.splitlines() if line.startswith("E ")) or out.stdout[-800:])
    sys.exit(0 if out.returncode else 1)  # 0: the flaw shows
