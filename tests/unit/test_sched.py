"""The back processes' scheduling (mcpd.common.sched): SCHED_BATCH, same nice value, threads started
afterwards included. Run in a child process so the test run itself keeps its own policy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHILD = r"""
import os, threading
from mcpd.common import sched
os.nice(3)  # a nice value it had before: kept
before = os.getpriority(os.PRIO_PROCESS, 0)
assert os.sched_getscheduler(0) == os.SCHED_OTHER
assert sched.run_as_batch() is True
seen = []
t = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(threading.get_native_id())))
t.start(); t.join()
print(os.sched_getscheduler(0), seen[0], before, os.getpriority(os.PRIO_PROCESS, 0))
"""


def test_run_as_batch_keeps_the_nice_value_and_reaches_later_threads() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True)
    policy, thread_policy, before, after = map(int, out.stdout.split())
    assert policy == thread_policy == os.SCHED_BATCH
    assert before == after == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to an unprivileged account")
def test_a_policy_the_kernel_refuses_leaves_the_process_as_it_was() -> None:
    # An unprivileged SCHED_IDLE process whose RLIMIT_NICE allows no nice value may not leave
    # SCHED_IDLE: the kernel answers EPERM, and run_as_batch reports it instead of raising.
    child = r"""
import os, resource
from mcpd.common import sched
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)  # no CAP_SYS_NICE
print(sched.run_as_batch(), os.sched_getscheduler(0))
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", str(os.SCHED_IDLE)]
