"""Workers as tests watch them: the files that keep one busy, the pids a daemon spawned, the
prelude a worker runs to show what it keeps, a daemon whose logins go through PAM, and the
messages a session gets meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import struct
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.osaccounts import AccountFactory, pam_service
from tests.support.pam_login import FAST_PAM
from tests.support.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep


def worker_pids(daemon_pid: int) -> set[int]:
    pids: set[int] = set()
    for tid in os.listdir(f"/proc/{daemon_pid}/task"):
        with open(f"/proc/{daemon_pid}/task/{tid}/children") as f:
            pids.update(int(p) for p in f.read().split())
    return pids


def slow_file(tmp_path: Path) -> Path:
    """A text head, then a 1 TiB hole: finding line 3 means scanning the hole (minutes of work)."""
    p = tmp_path / "sparse.log"
    with open(p, "wb") as f:
        f.write(b"a\n" + b"b" * 9000)
        f.truncate(1 << 40)
    return p


# Run as the service user: helpers for one attacker script (argv[1] is the helper socket).
PRELUDE = r"""
import json, os, socket, struct, sys, time
def conn(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(path); s.settimeout(60); return s
def send(s, obj):
    raw = json.dumps(obj).encode(); s.sendall(struct.pack("!I", len(raw)) + raw)
def recv(s):
    head = b""; fds = []
    while len(head) < 4:
        msg, got, _, _ = socket.recv_fds(s, 4 - len(head), 4)
        fds += got
        if not msg: return None, fds
        head += msg
    n = struct.unpack("!I", head)[0]; body = b""
    while len(body) < n:
        c = s.recv(n - len(body))
        if not c: return None, fds
        body += c
    return json.loads(body), fds
"""


@contextlib.contextmanager
def login_daemon(tmp_path_factory: pytest.TempPathFactory, timeout_seconds: float,
                 answer_seconds: float) -> Iterator[tuple[PrivsepDaemon, AccountFactory]]:
    """The privsep daemon (``workers.per_account`` 4, ``workers.timeout_seconds`` as given) with
    a fast PAM service answering in ``answer_seconds``; skips the test unless root."""
    if os.geteuid() != 0:
        pytest.skip("needs root: root helper, OS accounts, PAM service")
    fast = tmp_path_factory.mktemp("pam") / "fast"
    fast.write_text(FAST_PAM)
    factory = AccountFactory()
    d: PrivsepDaemon | None = None
    with pam_service(fast) as service:
        try:
            d = start_privsep(factory, workers={"per_account": 4, "timeout_seconds": timeout_seconds},
                              login={"pam_service": service, "answer_seconds": answer_seconds, "max_failures": 50})
            yield d, factory
        finally:
            if d is not None:
                stop_privsep(d)
            factory.cleanup()


def wait_until_ready(ctl: socket.socket, seconds: float = 30.0) -> None:
    """Wait until the worker holding the other copy of ``ctl`` (its control socket) has sent its
    ``{"ready": true}`` report: bytes it sent that the policy process has not read yet
    (``SIOCOUTQ``; the policy reads that report at the worker's first privileged call)."""
    deadline = time.monotonic() + seconds
    while struct.unpack("i", fcntl.ioctl(ctl.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0] == 0:
        assert time.monotonic() < deadline, "the worker never reported itself hardened"
        time.sleep(0.01)


async def messages_for(session: Any, seconds: float) -> list[Any]:
    """Every message an ``SseSession`` receives within ``seconds`` (to show that one never came)."""

    seen: list[Any] = []
    deadline = asyncio.get_running_loop().time() + seconds
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        try:
            seen.append(await session.next_message(timeout=left))
        except TimeoutError:
            break
    return seen
