"""A principal granted only ``files/filetype`` on a root-only file gets, in its worker, a
descriptor of it open for reading (SPEC §4.1/§4.5a: a call gets what its tool's grant covers).

Root's ``open`` with ``want="any"`` (files/filetype) opens a regular file ``O_RDONLY``, exactly as
for files/read; the policy process used to pass it to the worker. A compromised worker (code as
alice, through the content parsers it runs) keeps it and reads the whole file. This script plays
the front and the compromised worker: it stops alice's real worker, takes its end of the policy
process's control socket, receives the call's frame and descriptors there, and reads what it can
through them. Exits 0 when the bytes past the sample (the file's secret tail) are readable.
"""
import os
import sys
import time

from _lib import daemon, stop
from mcpd.common.config import SAMPLE_BYTES
from tests.integration.privsep_fixture import SECRET_TEXT
from tests.integration.test_attack13b import what_a_filetype_worker_gets

if __name__ == "__main__":
    d, factory = daemon()
    try:
        folder = d.srv / "ft"
        folder.mkdir(mode=0o700)
        big = folder / "big.bin"
        big.write_bytes(b"x" * SAMPLE_BYTES + SECRET_TEXT.encode())
        os.chmod(big, 0o600)
        grants = d.default_grants()
        grants["users"][d.accounts["alice"].name]["privileged"]["tools"]["files/filetype"] = {
            "allowed": True, "paths": [str(big)]}
        d.write_grants(grants)
        time.sleep(1.5)
        ((frame, fds),) = what_a_filetype_worker_gets(d, d.tokens["alice"], [str(big)])
        print("frame the worker got:", frame)
        leaked = False
        for fd in fds:
            print(f"descriptor {fd}: {os.readlink(f'/proc/self/fd/{fd}')}")
            content = os.pread(fd, 2 * SAMPLE_BYTES, 0)
            print(f"  readable bytes: {len(content)}; the secret tail among them: {SECRET_TEXT.encode() in content}")
            leaked = leaked or SECRET_TEXT.encode() in content
            os.close(fd)
        sys.exit(0 if leaked else 1)
    finally:
        stop(d, factory)
