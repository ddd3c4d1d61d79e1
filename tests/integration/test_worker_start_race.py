"""A worker's start, raced by a process of its own account (docs/PRIVSEP.md
"A worker's start").

The attacker is a real process of alice's OS account, started beside the real privilege-separated
daemon. It watches ``/proc`` for every new process of its uid and, as soon as one has exec'd the
worker, stops it (``SIGSTOP``: allowed, signals are no theft) and tries everything the kernel
would let a process of the same account do to a dumpable one: copy each of its descriptors with
``pidfd_getfd``, ``PTRACE_SEIZE`` and ``PTRACE_ATTACH``, open ``/proc/PID/fd/*`` and
``/proc/PID/mem``. With any socket it copied it plays the worker: it takes the call the policy
process sends on the control socket, reads the descriptor root opened, and reports ``bytes: 0``.
Meanwhile a front (code as the service user on the helper socket) starts worker after worker for
alice and has each one read a root-only file on the privileged route.
"""

from __future__ import annotations

import ctypes
import grp
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from mcpd.helper.wire import frames
from mcpd.helper.wire.rootconf import WORKER_START_GID
from mcpd.policy.workers import _status_problem
from tests.support.privsep_calls import read_once, wait_for
from tests.support.privsep_fixture import LOG_TEXT, PrivsepDaemon, privsep_daemon  # noqa: F401  (fixture)
from tests.support.workers import PRELUDE

pytestmark = pytest.mark.root

STARTS = 24  # worker starts raced (within the policy's spawn bucket: twice spawn_burst at once)
ANSWER_SECONDS = 5.0  # a worker's answer to the front
ATTACK_SECONDS = 120.0  # the attacker's own bound, whatever happens

# Runs as alice's account (uid, gid, groups). argv[1]: its uid; argv[2]: the text it looks for.
# Until stdin closes it attacks every new worker of its uid, then prints one JSON summary.
ATTACKER = r"""
import ctypes, json, os, select, signal, socket, struct, sys, time
uid, secret = int(sys.argv[1]), sys.argv[2].encode()
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_ATTACH, PTRACE_DETACH, PTRACE_SEIZE = 16, 17, 0x4206
out = {"seen": [], "stopped": 0, "in_window": 0, "fds": 0, "ptrace": 0, "proc_fd": 0, "proc_mem": 0,
       "frames": 0, "leaked": 0}
done, me = set(), os.getpid()

def gids(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Gid:"):
            return line.split()[1:]

def in_window(pid):  # dumpable (its /proc files are its own) or its real and effective gids differ
    return os.stat(f"/proc/{pid}/status").st_uid == uid or len(set(gids(pid))) > 1

def play_worker(socks):  # what a thief does with copies of a worker's sockets: take the policy's call
    end = time.monotonic() + 3
    while socks and time.monotonic() < end:
        for s in select.select(socks, [], [], 0.2)[0]:
            try:
                head, fds, _, _ = socket.recv_fds(s, 4, 4)
            except OSError:
                socks.remove(s); continue
            if len(head) < 4:
                socks.remove(s); continue
            body = b""
            n = struct.unpack("!I", head)[0]
            while len(body) < n:
                body += s.recv(n - len(body))
            frame = json.loads(body)
            out["frames"] += 1
            for fd in fds:
                try:
                    if secret in os.pread(fd, 1 << 16, 0):
                        out["leaked"] += 1
                except OSError:
                    pass
                os.close(fd)
            if "op" in frame and fds:  # the control socket: report the call done, as the worker would
                raw = json.dumps({"id": frame["id"], "code": None, "bytes": 0}).encode()
                s.sendall(struct.pack("!I", len(raw)) + raw)
                return

def is_worker(pid):  # (not yet: the fork server's child; no longer: a program a worker runs, ldconfig say)
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")[1:4] == [b"-I", b"-m", b"mcpd.worker"]

def stopped(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")

def attack(pid):
    os.kill(pid, signal.SIGSTOP)
    try:
        until = time.monotonic() + 5
        while not stopped(pid) and time.monotonic() < until:  # (the signal takes effect on its way out of the kernel)
            time.sleep(0.0002)
        if not is_worker(pid):  # it exec'd something else before it stopped
            return
        out["stopped"] += 1
        if in_window(pid):
            out["in_window"] += 1
        socks = []
        pidfd = libc.syscall(434, pid, 0)  # pidfd_open
        for n in range(64):
            fd = libc.syscall(438, pidfd, n, 0)  # pidfd_getfd
            if fd >= 0:
                out["fds"] += 1
                try:
                    socks.append(socket.socket(fileno=fd))
                except OSError:
                    os.close(fd)
        os.close(pidfd)
        for req in (PTRACE_SEIZE, PTRACE_ATTACH):
            if libc.ptrace(req, pid, None, None) == 0:
                out["ptrace"] += 1
                libc.ptrace(PTRACE_DETACH, pid, None, None)
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            names = []
        for name in names:
            try:
                os.close(os.open(f"/proc/{pid}/fd/{name}", os.O_RDONLY | os.O_NONBLOCK))
                out["proc_fd"] += 1
            except OSError:
                pass
        try:
            os.close(os.open(f"/proc/{pid}/mem", os.O_RDONLY))
            out["proc_mem"] += 1
        except OSError:
            pass
        play_worker(socks)
        for s in socks:
            s.close()
    finally:
        os.kill(pid, signal.SIGCONT)

end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end and not select.select([sys.stdin], [], [], 0)[0]:
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in done or int(entry.name) == me:
            continue
        pid = int(entry.name)
        try:
            if entry.stat().st_uid != uid:
                continue
            if not is_worker(pid):
                continue
            done.add(pid)
            out["seen"].append(pid)
            attack(pid)
        except (OSError, TypeError):  # it ended meanwhile
            pass
    time.sleep(0.001)
print(json.dumps(out))
"""

