"""Workers that do not read, and a front that does not take its worker
(docs/PRIVSEP.md, "Bounded sends").

The daemon here runs its root helper (so the policy process too) under systemd's default soft
``RLIMIT_NOFILE``, 1024: that number is also how many descriptors one user may have in flight
in Unix sockets (``SCM_RIGHTS``; ``ETOOMANYREFS`` beyond). alice's workers are made to stop
reading; bob, another principal, must not notice, on either route.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.osaccounts import AccountFactory
from tests.support.privsep_calls import bob_reads_on_both_routes, read_once, wait_for
from tests.support.privsep_fixture import LOG_TEXT, PrivsepDaemon, start_privsep, stop_privsep
from tests.support.workers import PRELUDE, wait_until_ready

pytestmark = pytest.mark.root

DEADLINE = 4  # workers.timeout_seconds here: a privileged read's deadline
NOFILE = 1024  # systemd's default soft limit
WORKERS = 8  # alice's workers that stop reading
CALLS = 300  # privileged reads asked of each (one control socket holds about 200 unread calls)
REPLY_SECONDS = 8.0  # every reply of the policy process comes within this, or a thread of it hangs


@pytest.fixture(scope="module")
def daemon() -> Iterator[PrivsepDaemon]:
    """The privsep daemon with a short deadline, its helper at soft NOFILE 1024, alice and bob
    both granted files/read on the app folder."""
    factory = AccountFactory()
    d: PrivsepDaemon | None = None
    try:
        d = start_privsep(factory, nofile=NOFILE, workers={"per_account": 4, "timeout_seconds": DEADLINE})
        rule = {"allowed": True, "paths": [str(d.app)]}
        d.write_grants({"users": {d.accounts[p].name: {"privileged": {"tools": {"files/read": dict(rule)}}}
                                  for p in ("alice", "bob")}})
        wait_for(lambda: read_once(d, d.log_file, privileged=True, principal="bob") == (LOG_TEXT, {}))
        yield d
    finally:
        if d is not None:
            stop_privsep(d)
        factory.cleanup()


def as_front(d: PrivsepDaemon, code: str, *args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    """:data:`PRELUDE` + ``code`` as the service user on the helper socket (argv[1])."""
    return subprocess.Popen(["setpriv", f"--reuid={d.service.pw_uid}", f"--regid={d.service.pw_gid}", "--clear-groups",
                             sys.executable, "-I", "-c", PRELUDE + code, str(d.socket_path), *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# As the front: spawns argv[2] workers for the token argv[3] and prints their pids; after a line on
# stdin, asks each (one connection and thread per worker) for up to argv[4] privileged reads in a
# row (rids 1, 2, ...), each reply awaited at most argv[5] seconds; stops a worker's run at its first
# refusal or silence. Prints {pid: {"dispatched": n, "error": first error or None, "silent": bool}}.
STUCK = r"""
import threading
n, token, calls, wait = int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
path = sys.argv[6]
h = conn(sys.argv[1])
pids, keep = [], []
for i in range(n):
    send(h, {"type": "spawn_worker", "id": i + 1, "token": token})
    rep, fds = recv(h)
    pids.append(rep["pid"]); keep += fds
print(json.dumps(pids), flush=True)
sys.stdin.readline()
out = {}
def run(pid):
    c = conn(sys.argv[1]); c.settimeout(wait)
    res = out[pid] = {"dispatched": 0, "error": None, "silent": False}
    for rid in range(1, calls + 1):
        send(c, {"type": "privileged_call", "id": rid, "token": token, "session": "s", "peer": "p", "op": "files/read",
                 "args": {"path": path, "privileged": True}, "worker": pid, "rid": rid})
        try:
            rep, _ = recv(c)
        except OSError:
            res["silent"] = True; return
        if not rep or not rep.get("ok"):
            res["error"] = rep and rep.get("error"); return
        res["dispatched"] += 1
threads = [threading.Thread(target=run, args=(p,)) for p in pids]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(out), flush=True)
"""


def steal_control_socket(pid: int) -> socket.socket:
    """A copy (``pidfd_getfd``, as root) of worker ``pid``'s control socket, fd 4."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(434, pid, 0)  # pidfd_open
    assert pidfd >= 0, ctypes.get_errno()
    try:
        fd = libc.syscall(438, pidfd, 4, 0)  # pidfd_getfd
        assert fd >= 0, ctypes.get_errno()
    finally:
        os.close(pidfd)
    return socket.socket(fileno=fd)


