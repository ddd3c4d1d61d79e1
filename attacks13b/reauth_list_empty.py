"""A fresh password login whose privileged files/list and files/find a ``reauth_after`` grant
allows gets an empty folder (SPEC §4: the call is granted; §7.1: its record says 0 entries).

The policy process decided the call with the login's time, but the walker filtered every entry
with ``grants.decide`` and no login time, as for a static token: ``reauthentication required``
for each, so nothing was shown. Fixed: the walker gets the login's time and use.
Exits 0 when the listing comes back empty.
"""
import sys
import time

from _lib import as_front, daemon, dump, stop, with_fast_pam
from tests.integration.test_attack13b import LIST_AFTER_LOGIN
from tests.integration.test_pam_login import enroll


def main(service: str) -> int:
    d, factory = daemon(login={"pam_service": service, "answer_seconds": 0.5})
    try:
        acct, password = enroll(d, factory)
        rule = {"allowed": True, "paths": [str(d.app)], "reauth_after": "5m"}
        grants = d.default_grants()
        grants["users"][acct.name] = {"privileged": {"tools": {"files/list": rule, "files/find": dict(rule)}}}
        d.write_grants(grants)
        time.sleep(1.5)
        out = as_front(d, LIST_AFTER_LOGIN, acct.name, password, str(d.app))
        print(dump(out))
        print("records:", dump([r for r in d.audit() if r.get("os_user") == acct.name and r.get("route")]))
        return 0 if not out["files/list"]["result"]["entries"] else 1
    finally:
        stop(d, factory)


if __name__ == "__main__":
    with_fast_pam(main)
