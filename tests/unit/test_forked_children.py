"""Root's one way to fork (:func:`mcpd.helper.forkserver.forked`): a child never returns into its
parent's code, whether its function raises or returns. Run in a fresh interpreter with one
thread, as root forks (the test runner may hold threads)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = r"""
import json, os
from mcpd.helper.forkserver import forked

read, write = os.pipe()

def raises():
    os.write(write, b"r")
    raise RuntimeError("a failed exec, say")

def returns():
    os.write(write, b"n")

pids = [forked(raises), forked(returns), forked(returns, code=0)]
os.write(write, b"p")  # a child that went on past forked() would write this a second time
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
os.close(write)
print(json.dumps({"codes": codes, "written": sorted(os.read(read, 100).decode())}))
"""


def test_a_child_exits_with_its_code_whatever_its_function_does() -> None:
    """A child exits ``code`` (127 unless told) when its function returns or raises, and runs
    nothing of its parent's code after the fork: only the parent writes ``p``."""
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"codes": [127, 127, 0], "written": sorted("rnnp")}
