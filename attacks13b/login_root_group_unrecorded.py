"""A password login for an enrolled account that root's own guard refuses (a member of group 0,
or one of the daemon's accounts) leaves no audit record and is answered at once, not after
``login.answer_seconds`` (SPEC §5.3: refused accounts answer in the same time as a wrong
password; §7.1: every login attempt is a record).

The policy process checks only ``uid == 0`` before it asks root's ``pam``; root also refuses an
account with 0 among its groups and raises ``PERMISSION_DENIED``; ``Login.login`` catches only
``OSError`` around the PAM attempt, so the ToolError skips the record and the answer delay.
Prints, for a wrong password, the answer time and the records of an ordinary enrolled account and
of one in group root.
"""
import subprocess
import sys
import time

from _lib import as_front, daemon, dump, stop, with_fast_pam
from tests.integration.test_attack13b import LOGINS
from tests.integration.test_pam_login import enroll

ANSWER = 1.5


def main(service: str) -> int:
    d, factory = daemon(login={"pam_service": service, "answer_seconds": ANSWER, "max_failures": 50})
    try:
        plain, _ = enroll(d, factory)
        wheel, _ = enroll(d, factory)
        subprocess.run(["usermod", "--append", "--groups", "root", wheel.name], check=True)  # group 0, not uid 0
        time.sleep(1.5)  # users.yaml re-read
        out = as_front(d, LOGINS, plain.name, wheel.name)
        for acct in (plain, wheel):
            recs = [r for r in d.audit() if r.get("tool") == "login" and r.get("os_user") == acct.name]
            print(acct.name, "in group root" if acct is wheel else "ordinary", dump(out[acct.name]),
                  "records:", len(recs))
        bad = out[wheel.name]["seconds"] < ANSWER - 0.2 or not [
            r for r in d.audit() if r.get("tool") == "login" and r.get("os_user") == wheel.name]
        return 0 if bad else 1
    finally:
        stop(d, factory)


if __name__ == "__main__":
    with_fast_pam(main)
