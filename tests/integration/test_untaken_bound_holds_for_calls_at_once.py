"""The untaken-descriptor bound holds for calls at once.

The policy process checks a principal's untaken count before root's open and passes the
descriptor after it; calls running at once on fresh workers must not all pass one check (each
counts in ``State.passing`` meanwhile). Played as ``test_account_boundary.py`` plays a compromised
worker (root copies a hardened worker's sockets, stops it, and hands the control socket to a
process of alice's account that peeks at each call and reports it done), and as the front's four
parallel privileged reads on the principal's four pool workers (``workers.per_account`` 4).
"""

from __future__ import annotations

import json
import socket

from tests.integration.test_account_boundary import COLLECT, as_account, as_front, daemon, stop, take_over  # noqa: F401
from mcpd.policy.server import UNTAKEN_MAX

PARALLEL = 4  # the front's pool: workers.per_account of the principal, each with a call at once

# As the front: spawns argv[4] workers for token argv[2], prints their pids, waits for a line on
# stdin; reads argv[3] privileged on the first UNTAKEN_MAX - 1 of them one after another, then on
# the others at once (one connection each, as the front's call connections are); prints the oks.
RACE = r"""
import threading
token, path, n, first = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
h = conn(sys.argv[1])
rid, pids, keep = 0, [], []
while len(pids) < n:
    rid += 1
    send(h, {"type": "spawn_worker", "id": rid, "token": token})
    rep, fds = recv(h)
    if not rep.get("ok"):
        err = rep.get("error") or {}
        if err.get("code") == "RATE_LIMITED":
            time.sleep(float((err.get("details") or {}).get("retry_after_seconds") or 0.2)); continue
        print(json.dumps({"spawn_error": err}), flush=True); sys.exit(0)
    pids.append(rep["pid"]); keep += fds
print(json.dumps(pids), flush=True)
sys.stdin.readline()
def call(c, pid, i):
    send(c, {"type": "privileged_call", "id": 1000 + i, "token": token, "session": "s", "peer": "p",
             "op": "files/read", "args": {"path": path, "privileged": True}, "worker": pid, "rid": 1000 + i})
    rep = recv(c)[0]
    return True if rep.get("ok") else rep.get("error")
seq = [call(h, pid, i) for i, pid in enumerate(pids[:first])]
conns = [conn(sys.argv[1]) for _ in pids[first:]]
par = [None] * len(conns)
go = threading.Barrier(len(conns))
def run(j):
    go.wait()
    par[j] = call(conns[j], pids[first + j], 100 + j)
ts = [threading.Thread(target=run, args=(j,)) for j in range(len(conns))]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps({"sequential": seq, "parallel": par}), flush=True)
sys.stdin.readline()
"""


def test_parallel_first_calls_cannot_leave_more_than_the_bound_untaken(daemon) -> None:  # noqa: F811
    """Rule (docs/PRIVSEP.md, "Sends that wait for nobody"): a principal with UNTAKEN_MAX (4)
    sockets holding untaken descriptors gets no more. Attack: alice's account holds 3, then four
    parallel privileged reads on four fresh workers (before the fix every one saw 3 and was
    passed: 7 left in flight). By the rule at most one of the four is served."""
    d = daemon
    first = UNTAKEN_MAX - 1
    n = first + PARALLEL
    ours, theirs = socket.socketpair()
    collector = as_account(d, "alice", COLLECT, str(theirs.fileno()), pass_fds=(theirs.fileno(),))
    theirs.close()
    front = as_front(d, RACE, d.tokens["alice"], str(d.log_file), str(n), str(first))
    assert front.stdin is not None and front.stdout is not None
    try:
        pids = json.loads(front.stdout.readline())
        assert isinstance(pids, list), pids
        for pid in pids:
            front_end, ctl = take_over(pid)
            os_close(front_end)
            socket.send_fds(ours, [b"c"], [ctl])
            os_close(ctl)
        front.stdin.write("go\n")
        front.stdin.flush()
        got = json.loads(front.stdout.readline())
    finally:
        stop(front)
        assert collector.stdin is not None and collector.stdout is not None
        collector.stdin.close()
        held = collector.stdout.readline()
        collector.wait(timeout=30)
        collector.stdout.close()
        if collector.stderr is not None:
            collector.stderr.close()
        ours.close()
    print("collector:", held, "calls:", got)
    assert got["sequential"] == [True] * first, got
    served = sum(1 for x in got["parallel"] if x is True)
    assert first + served <= UNTAKEN_MAX, f"{first + served} descriptors left untaken by one principal: {got}"


def os_close(fd: int) -> None:
    import os
    os.close(fd)
