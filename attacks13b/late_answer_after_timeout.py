"""A privileged read recorded as TIMEOUT with 0 bytes, whose content the (compromised) front still
receives in full afterwards (SPEC §7.1: the record must give the call's real outcome and bytes).

The compromised front keeps alice's worker busy with unprivileged finds of its own (the worker
serves the frames already in its buffer before its control socket), then sends a privileged read
of a granted file to that worker. The policy process waits ``workers.timeout_seconds`` for the
worker's report, writes the call's one record (``outcome: TIMEOUT``, ``bytes: 0``) and answers
TIMEOUT, but leaves the worker running with the granted descriptor in its queue: it reads the file
later and sends the whole text to the front. An honest front kills the worker on TIMEOUT; a
compromised one just reads the late answer (frame id 77). Fixed: the policy process has root kill
the worker at the deadline.
"""
import sys

from _lib import as_front, daemon, dump, stop
from tests.integration.test_attack13b import LATE_READ

if __name__ == "__main__":
    d, factory = daemon(workers={"per_account": 4, "timeout_seconds": 3})
    try:
        out = as_front(d, LATE_READ, d.tokens["alice"], str(d.log_file))
        recs = [r for r in d.audit() if r.get("requested_path") == str(d.log_file)]
        print("policy answered:", dump(out["policy"]))
        print("frame ids the front got from the worker afterwards:", out["ids"])
        print("the call's records:", dump(recs))
        sys.exit(0 if 77 in out["ids"] and recs[-1].get("outcome") == "TIMEOUT" else 1)
    finally:
        stop(d, factory)
