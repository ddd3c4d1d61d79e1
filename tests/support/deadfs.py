"""A file system that never answers: a dead network file system, played by FUSE.

``python tests/support/deadfs.py MOUNTPOINT`` mounts a FUSE file system at
``MOUNTPOINT`` (``allow_other``, as an NFS or sshfs mount for several users would be), answers
the kernel's ``INIT`` and nothing else: every lookup below it hangs, like an ``open`` on a hard
NFS mount whose server is gone. It prints ``mounted`` once the mount is in place and serves until
stdin closes or it is signalled; closing ``/dev/fuse`` then aborts the connection, so every
waiting request fails (``ENOTCONN``) and the kernel detaches the mount: "the server is back".

Run it inside the mount namespace of the process that should see it (``nsenter -t PID -m``), so
no other process on a shared machine stumbles on a mount that never answers.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
import sys

FUSE_INIT = 26
_IN = struct.Struct("=IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
_OUT = struct.Struct("=IiQ")  # len, error, unique
_INIT_OUT = struct.Struct("=IIIIHHIIHHII" + "I" * 6)  # fuse_init_out (64 bytes)
MS_NOSUID, MS_NODEV = 2, 4


def main(argv: list[str]) -> int:
    target = argv[0]
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    libc = ctypes.CDLL(None, use_errno=True)
    opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    if libc.mount(b"mcpd-test-dead-fs", target.encode(), b"fuse", MS_NOSUID | MS_NODEV, opts) != 0:
        print("mount failed:", os.strerror(ctypes.get_errno()), flush=True)
        return 1
    print("mounted", flush=True)
    while True:
        ready = select.select([fd, sys.stdin], [], [])[0]
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            break  # the test is done: close /dev/fuse, aborting what waits
        if fd in ready:
            data = os.read(fd, 1 << 20)
            _, opcode, unique, *_ = _IN.unpack_from(data)
            if opcode == FUSE_INIT:
                body = _INIT_OUT.pack(7, 31, 65536, 0, 16, 12, 65536, 1, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0)
                os.write(fd, _OUT.pack(_OUT.size + len(body), 0, unique) + body)
            # anything else: never answered
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
