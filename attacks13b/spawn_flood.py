"""One valid token, no bound: a compromised front makes the root side start as many workers as
it likes (docs/PRIVSEP.md §2: workers are pooled per account, ``workers.per_account``).

Spawns 60 workers (bounded here) for bob with ``per_account: 4`` and prints how many started,
the policy process's descriptors before and after, and its descriptor limit: each worker costs it
two (pidfd and control socket), and each is a task of the helper's unit: a few hundred reach its
``TasksMax=512`` (shared by root, the policy's threads, walkers and every principal's workers), or
the policy's descriptor limit where the unit leaves systemd's default (1024), and every
principal's spawns, walks and new connections fail. Workers live outside the front's limits.
Fixed: a principal holding 4 x per_account workers gets no more (server.SPAWN_FACTOR).
Exits 0 when more than 4 x per_account started.
"""
import os
import sys

from _lib import as_front, daemon, stop
from tests.integration.test_attack13b import SPAWNS_OF, _children_of_policy

if __name__ == "__main__":
    d, factory = daemon()
    try:
        (policy,) = _children_of_policy(d)
        before = len(os.listdir(f"/proc/{policy}/fd"))
        replies = as_front(d, SPAWNS_OF.replace('print(json.dumps(replies))', 'print(json.dumps(replies), flush=True)\n'
                                                'time.sleep(3)'), *[d.tokens["bob"]] * 60)
        limit = [line for line in open(f"/proc/{policy}/limits") if line.startswith("Max open files")]
        print("spawned:", replies.count(True), "of", len(replies))
        print("policy descriptors before:", before, "(the count after the front closed them is lower again)")
        print("policy", limit[0].strip())
        sys.exit(0 if replies.count(True) > 16 else 1)
    finally:
        stop(d, factory)
