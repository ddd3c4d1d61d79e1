"""A principal granted only ``files/filetype`` on a root-only file gets, in its worker, a
descriptor of it open for reading (SPEC §4.1/§4.5a: a call gets what its tool's grant covers).

Root's ``open`` with ``want="any"`` (files/filetype) opens a regular file ``O_RDONLY``, exactly as
for files/read; the policy process passes it to the worker (and keeps a copy for the next call).
A compromised worker (code as alice, through the content parsers it runs) keeps it and reads the
whole file. This script plays the front, then takes the copy the policy process kept (the same
open file description the worker got) and reads it. Exits 0 when the content is readable.
"""
import os
import sys
import time

from _lib import as_front, daemon, dump, stop
from tests.integration.test_attack13b import FILETYPE, _children_of_policy
from tests.integration.test_privsep_attacks import _grab_fd

if __name__ == "__main__":
    d, factory = daemon()
    try:
        grants = d.default_grants()
        grants["users"][d.accounts["alice"].name]["privileged"]["tools"]["files/filetype"] = {
            "allowed": True, "paths": [str(d.secret)]}
        d.write_grants(grants)
        time.sleep(1.5)
        print("filetype answer:", dump(as_front(d, FILETYPE, d.tokens["alice"], str(d.secret))))
        (policy,) = _children_of_policy(d)
        fd = _grab_fd(policy, str(d.secret))
        print("flags of the descriptor handed to alice's worker:", oct(__import__("fcntl").fcntl(fd, 3)))
        content = os.pread(fd, 200, 0)
        print("its content:", content)
        sys.exit(0 if content == d.secret.read_bytes() else 1)
    finally:
        stop(d, factory)
