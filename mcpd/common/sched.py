"""How mcpd's back processes are scheduled: the workers and the policy process ask the kernel for
``SCHED_BATCH`` (:func:`run_as_batch`); the front stays ``SCHED_OTHER``.

``SCHED_BATCH`` keeps a process's nice value and its share of the CPU; what changes is that its
wake-ups do not preempt the process that is running. A request the front sends to a worker or to
the policy process then does not cut the front off in the middle of its event loop: the front
finishes its turn (the ``202`` it was writing, the other sessions' work) while the back process
is woken on the other core or right after it. Measured on the 2-core benchmark machine
(interleaved rounds, ``docs/INTERNALS.md``, "Worker pool"): workers as batch gave +3 to +9 %
calls/s with 16 sessions and no change with one; the policy process as batch gave +9 % on
privileged reads with one session and no change with 16.
"""

from __future__ import annotations

import os


def run_as_batch() -> bool:
    """Schedule the calling thread (and the threads and processes it starts afterwards) as
    ``SCHED_BATCH``, at the nice value it has. Call it before starting threads: the policy applies
    to the calling thread only.

    Best effort: a kernel or sandbox that refuses the policy (``EPERM``, ``EINVAL``) leaves the
    process as it was, since scheduling is no part of what mcpd guarantees.

    Returns:
        whether the policy is in effect.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError:
        return False
    return True
