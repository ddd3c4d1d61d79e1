"""What a process of a principal's own OS account, or code inside one of its workers, can get
past the boundary. Real root helper, policy
process, front over TLS and OS accounts; attackers are processes of alice's account.

A *compromised worker* is played as in ``test_unread_workers.py``: the test, as root, takes
copies (``pidfd_getfd``) of a real, hardened worker's sockets once it reported itself ready,
stops the real worker for good and hands the copies to a process of alice's account, which then
does what code inside the worker could do with them.
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.policy.workers import UNTAKEN, UNTAKEN_MAX
from tests.support.osaccounts import AccountFactory
from tests.support.privsep_calls import bob_reads_on_both_routes, client, read_once, wait_for
from tests.support.privsep_fixture import LOG_TEXT, PrivsepDaemon, start_privsep, stop_privsep
from tests.support.workers import PRELUDE

pytestmark = pytest.mark.root

SECRET = "shadow-like secret: hunter2\nsecond line: s3cr3t\n"


@pytest.fixture(scope="module")
def daemon() -> Iterator[PrivsepDaemon]:
    """The privsep daemon; alice and bob granted files/read on the app folder, alice also
    files/filetype (only) on ``ftonly/secret.txt`` (root's, 0600, in a 0700 folder)."""
    factory = AccountFactory()
    d: PrivsepDaemon | None = None
    try:
        d = start_privsep(factory, workers={"per_account": 4, "timeout_seconds": 6, "spawn_burst": 16,
                                            "spawns_per_second": 40})
        (d.srv / "ftonly").mkdir(mode=0o700)
        (d.srv / "ftonly" / "secret.txt").write_text(SECRET)
        os.chmod(d.srv / "ftonly" / "secret.txt", 0o600)
        rule = {"allowed": True, "paths": [str(d.app)]}
        ftonly = {"allowed": True, "paths": [str(d.srv / "ftonly" / "secret.txt")]}
        d.write_grants({"users": {
            d.accounts["bob"].name: {"privileged": {"tools": {"files/read": dict(rule)}}},
            d.accounts["alice"].name: {"privileged": {"tools": {"files/read": dict(rule), "files/filetype": ftonly}}}}})

        def served() -> bool:
            try:
                return read_once(d, d.log_file, privileged=True, principal="bob") == (LOG_TEXT, {})
            except Exception:  # (503 while the policy process starts)
                return False

        wait_for(served, 60)
        yield d
    finally:
        if d is not None:
            stop_privsep(d)
        factory.cleanup()


def as_account(d: PrivsepDaemon, who: str, code: str, *args: str, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[str]:
    """``python -I -c code args`` as ``who``'s OS account (its uid, gid and groups)."""
    acct = d.accounts[who]
    return subprocess.Popen(["setpriv", f"--reuid={acct.uid}", f"--regid={acct.gid}", "--init-groups",
                             sys.executable, "-I", "-c", code, *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            pass_fds=pass_fds, cwd="/")


def as_front(d: PrivsepDaemon, code: str, *args: str) -> subprocess.Popen[str]:
    """:data:`PRELUDE` + ``code`` as the service user on the helper socket (argv[1])."""
    return subprocess.Popen(["setpriv", f"--reuid={d.service.pw_uid}", f"--regid={d.service.pw_gid}", "--clear-groups",
                             sys.executable, "-I", "-c", PRELUDE + code, str(d.socket_path), *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc``, reap it and close its pipes."""
    proc.kill()
    proc.wait(timeout=30)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def grab(pid: int, fd: int) -> int:
    """As root: a copy (``pidfd_getfd``) of descriptor ``fd`` of process ``pid``."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(434, pid, 0)  # pidfd_open
    assert pidfd >= 0, ctypes.get_errno()
    try:
        got = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd
        assert got >= 0, ctypes.get_errno()
        return int(got)
    finally:
        os.close(pidfd)


def take_over(pid: int, seconds: float = 30.0) -> tuple[int, int]:
    """As root: copies of worker ``pid``'s front socket (fd 3) and control socket (fd 4) once it
    reported itself hardened (its ready frame waits in the control socket); then the real worker
    is stopped for good. Returns ``(front, ctl)``."""
    ctl = grab(pid, 4)
    deadline = time.monotonic() + seconds
    while struct.unpack("i", fcntl.ioctl(ctl, termios.TIOCOUTQ, b"\0" * 4))[0] == 0:
        assert time.monotonic() < deadline, "the worker never reported itself hardened"
        time.sleep(0.01)
    os.kill(pid, signal.SIGSTOP)
    return grab(pid, 3), ctl


# As the front: spawns argv[4] workers for the token argv[2], prints their pids, waits for a line
# on stdin, then asks each for one privileged files/read of argv[3] and kills it; prints each
# reply's "ok" (or its error).
PARK = r"""
token, path, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
h = conn(sys.argv[1])
rid, pids, keep = 0, [], []
while len(pids) < n:
    rid += 1
    send(h, {"type": "spawn_worker", "id": rid, "token": token})
    rep, fds = recv(h)
    if not rep.get("ok"):
        err = rep.get("error") or {}
        if err.get("code") == "RATE_LIMITED":
            time.sleep(float((err.get("details") or {}).get("retry_after_seconds") or 0.2)); continue
        print(json.dumps({"spawn_error": err}), flush=True); sys.exit(0)
    pids.append(rep["pid"]); keep += fds
print(json.dumps(pids), flush=True)
sys.stdin.readline()
oks = []
for pid in pids:
    rid += 1
    send(h, {"type": "privileged_call", "id": rid, "token": token, "session": "s", "peer": "p",
             "op": "files/read", "args": {"path": path, "privileged": True}, "worker": pid, "rid": rid})
    rep = recv(h)[0]
    oks.append(True if rep.get("ok") else rep.get("error"))
    rid += 1
    send(h, {"type": "kill_worker", "id": rid, "token": token, "pid": pid})
    recv(h)
print(json.dumps(oks), flush=True)
"""

# alice's process that keeps the control sockets it receives on argv[1] and answers every call on
# them by peeking at it (MSG_PEEK: the call, and root's descriptor with it, stay in the socket) and
# reporting it done. Holds everything until stdin closes (at most 300 s).
COLLECT = r"""
import json, select, socket, struct, sys, time
chan = socket.socket(fileno=int(sys.argv[1]))
held, todo = [], {}
poller = select.poll()
poller.register(chan, select.POLLIN)
poller.register(sys.stdin, select.POLLIN)
end = time.monotonic() + 300
while time.monotonic() < end:
    ready = {fd for fd, _ in poller.poll(1000)}
    if sys.stdin.fileno() in ready:
        break
    if chan.fileno() in ready:
        msg, fds, _, _ = socket.recv_fds(chan, 16, 16)
        if not msg:
            break
        for fd in fds:
            s = socket.socket(fileno=fd)
            held.append(s); todo[fd] = s
            poller.register(fd, select.POLLIN)
    for fd in [fd for fd in ready if fd in todo]:
        s = todo[fd]
        try:
            data = s.recv(65536, socket.MSG_PEEK)
        except OSError:  # (reset: the policy process closed its end with the worker's ready frame unread)
            data = b""
        if not data:
            poller.unregister(fd)
            del todo[fd]
            continue
        if len(data) < 4 or len(data) < 4 + struct.unpack("!I", data[:4])[0]:
            continue
        call = json.loads(data[4:4 + struct.unpack("!I", data[:4])[0]])
        if "id" not in call:  # (the worker's own ready frame is not ours to see: it goes the other way)
            continue
        raw = json.dumps({"id": call["id"], "code": None, "bytes": 0}).encode()
        s.sendall(struct.pack("!I", len(raw)) + raw)
        poller.unregister(fd)
        del todo[fd]
print(json.dumps({"held": len(held), "unanswered": len(todo)}), flush=True)
"""


def test_descriptors_a_principals_account_leaves_untaken_are_bounded_per_principal(daemon: PrivsepDaemon) -> None:
    """Rule: a principal whose workers left ``UNTAKEN_MAX`` descriptors untaken in their control
    sockets (sent, never read: a peek leaves them in flight, counted by the kernel against the
    policy process's account and its RLIMIT_NOFILE, which bounds them for everyone) gets no more
    descriptors until they are released: its privileged reads are refused, each with a ``reject``
    record saying why; another principal is served on both routes; once the holder lets go, the
    principal is served again.

    Attack: each of alice's compromised workers hands its control socket to one long-lived
    process of her account, which answers its privileged read by peeking at the call and
    reporting it done."""
    d = daemon
    n = UNTAKEN_MAX + 4
    ours, theirs = socket.socketpair()
    collector = as_account(d, "alice", COLLECT, str(theirs.fileno()), pass_fds=(theirs.fileno(),))
    theirs.close()
    front = as_front(d, PARK, d.tokens["alice"], str(d.log_file), str(n))
    assert front.stdin is not None and front.stdout is not None
    seq = d.audit()[-1]["seq"]
    try:
        pids = json.loads(front.stdout.readline())
        assert isinstance(pids, list), pids
        for pid in pids:
            front_end, ctl = take_over(pid)
            os.close(front_end)
            socket.send_fds(ours, [b"c"], [ctl])
            os.close(ctl)
        front.stdin.write("go\n")
        front.stdin.flush()
        oks = json.loads(front.stdout.readline())
        bob = bob_reads_on_both_routes(d, times=2)
    finally:
        stop(front)
        assert collector.stdin is not None and collector.stdout is not None
        collector.stdin.close()
        held = collector.stdout.readline()
        collector.wait(timeout=30)
        collector.stdout.close()
        if collector.stderr is not None:
            collector.stderr.close()
        ours.close()
    assert json.loads(held or "{}").get("held") == n, held
    assert oks[:UNTAKEN_MAX] == [True] * UNTAKEN_MAX, oks
    refused = oks[UNTAKEN_MAX:]
    assert all(isinstance(e, dict) and e["code"] == "HELPER_UNAVAILABLE" and "untaken" in e["message"]
               for e in refused), refused
    recs = [r for r in d.audit() if r["seq"] > seq and r.get("tool") == "files/read" and r.get("user") == "alice"]
    assert [r["reason"] for r in recs if r["event"] == "reject"] == [UNTAKEN] * len(refused), recs
    assert bob == [("bob's note\n", {}), (LOG_TEXT, {})] * 2, bob
    # released (the holder ended): alice is served again
    assert read_once(d, d.log_file, privileged=True) == (LOG_TEXT, {})


# As an account of its own (the kernel counts descriptors in flight per user): fills its allowance
# of descriptors in flight (soft RLIMIT_NOFILE 64), then has the policy process's connection code
# answer a request with a socket to pass (as a spawn's reply does) on one end of a socketpair,
# then another reply without one; prints what the other end received.
FULL = r"""
import json, os, resource, socket, struct, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from mcpd.helper.wire import frames
from mcpd.policy.connections import Connection
sink_a, sink_b = socket.socketpair()
fd = os.open("/dev/null", os.O_RDONLY)
stuck = 0
try:
    while True:
        socket.send_fds(sink_a, [b"x"], [fd]); stuck += 1
except OSError as e:
    full = e.errno
ours, front = socket.socketpair()
conn = Connection(None, ours, "test", {})
seen = []
worker_end, _ = socket.socketpair()
conn.reply(1, {"ok": True, "pid": 7, "_fds": [worker_end], "_sent": seen.append})
conn.reply(2, {"ok": True})
front.settimeout(5)
ours.shutdown(socket.SHUT_WR)  # (a connection it ended shows as no reply at all)
got = [frames.recv_frame_fds(front, 4096, 4) for _ in range(2)]
print(json.dumps({"stuck": stuck, "errno": full, "sent": seen, "closed": worker_end.fileno() == -1,
                  "replies": [r for r, _ in got], "fds": [len(f) for _, f in got]}))
"""


def test_a_reply_whose_descriptors_cannot_be_passed_fails_alone(daemon: PrivsepDaemon) -> None:
    """Rule: when a reply's descriptors cannot be passed (the kernel's bound on descriptors in
    flight for the policy process's account, ``ETOOMANYREFS``: nothing of the reply was sent),
    that request alone fails (``INTERNAL_ERROR``, and a spawn's ``_sent`` hook hears it was not
    delivered, so the worker is killed and recorded ``spawn_failed``); the shared front
    connection goes on and carries the next reply."""
    p = as_account(daemon, "bob", FULL)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err[-2000:]
    got = json.loads(out)
    assert got["errno"] == 109 and got["stuck"] >= 64, got  # ETOOMANYREFS
    assert got["sent"] == [False] and got["closed"], got
    first, second = got["replies"]
    assert first is not None and first["id"] == 1 and first["ok"] is False and first["error"]["code"] == "INTERNAL_ERROR", got
    assert second == {"ok": True, "id": 2} and got["fds"] == [0, 0], got


def test_a_magic_file_in_the_accounts_home_is_not_loaded(daemon: PrivsepDaemon) -> None:
    """Rule: workers load libmagic's system database only, never a magic file of the account's
    (``$HOME/.magic``, ``$MAGIC``): a ``files/filetype`` grant gives a principal's account no
    byte of the file. Attack: a process of alice's account writes ``~/.magic`` whose rules print
    the sample's bytes into the description; alice asks a privileged ``files/filetype`` of a
    root-only file she has no read grant on."""
    d = daemon
    target = d.srv / "ftonly" / "secret.txt"
    got, err = read_once(d, target, privileged=True)
    assert got is None and err["code"] == "PERMISSION_DENIED", (got, err)  # no read grant
    rules = "0\tubelong\tx\tDUMP:%08x\n" + "".join(f">{off}\tubelong\tx\t\\b%08x\n" for off in range(4, 64, 4))
    planted = Path(d.accounts["alice"].home) / ".magic"
    writer = as_account(d, "alice", "import sys; open(sys.argv[1], 'w').write(sys.argv[2])", str(planted), rules)
    writer.communicate(timeout=60)
    assert writer.returncode == 0
    try:
        for pid in d.workers("alice"):  # a new worker loads libmagic's database anew
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not d.workers("alice"))

        async def go() -> dict[str, Any]:
            async with client(d, "alice") as c:
                res = await c.call_tool("files/filetype", {"path": str(target), "privileged": True}, check=False)
                return dict(res["structuredContent"])

        out = asyncio.run(go())
    finally:
        planted.unlink(missing_ok=True)
    description = str(out.get("description", ""))
    assert "DUMP:" not in description and out.get("mime") == "text/plain", out


# As alice: the worker's own hardening (mcpd.worker.main._harden, as a worker runs it before it
# serves), then what code inside a worker would try to keep a descriptor past the worker's end.
AFTER_HARDENING = r"""
import json, os, socket, subprocess, threading
from mcpd.worker import main as wm
a, b = socket.socketpair()
wm._harden({a.fileno()}, os.getppid())
out = {}
for name, start in (("fork", os.fork), ("subprocess", lambda: subprocess.run(["/bin/true"]).returncode),
                    ("posix_spawn", lambda: os.posix_spawn("/bin/true", ["true"], {})),
                    ("exec", lambda: os.execv("/bin/true", ["true"]))):
    try:
        if start() == 0 and name == "fork":
            os._exit(0)
        out[name] = "started"
    except OSError as e:
        out[name] = e.errno
seen = []
t = threading.Thread(target=lambda: seen.append(open("/etc/hostname").read() is not None)); t.start(); t.join()
out["thread"] = seen == [True]
print(json.dumps(out))
"""


def test_a_hardened_worker_starts_no_process(daemon: PrivsepDaemon) -> None:
    """Rule: once hardened a worker can start no process and exec nothing (a seccomp filter), so
    no helper process of a compromised worker keeps a descriptor root opened after the worker is
    killed or its token revoked; threads still work. Checked on the worker's own hardening run as
    alice, and on a real worker of hers (its ``/proc`` status shows the filter)."""
    d = daemon
    p = as_account(d, "alice", AFTER_HARDENING)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err[-2000:]
    assert out, "the hardened process exec'd /bin/true (nothing printed)"
    assert json.loads(out) == {"fork": 1, "subprocess": 1, "posix_spawn": 1, "exec": 1, "thread": True}, out
    assert read_once(d, d.log_file, privileged=True) == (LOG_TEXT, {})
    for pid in d.workers("alice"):
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
        assert status.get("Seccomp") == "2" and status.get("Seccomp_filters", "1") != "0", status.get("Seccomp")
