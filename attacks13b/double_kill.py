"""Several kill_worker requests for one worker at once, from a compromised front holding the
principal's token. Before the fix, ``server.kill_worker`` popped the worker from the table but
closed its pidfd whether or not it was the one that popped it (and ``reap`` likewise), so two
requests that both passed ``_bound_worker`` (or one racing the reaper) closed one descriptor
number twice: the second close fails (EBADF: INTERNAL_ERROR) or, when another thread was handed
that number in between, closes someone else's descriptor (another principal's worker socket, a
kept file, a connection). The window is a few microseconds under the GIL: this loop seldom hits
it; the unit test ``test_a_worker_is_forgotten_once_however_many_ask`` checks the fix directly.
Exits 0 when a double close showed (an INTERNAL_ERROR reply or two kill records for one pid).
"""
import sys

from _lib import as_front, daemon, dump, stop

CODE = r"""
token, rounds = sys.argv[2], int(sys.argv[3])
out = []
for r in range(rounds):
    s = [conn(sys.argv[1]) for _ in range(4)]
    send(s[0], {"type": "spawn_worker", "id": 1, "token": token})
    rep, fds = recv(s[0])
    for i, c in enumerate(s):  # four connections, four spawn-class threads
        send(c, {"type": "kill_worker", "id": 10 + i, "token": token, "pid": rep["pid"]})
    out.append([recv(c)[0] for c in s])
    for f in fds: os.close(f)
    for c in s: c.close()
print(json.dumps(out))
"""

if __name__ == "__main__":
    d, factory = daemon()
    try:
        res = as_front(d, CODE, d.tokens["alice"], "100")
        internal = [r for x in res for r in x if not r.get("ok") and r["error"]["code"] == "INTERNAL_ERROR"]
        kills: dict[int, int] = {}
        for rec in d.audit():
            if rec.get("event") == "kill":
                kills[rec["pid"]] = kills.get(rec["pid"], 0) + 1
        twice = {p: n for p, n in kills.items() if n > 1}
        print("INTERNAL_ERROR replies:", dump(internal[:3]), len(internal))
        print("pids killed more than once in the records:", twice)
        sys.exit(0 if internal or twice else 1)
    finally:
        stop(d, factory)
