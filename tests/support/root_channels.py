"""Speaking root's and the policy process's channels directly, as the processes that own them."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import pwd
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from mcpd.common.config import POLICY_USER
from mcpd.common.frames import reply_cap
from mcpd.helper.wire import frames
from tests.support.privsep_fixture import PrivsepDaemon, children

SYS_PIDFD_GETFD = 438  # x86_64 and aarch64


_ids = itertools.count(10**9)


def policy_pid(d: PrivsepDaemon) -> int:
    (pid,) = children(d.helper_pid, pwd.getpwnam(POLICY_USER).pw_uid)
    return pid


class Channel:
    """The policy's channel to root, held by the test."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock  # blocking, and left so: the file description is the policy's too
        self.others: list[Channel] = []

    def ask(self, kind: str, **fields: Any) -> tuple[dict[str, Any], list[int]]:
        """One request, its reply and the descriptors that came with it (the caller closes them)."""
        rid = next(_ids)
        frames.send_frame(self.sock, dict(fields, type=kind, id=rid))
        assert select.select([self.sock], [], [], 30)[0], f"root did not answer {kind}"
        reply, fds = frames.recv_frame_fds(self.sock, reply_cap(1 << 20), 4)
        assert reply is not None and reply["id"] == rid, reply
        return reply, fds

    def refused(self, kind: str, **fields: Any) -> dict[str, Any]:
        reply, fds = self.ask(kind, **fields)
        assert fds == [] and reply["ok"] is False, reply
        return reply["error"]


@contextlib.contextmanager
def as_policy(d: PrivsepDaemon, channels: int = 1) -> Iterator[Channel]:
    """Stop the policy process and hold its first channel to root (``.others``: the next
    ``channels - 1``) until the block ends."""
    pid = policy_pid(d)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    pidfd = os.pidfd_open(pid)
    os.kill(pid, signal.SIGSTOP)
    socks: list[socket.socket] = []
    try:
        for n in range(channels):  # the policy's channels to root are fds 4, 5, ...
            fd = libc.syscall(ctypes.c_long(SYS_PIDFD_GETFD), ctypes.c_int(pidfd), ctypes.c_int(4 + n), ctypes.c_uint(0))
            assert fd >= 0, os.strerror(ctypes.get_errno())
            socks.append(socket.socket(fileno=fd))
        first = Channel(socks[0])
        first.others = [Channel(s) for s in socks[1:]]
        yield first
    finally:
        for sock in socks:
            sock.close()
        os.close(pidfd)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


# Runs as the service user: sends each request of stdin (a JSON list) on one connection to the
# helper socket argv[1] and prints one JSON line per request: the reply, or {"closed": true}.
FRONT = r"""
import json, socket, struct, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
sock.settimeout(20)
def recv(n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf
for item in json.loads(sys.stdin.read()):
    raw = item.encode() if isinstance(item, str) else json.dumps(item).encode()
    try:
        sock.sendall(struct.pack("!I", len(raw)) + raw)
        head = recv(4)
        body = recv(struct.unpack("!I", head)[0]) if head else None
    except OSError:
        body = None
    print(json.dumps({"closed": True} if body is None else json.loads(body)), flush=True)
"""


def as_front(d: PrivsepDaemon, requests: list[Any]) -> list[dict[str, Any]]:
    """Play the compromised front: run :data:`FRONT` as the service user against the helper."""
    out = subprocess.run(
        ["setpriv", f"--reuid={d.service.pw_uid}", f"--regid={d.service.pw_gid}", "--clear-groups",
         sys.executable, "-I", "-c", FRONT, str(d.socket_path)],
        input=json.dumps(requests), capture_output=True, text=True, timeout=60, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def _grab_fd(pid: int, target: str) -> int:
    """A copy (``pidfd_getfd``: the same open file description) of the descriptor process ``pid``
    holds for ``target``."""
    libc = ctypes.CDLL(None, use_errno=True)
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}") != target:
                continue
        except OSError:
            continue
        pidfd = libc.syscall(434, pid, 0)  # pidfd_open
        assert pidfd >= 0
        try:
            fd = libc.syscall(438, pidfd, int(name), 0)  # pidfd_getfd
            assert fd >= 0, ctypes.get_errno()
            return int(fd)
        finally:
            os.close(pidfd)
    raise AssertionError(f"{pid} holds no descriptor of {target}")


PROBE = r"""
import json, os, socket, struct, sys
from mcpd.helper.wire import frames
path, mode, payload = sys.argv[1:4]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(20)
s.connect(path)
if mode == "header":
    s.sendall(struct.pack("!I", int(payload)))
else:
    try:
        frames.send_frame(s, json.loads(payload))
    except OSError:  # refused at once: the helper closed before reading
        print(json.dumps({"closed": True, "fds": 0}))
        sys.exit(0)
data, fds = b"", []
try:
    while len(data) < 4 or len(data) < 4 + struct.unpack("!I", data[:4])[0]:  # (descriptors come with byte 1)
        chunk, got, _flags, _addr = socket.recv_fds(s, 65536, 4)
        fds += got
        if not chunk:
            break
        data += chunk
except OSError as exc:
    print(json.dumps({"closed": True, "error": type(exc).__name__}))
    sys.exit(0)
for fd in fds:
    os.close(fd)
if not data:
    print(json.dumps({"closed": True, "fds": 0}))
else:
    print(json.dumps({"closed": False, "fds": len(fds), "reply": json.loads(data[4:])}))
"""


def probe(d: PrivsepDaemon, mode: str, payload: Any, uid: int, gid: int, groups: tuple[int, ...] = ()) -> dict[str, Any]:
    """Run :data:`PROBE` as ``uid``/``gid``/``groups``; return its JSON answer."""
    arg = payload if mode == "header" else json.dumps(payload)
    res = subprocess.run(
        [sys.executable, "-c", PROBE, str(d.socket_path), mode, str(arg)],
        user=uid, group=gid, extra_groups=list(groups), capture_output=True, text=True, timeout=60,
        cwd="/", env={"PATH": os.defpath, "LANG": "C.UTF-8"},
    )
    assert res.returncode == 0, res.stderr
    answer: dict[str, Any] = json.loads(res.stdout)
    return answer


def as_mcpd(d: PrivsepDaemon, mode: str, payload: Any) -> dict[str, Any]:
    return probe(d, mode, payload, d.service.pw_uid, d.service.pw_gid)