# Runs as the service user: STARTS times, spawns a worker for the token argv[2], asks for a
# privileged files/read of argv[3] into it, reads the worker's answer, kills it. One JSON line each.
FRONT = r"""
token, path, starts, wait = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
h = conn(sys.argv[1])
for i in range(starts):
    send(h, {"type": "spawn_worker", "id": 3 * i + 1, "token": token})
    rep, fds = recv(h)
    if not rep or not rep.get("ok"):
        print(json.dumps({"spawn": rep})); continue
    w = socket.socket(fileno=fds[0]); w.settimeout(wait)
    send(h, {"type": "privileged_call", "id": 3 * i + 2, "token": token, "session": "s", "peer": "p",
             "op": "files/read", "args": {"path": path, "privileged": True}, "worker": rep["pid"], "rid": 1000 + i})
    policy = recv(h)[0]
    text = None
    try:
        answer, _ = recv(w)
        if answer and answer.get("text_frame"):
            head = w.recv(4, socket.MSG_WAITALL)
            text = w.recv(struct.unpack("!I", head)[0], socket.MSG_WAITALL).decode()
    except OSError:
        pass
    w.close()
    send(h, {"type": "kill_worker", "id": 3 * i + 3, "token": token, "pid": rep["pid"]})
    recv(h)
    print(json.dumps({"pid": rep["pid"], "policy": policy, "text": text}), flush=True)
"""