def test_workers_that_stop_reading_hold_no_thread_and_no_descriptor_of_anyone_else(daemon: PrivsepDaemon) -> None:
    """High: the policy process sent to a worker's control socket with a
    blocking send, on the front connection's thread, so a worker that reported its calls in advance
    but never read filled its socket: the next send blocked for good (killing the worker did not
    unblock it while another process held the socket), and the descriptors left in flight used up
    the policy's SCM_RIGHTS allowance (soft NOFILE 1024): ``ETOOMANYREFS``, so no granted descriptor
    and no new worker socket reached anyone. Here alice's workers are compromised (the test, as
    root, plays their code: it stops each real worker, keeps a copy of its control socket and
    reports 300 calls in advance without ever reading). Now a call is passed to a worker only when
    it has taken the previous one, and never with a blocking send: each of alice's workers gets one
    call, the next fails at once (INTERNAL_ERROR) and the worker is killed, no request waits, and
    bob's calls on both routes, new workers included, are served as ever."""
    d = daemon
    front = as_front(d, STUCK, str(WORKERS), d.tokens["alice"], str(CALLS), str(REPLY_SECONDS), str(d.log_file))
    assert front.stdin is not None and front.stdout is not None
    stolen: list[socket.socket] = []
    try:
        pids = json.loads(front.stdout.readline())
        reports = b"".join(struct.pack("!I", len(raw)) + raw for raw in (
            json.dumps({"id": rid, "code": None, "bytes": 0}).encode() for rid in range(1, CALLS + 1)))
        for pid in pids:
            ctl = steal_control_socket(pid)
            stolen.append(ctl)
            wait_until_ready(ctl)  # it reported itself hardened, as any worker does
            os.kill(pid, signal.SIGSTOP)  # from now on its code does not run: the attacker's does
            ctl.sendall(reports)  # every call reported done in advance; nothing is ever read
        front.stdin.write("go\n")
        front.stdin.flush()
        started = time.monotonic()
        runs = json.loads(front.stdout.readline() or "null")
        took = time.monotonic() - started
        bob = bob_reads_on_both_routes(d)
    finally:
        front.kill()
        front.communicate(timeout=30)
        for ctl in stolen:
            ctl.close()
    assert runs is not None, front.stderr
    assert bob == [("bob's note\n", {}), (LOG_TEXT, {})] * 3
    assert not any(r["silent"] for r in runs.values()), runs  # no policy thread was left waiting
    assert all(r["dispatched"] <= 1 for r in runs.values()), runs  # one call in flight per worker, at most
    # the next call fails at once, or, once alice's workers hold UNTAKEN_MAX descriptors that
    # another process keeps (here the test's copies of their sockets), no more is passed to her
    fed = {int(pid) for pid, r in runs.items() if r["dispatched"]}
    assert all(r["error"]["code"] == "INTERNAL_ERROR" and "did not read its control socket" in r["error"]["message"]
               if r["dispatched"] else r["error"]["code"] == "HELPER_UNAVAILABLE" and "untaken" in r["error"]["message"]
               for r in runs.values()), runs
    assert took < REPLY_SECONDS, took
    kills = [r for r in d.audit() if r["event"] == "kill" and r.get("pid") in set(pids)]
    assert {r["pid"] for r in kills} >= fed, kills
    for pid in set(pids) - fed:  # (never given anything; the front would end them)
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not set(pids) & set(d.workers("alice")))


def test_a_stopped_worker_fails_its_own_call_at_the_deadline_and_nothing_else(daemon: PrivsepDaemon) -> None:
    """A worker of alice that stops reading (a process of alice's account sends it ``SIGSTOP``:
    signals are allowed, they take nothing): alice's privileged read on it fails with ``TIMEOUT``
    within its deadline, the worker is killed, and bob's calls on both routes meanwhile are
    served; alice's next read gets a new worker."""
    d = daemon
    assert read_once(d, d.log_file, privileged=True) == (LOG_TEXT, {})
    alice = d.accounts["alice"]
    stopped = d.workers("alice")
    subprocess.run(["setpriv", f"--reuid={alice.uid}", f"--regid={alice.gid}", "--init-groups",
                    "kill", "-STOP", *map(str, stopped)], check=True, timeout=30)
    try:
        started = time.monotonic()
        got = read_once(d, d.log_file, privileged=True)
        took = time.monotonic() - started
        bob = bob_reads_on_both_routes(d)
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert got[0] is None and got[1]["code"] == "TIMEOUT", got
    assert took < DEADLINE + 10, took
    assert bob == [("bob's note\n", {}), (LOG_TEXT, {})] * 3
    assert read_once(d, d.log_file, privileged=True) == (LOG_TEXT, {})


# As the front: asks for a worker for the token argv[2] and closes the connection at once.
GONE = r"""
send(conn(sys.argv[1]), {"type": "spawn_worker", "id": 1, "token": sys.argv[2]})
"""


def test_a_worker_whose_socket_never_reached_the_front_is_recorded_failed_and_killed(daemon: PrivsepDaemon) -> None:
    """A spawn reply that could not be sent (the front gone, or ``ETOOMANYREFS``)
    was swallowed and left a ``spawn accept`` record for a worker the front never got. Now such a
    worker is recorded ``spawn_failed`` ("its socket did not reach the front"), no ``spawn``
    record names it, and it is killed."""
    d = daemon
    seq = d.audit()[-1]["seq"]
    front = as_front(d, GONE, d.tokens["alice"])
    front.communicate(timeout=60)
    assert front.returncode == 0

    def failed() -> list[dict[str, Any]]:
        return [r for r in d.audit() if r["seq"] > seq and r["event"] == "spawn_failed"]

    wait_for(lambda: bool(failed()), 30)
    (rec,) = failed()
    assert rec["user"] == "alice" and rec["reason"] == "its socket did not reach the front"
    pid = rec["pid"]
    assert not [r for r in d.audit() if r["seq"] > seq and r["event"] == "spawn" and r.get("pid") == pid]
    wait_for(lambda: any(r["event"] == "kill" and r.get("pid") == pid for r in d.audit()), 30)
    wait_for(lambda: pid not in d.workers("alice"))