def test_a_process_of_the_account_racing_every_worker_start_gets_nothing(privsep_daemon: PrivsepDaemon) -> None:
    """High: a worker became dumpable again at its ``exec`` (its ids all equal),
    and turned that off only after its interpreter had started, so a process of the same account
    could stop it in that window, copy its control socket with ``pidfd_getfd``, take the
    descriptor root opened for the principal's next privileged read, read the root-only file and
    report ``bytes: 0`` (the audit then said ``accept ... bytes=0``). Now the worker runs from its
    ``exec`` with a real gid that differs from its effective one, so no process of the account
    matches its credentials (the ptrace check needs the caller's gid to equal all three), and it is
    not dumpable before it takes the account's gid back; the policy process checks that it is
    hardened before its socket reaches the front. The attacker stops every start (so the race was
    run, inside the window) and gets no descriptor, no ptrace, no ``/proc`` file and no byte of the
    file; every read answers the file's text and its record states exactly those bytes."""
    d = privsep_daemon
    alice = d.accounts["alice"]
    seq = d.audit()[-1]["seq"] if d.audit() else 0
    with subprocess.Popen(
            ["setpriv", f"--reuid={alice.uid}", f"--regid={alice.gid}", "--init-groups",
             sys.executable, "-I", "-c", ATTACKER, str(alice.uid), LOG_TEXT.splitlines()[0], str(ATTACK_SECONDS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as attacker:
        assert attacker.stdin is not None and attacker.stdout is not None
        try:
            front = subprocess.run(
                ["setpriv", f"--reuid={d.service.pw_uid}", f"--regid={d.service.pw_gid}", "--clear-groups",
                 sys.executable, "-I", "-c", PRELUDE + FRONT, str(d.socket_path), d.tokens["alice"], str(d.log_file),
                 str(STARTS), str(ANSWER_SECONDS)],
                capture_output=True, text=True, timeout=STARTS * (ANSWER_SECONDS + 15))
        finally:
            attacker.stdin.close()  # the attacker stops and prints what it got
            got = attacker.stdout.read()
    assert front.returncode == 0, front.stderr[-3000:]
    calls = [json.loads(line) for line in front.stdout.splitlines()]
    stolen: dict[str, Any] = json.loads(got)
    pids = [c["pid"] for c in calls if "pid" in c]
    assert len(pids) == STARTS, calls
    assert set(pids) <= set(stolen["seen"]), (pids, stolen)  # the attacker saw, and stopped, every start
    assert stolen["in_window"] >= 1, stolen  # and caught starts before their hardening
    assert {k: stolen[k] for k in ("fds", "ptrace", "proc_fd", "proc_mem", "frames", "leaked")} == {
        "fds": 0, "ptrace": 0, "proc_fd": 0, "proc_mem": 0, "frames": 0, "leaked": 0}, stolen
    assert [c["text"] for c in calls] == [LOG_TEXT] * STARTS, calls
    reads = [r for r in d.audit() if r["seq"] > seq and r["event"] == "accept" and r.get("tool") == "files/read"]
    assert [r["bytes"] for r in reads] == [len(LOG_TEXT.encode())] * STARTS, reads


def start_worker(pw: pwd.struct_passwd, real_gid: int, effective_gid: int) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``python -I -m mcpd.worker`` as the fork server does, but with the gids given (real,
    then effective and saved): ``(process, the descriptor its ready frame carried)``."""
    front, theirs = socket.socketpair()
    ctl, their_ctl = socket.socketpair()

    def drop() -> None:
        os.setgroups(os.getgrouplist(pw.pw_name, pw.pw_gid))
        os.setresgid(real_gid, effective_gid, effective_gid)
        os.setresuid(pw.pw_uid, pw.pw_uid, pw.pw_uid)
        ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS

    proc = subprocess.Popen([sys.executable, "-I", "-m", "mcpd.worker", "--fd", str(theirs.fileno()),
                             "--ctl", str(their_ctl.fileno()), "--parent", str(os.getpid())], pass_fds=(theirs.fileno(), their_ctl.fileno()),
                            preexec_fn=drop, cwd="/")
    theirs.close()
    their_ctl.close()
    ctl.settimeout(60)
    with front, ctl:
        hello, fds = frames.recv_frame_fds(ctl, 4096, 1)
        assert hello == {"ready": True} and len(fds) == 1
        problem = _status_problem(fds[0], proc.pid, pw)
        assert problem is None, problem
        return proc, fds[0]


@pytest.mark.parametrize("reset_at_exec", [False, True], ids=["kernel-keeps-ids", "kernel-resets-ids"])
def test_the_policy_process_takes_a_started_worker_only_hardened(privsep_daemon: PrivsepDaemon,
                                                                 reset_at_exec: bool) -> None:
    """What the policy process checks before a new worker's socket reaches the front
    (``policy.workers._status_problem``), on real workers: started as the fork server starts them
    (real gid ``WORKER_START_GID``, effective and saved gid the account's), a worker reports
    itself with its ``/proc/self/status`` showing the account's uid and gid four times, not
    dumpable, no tracer, no_new_privs, no capability; started as kernels before 2025 leave it
    after that ``exec`` under no_new_privs (all three gids the start gid), it keeps them and is
    taken too. A status descriptor of a dumpable process, of another process or of no ``/proc``
    file is refused."""
    pw = pwd.getpwuid(privsep_daemon.accounts["alice"].uid)
    real = WORKER_START_GID
    proc, status = start_worker(pw, real, real if reset_at_exec else pw.pw_gid)
    try:
        gids = next(line for line in os.pread(status, 16384, 0).decode().splitlines() if line.startswith("Gid:"))
        assert gids.split()[1:] == [str(real if reset_at_exec else pw.pw_gid)] * 4
        assert _status_problem(status, proc.pid + 1, pw) == "its state is not a hardened worker's: Pid"
    finally:
        os.close(status)
        proc.kill()
        proc.wait(timeout=30)
    with subprocess.Popen(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "sleep", "60"]) as plain:
        try:
            deadline = time.monotonic() + 30
            while os.stat(f"/proc/{plain.pid}/status").st_uid != pw.pw_uid:  # (setpriv, then exec)
                assert time.monotonic() < deadline
                time.sleep(0.01)
            fd = os.open(f"/proc/{plain.pid}/status", os.O_RDONLY)
            try:
                assert _status_problem(fd, plain.pid, pw) == "it is dumpable"
            finally:
                os.close(fd)
        finally:
            plain.kill()
    fd = os.open("/etc/hostname", os.O_RDONLY)
    try:
        assert _status_problem(fd, 1, pw) == "its status descriptor is no file of /proc"
    finally:
        os.close(fd)


def test_an_account_in_the_start_group_gets_no_worker(privsep_daemon: PrivsepDaemon) -> None:
    """Fail closed: a process of an account in group ``WORKER_START_GID`` could take that gid
    (``sg``), and on kernels that reset a worker's gids to its real one at ``exec`` it would then
    match a starting worker's credentials. Such an account gets no worker (``PERMISSION_DENIED``,
    reason ``start group``); out of the group again, it does."""
    d = privsep_daemon
    alice = d.accounts["alice"].name
    group = grp.getgrgid(WORKER_START_GID).gr_name
    for pid in d.workers("alice"):  # the next call needs a new worker
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not d.workers("alice"))
    subprocess.run(["usermod", "-aG", group, alice], check=True, timeout=60)
    try:
        assert read_once(d, "/etc/hostname")[1]["details"]["reason"] == "start group"
    finally:
        subprocess.run(["gpasswd", "-d", alice, group], check=True, timeout=60, capture_output=True)
    assert read_once(d, "/etc/hostname")[0] is not None


# Runs as a process of the account: argv[1] is a target pid. Prints whether pidfd_getfd (of its
# fd 0) and PTRACE_SEIZE worked.
TRY = r"""
import ctypes, json, sys
pid, libc = int(sys.argv[1]), ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
pidfd = libc.syscall(434, pid, 0)
print(json.dumps({"pidfd_getfd": libc.syscall(438, pidfd, 0, 0) >= 0, "seize": libc.ptrace(0x4206, pid, None, None) == 0}))
"""


@pytest.mark.parametrize("real_gid", ["start", "account"])
def test_the_start_credentials_alone_keep_the_account_out_even_of_a_dumpable_process(
        privsep_daemon: PrivsepDaemon, real_gid: str) -> None:
    """Why ``fs.suid_dumpable`` does not matter to a worker's start: a process exec'd with real gid
    ``WORKER_START_GID`` and the account's gid as effective and saved gid, which then makes itself
    dumpable on purpose (what ``suid_dumpable`` 1 would leave it at that ``exec``), still cannot be
    ptraced or have a descriptor copied by a process of its account: the kernel's ptrace check wants
    the caller's gid to equal all three of the target's. The same process with the account's gid as
    all three is open to it (the control)."""
    pw = pwd.getpwuid(privsep_daemon.accounts["alice"].uid)
    gid = WORKER_START_GID if real_gid == "start" else pw.pw_gid

    def drop() -> None:
        os.setgroups([pw.pw_gid])
        os.setresgid(gid, pw.pw_gid, pw.pw_gid)
        os.setresuid(pw.pw_uid, pw.pw_uid, pw.pw_uid)
        ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS

    with subprocess.Popen([sys.executable, "-I", "-c", "import ctypes, sys; ctypes.CDLL(None).prctl(4, 1, 0, 0, 0); "
                           "print(flush=True); sys.stdin.read()"],  # PR_SET_DUMPABLE 1, then wait
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=drop) as target:
        assert target.stdout is not None and target.stdin is not None
        try:
            target.stdout.readline()
            assert os.stat(f"/proc/{target.pid}/status").st_uid == pw.pw_uid  # dumpable
            out = subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups",
                                  sys.executable, "-I", "-c", TRY, str(target.pid)],
                                 capture_output=True, text=True, timeout=60, check=True)
        finally:
            target.kill()
    opened = real_gid == "account"
    assert json.loads(out.stdout) == {"pidfd_getfd": opened, "seize": opened}
