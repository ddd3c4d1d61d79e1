"""Root and the policy process against a compromised front (code as the service user, speaking
to root's socket directly) and a compromised worker (docs/REFERENCE.md §4.5a, §5.3, §7.1;
docs/PRIVSEP.md §7): a privileged read past its deadline sends the front nothing afterwards, a
login root refuses is a failure like any other, a fresh login lists and finds what a reauth
grant covers, a filetype grant gives the worker no readable descriptor, a call with a bad token
is recorded with its tool and path, a removed principal's worker ends within seconds, and one
token cannot make root start workers without bound.

Each test plays the attacker for real; a flaw left open is a strict xfail naming the rule.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.common import identity
from mcpd.common.config import SAMPLE_BYTES
from mcpd.helper.wire import frames
from tests.support.osaccounts import AccountFactory
from tests.support.pam_login import enroll
from tests.support.privsep_fixture import SECRET_TEXT, PrivsepDaemon
from tests.support.workers import PRELUDE, login_daemon, wait_until_ready

pytestmark = pytest.mark.root

DEADLINE = 3  # workers.timeout_seconds here: a privileged read's deadline
ANSWER = 1.0  # login.answer_seconds here


def as_front(d: PrivsepDaemon, code: str, *args: str) -> Any:
    """Run :data:`PRELUDE` + ``code`` as the service user; the JSON it prints."""
    out = subprocess.run(["setpriv", f"--reuid={d.service.pw_uid}", f"--regid={d.service.pw_gid}", "--clear-groups",
                          sys.executable, "-I", "-c", PRELUDE + code, str(d.socket_path), *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def attacked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrivsepDaemon, AccountFactory]]:
    """The privsep daemon with a short privileged-read deadline and a fast PAM service."""
    with login_daemon(tmp_path_factory, DEADLINE, ANSWER) as pair:
        yield pair


# The front spawns alice's worker, queues forty unprivileged finds of its own on the worker's
# socket in one write (the worker serves the frames in its buffer before its control socket), then
# asks for a privileged read into that worker; it reads everything the worker sends it afterwards.
LATE_READ = r"""
token, path = sys.argv[2], sys.argv[3]
h = conn(sys.argv[1])
send(h, {"type": "spawn_worker", "id": 1, "token": token})
rep, fds = recv(h)
w = socket.socket(fileno=fds[0]); w.settimeout(60)
send(w, {"id": 0, "op": "files/list", "args": {"path": "/", "limit": 1}})  # the worker is up and serving
recv(w)
find = json.dumps({"id": 1, "op": "files/find", "args": {"root": "/", "name": "*no-such-name-zq*",
                                                          "time_budget_seconds": 8}}).encode()
w.sendall((struct.pack("!I", len(find)) + find) * 40)  # (many: a find of / may take well under a second)
time.sleep(0.5)  # it is inside the first find, the others in its buffer
send(h, {"type": "privileged_call", "id": 2, "token": token, "session": "s", "peer": "p", "op": "files/read",
         "args": {"path": path, "privileged": True}, "worker": rep["pid"], "rid": 77})
policy = recv(h)[0]
ids = []
while True:
    frame, _ = recv(w)
    if frame is None:
        break
    ids.append(frame.get("id"))
    if frame.get("id") == 77:
        break
print(json.dumps({"policy": policy, "ids": ids}))
"""


def test_a_privileged_read_past_its_deadline_sends_the_front_nothing_afterwards(
        attacked: tuple[PrivsepDaemon, AccountFactory]) -> None:
    """docs/REFERENCE.md §7.1 (a record gives the call's real outcome and bytes), high: the policy process
    recorded ``TIMEOUT`` with 0 bytes and left the worker holding the granted descriptor, which
    then read the file and sent the whole text to a front that did not kill it."""
    d, _ = attacked
    out = as_front(d, LATE_READ, d.tokens["alice"], str(d.log_file))
    assert out["policy"]["error"]["code"] == "TIMEOUT"
    assert 77 not in out["ids"]  # the worker was killed: the granted file's text never left it
    (rec,) = [r for r in d.audit() if r.get("requested_path") == str(d.log_file) and r.get("event") == "accept"]
    assert rec["outcome"] == "TIMEOUT" and rec["bytes"] == 0
    assert any(r.get("event") == "kill" and r.get("user") == "alice" for r in d.audit())


LOGINS = r"""
s = conn(sys.argv[1]); out = {}
for user in sys.argv[2:]:
    t = time.monotonic()
    send(s, {"type": "pam_login", "id": 1, "user": user, "password": "wrong-" + user, "peer": "192.0.2.7"})
    out[user] = {"reply": recv(s)[0], "seconds": time.monotonic() - t}
print(json.dumps(out))
"""


def test_a_login_root_refuses_is_a_failure_like_any_other(attacked: tuple[PrivsepDaemon, AccountFactory]) -> None:
    """docs/REFERENCE.md §5.3 (refused accounts answer in the time of a wrong password) and §7.1 (every login
    is a record), medium: an enrolled account with group 0 among its groups passed the policy's
    uid check, root's own guard refused its PAM conversation, and the ToolError skipped both the
    record and the answer time (and told the client ``never for root``)."""
    d, factory = attacked
    plain, _ = enroll(d, factory)
    wheel, _ = enroll(d, factory)
    subprocess.run(["usermod", "--append", "--groups", "root", wheel.name], check=True)
    time.sleep(1.5)  # users.yaml is seen again within a second
    out = as_front(d, LOGINS, plain.name, wheel.name)
    for acct in (plain, wheel):
        assert out[acct.name]["reply"] == {"ok": False, "id": 1}
        assert out[acct.name]["seconds"] >= ANSWER - 0.05
        (rec,) = [r for r in d.audit() if r.get("tool") == "login" and r.get("os_user") == acct.name]
        assert rec["decision"] == "reject"


LIST_AFTER_LOGIN = r"""
user, password, path = sys.argv[2], sys.argv[3], sys.argv[4]
s = conn(sys.argv[1])
send(s, {"type": "pam_login", "id": 1, "user": user, "password": password, "peer": "192.0.2.8"})
token = recv(s)[0]["token"]
out = {}
for op, key in (("files/list", "path"), ("files/find", "root")):
    send(s, {"type": "privileged_call", "id": 2, "token": token, "session": "s", "peer": "p", "op": op,
             "args": {key: path, "privileged": True}})
    out[op] = recv(s)[0]
print(json.dumps(out))
"""


def test_a_fresh_login_lists_and_finds_what_a_reauth_grant_covers(attacked: tuple[PrivsepDaemon, AccountFactory]) -> None:
    """docs/REFERENCE.md §4 (a granted privileged call is served as granted) and §7.1 (its record's bytes),
    low: the policy process granted a list or find under a ``reauth_after`` rule to a fresh
    password login, but the walker filtered every entry with the same rule as if the caller held a
    static token (reauthentication required), so the folder came back empty."""
    d, factory = attacked
    acct, password = enroll(d, factory)
    rule = {"allowed": True, "paths": [str(d.app)], "reauth_after": "5m"}
    grants = d.default_grants()
    grants["users"][acct.name] = {"privileged": {"tools": {"files/list": rule, "files/find": dict(rule)}}}
    d.write_grants(grants)
    time.sleep(1.5)  # users.yaml and the grants are seen again within a second
    out = as_front(d, LIST_AFTER_LOGIN, acct.name, password, str(d.app))
    assert [e["name"] for e in out["files/list"]["result"]["entries"]] == ["log.txt"]
    assert [m["path"] for m in out["files/find"]["result"]["matches"]] == [str(d.log_file)]


# Spawns a worker with the token argv[2] and prints its pid; then, for each path in argv[3:], waits
# for a line on stdin (the test has stopped the worker and holds its control socket meanwhile),
# asks for that path's privileged files/filetype and prints the policy process's reply.
FILETYPE = r"""
token = sys.argv[2]
h = conn(sys.argv[1])
send(h, {"type": "spawn_worker", "id": 1, "token": token})
rep, fds = recv(h)
print(json.dumps(rep["pid"]), flush=True)
for rid, path in enumerate(sys.argv[3:], 5):
    sys.stdin.readline()
    send(h, {"type": "privileged_call", "id": rid, "token": token, "session": "s", "peer": "p", "op": "files/filetype",
             "args": {"path": path, "privileged": True}, "worker": rep["pid"], "rid": rid})
    print(json.dumps(recv(h)[0]), flush=True)
"""


def what_a_filetype_worker_gets(d: PrivsepDaemon, token: str, paths: list[str]) -> list[tuple[dict[str, Any], list[int]]]:
    """Play alice's compromised worker for one privileged ``files/filetype`` call per path: stop
    the real worker, take (``pidfd_getfd``) its end of the policy process's control socket, and
    receive there the call's frame and every descriptor sent with it, exactly as the worker would;
    then report the call done as the worker would (the policy's reply must be ``ok``). Returns
    ``[(frame, descriptors)]`` (the caller closes the descriptors)."""
    from tests.support.root_channels import _grab_fd

    front = subprocess.Popen(["setpriv", f"--reuid={d.service.pw_uid}", f"--regid={d.service.pw_gid}", "--clear-groups",
                              sys.executable, "-I", "-c", PRELUDE + FILETYPE, str(d.socket_path), token, *paths],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert front.stdin is not None and front.stdout is not None
    got: list[tuple[dict[str, Any], list[int]]] = []
    pid = 0
    try:
        pid = json.loads(front.stdout.readline())
        for _ in range(200):  # the fork server's child may not have exec'd the worker yet
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"--ctl" in argv:
                break
            time.sleep(0.05)
        ctl_fd = int(argv[argv.index(b"--ctl") + 1])
        ctl = socket.socket(fileno=_grab_fd(pid, os.readlink(f"/proc/{pid}/fd/{ctl_fd}")))
        wait_until_ready(ctl)  # the worker reported itself hardened: what it runs from now on is "compromised"
        os.kill(pid, signal.SIGSTOP)
        ctl.settimeout(30)
        with ctl:
            for _ in paths:
                front.stdin.write("go\n")
                front.stdin.flush()
                frame, fds = frames.recv_frame_fds(ctl, frames.HELPER_REQUEST_CAP, 8)
                assert frame is not None
                got.append((frame, fds))
                frames.send_frame(ctl, {"id": frame["id"], "code": None, "bytes": 0})
                assert json.loads(front.stdout.readline())["ok"] is True
    finally:
        if pid:
            os.kill(pid, signal.SIGCONT)
        front.stdin.close()
        front.wait(timeout=30)
        front.stdout.close()
    return got


def test_a_filetype_grant_gives_the_worker_no_descriptor_it_could_read(attacked: tuple[PrivsepDaemon, AccountFactory]) -> None:
    """docs/REFERENCE.md §4.1/§4.5a (a privileged call gets what its tool's grant covers), medium: for
    ``files/filetype`` root opened a regular file ``O_RDONLY`` and the policy process handed that
    descriptor to the principal's worker, so a principal granted only ``files/filetype`` on a
    root-only file whose worker is compromised (it decodes attacker-written bytes) read the whole
    file, though no ``files/read`` grant covers it; non-regular files travelled as ``O_PATH``
    descriptors, which the worker could reopen through ``/proc/self/fd`` past the folders'
    permissions above them (a 0666 FIFO in a 0700 folder). Now the worker gets the file's facts as
    data, and for a regular file one sealed memfd holding the sample the op judges: at most
    ``SAMPLE_BYTES``, never the rest of the file; for anything else no descriptor at all."""
    d, _ = attacked
    folder = d.srv / "ft"
    folder.mkdir(mode=0o700)
    big, fifo = folder / "big.bin", folder / "pipe"
    big.write_bytes(b"x" * SAMPLE_BYTES + SECRET_TEXT.encode())  # the secret lies past the sample
    os.chmod(big, 0o600)
    os.mkfifo(fifo)
    os.chmod(fifo, 0o666)
    grants = d.default_grants()
    grants["users"][d.accounts["alice"].name]["privileged"]["tools"]["files/filetype"] = {
        "allowed": True, "paths": [str(big), str(fifo)]}
    d.write_grants(grants)
    time.sleep(1.5)
    try:
        (big_frame, big_fds), (fifo_frame, fifo_fds) = what_a_filetype_worker_gets(
            d, d.tokens["alice"], [str(big), str(fifo)])
        try:
            (fd,) = big_fds
            assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")  # not the file
            assert fifo_fds == []  # nothing to reopen past the 0700 folder
            assert os.pread(fd, 4 * SAMPLE_BYTES, 0) == b"x" * SAMPLE_BYTES
            assert os.fstat(fd).st_size == SAMPLE_BYTES
            seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
            assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & seals == seals
            st = big.stat()
            assert big_frame["facts"] == {"mode": st.st_mode, "size": st.st_size, "dev": st.st_dev, "ino": st.st_ino,
                                          "target": None}
            assert stat.S_ISFIFO(fifo_frame["facts"]["mode"])
        finally:
            for fd in big_fds + fifo_fds:
                os.close(fd)
    finally:
        d.write_grants(d.default_grants())
        shutil.rmtree(folder)


BAD_TOKEN_CALL = r"""
s = conn(sys.argv[1])
send(s, {"type": "privileged_call", "id": 1, "token": "mcpd_000000000000_" + "C" * 43, "session": "s13b",
         "peer": "p", "op": "files/read", "args": {"path": sys.argv[2], "privileged": True}})
print(json.dumps(recv(s)[0]))
"""


def test_a_privileged_call_with_a_bad_token_is_recorded_with_its_tool_and_path(
        attacked: tuple[PrivsepDaemon, AccountFactory]) -> None:
    """docs/REFERENCE.md §7.1 (a record names the call's tool and requested path), low: the refusal of a
    privileged call with an invalid token was recorded as tool ``privileged_call`` (the request
    type), without the route or the path it asked for."""
    d, _ = attacked
    reply = as_front(d, BAD_TOKEN_CALL, str(d.secret))
    assert reply["error"]["details"]["reason"] == "invalid token"
    (rec,) = [r for r in d.audit() if r.get("session") == "s13b"]
    assert (rec["tool"], rec["route"], rec["requested_path"], rec["decision"]) == (
        "files/read", "privileged", str(d.secret), "reject")


# Spawns a worker with the token argv[2], reads a world-readable file through it, says so, waits
# for a line on stdin (the test removes the principal meanwhile), waits argv[3] seconds, and reads
# again through the same worker: the text, or null when the worker is gone.
HELD_WORKER = r"""
h = conn(sys.argv[1])
send(h, {"type": "spawn_worker", "id": 1, "token": sys.argv[2]})
rep, fds = recv(h)
w = socket.socket(fileno=fds[0]); w.settimeout(30)
def read():
    try:
        send(w, {"id": 9, "op": "files/read", "args": {"path": "/etc/passwd", "limit": 5}})
        frame, _ = recv(w)
        if frame is not None and frame.get("text_frame"):  # the text follows as a raw frame
            n = struct.unpack("!I", w.recv(4, socket.MSG_WAITALL))[0]
            w.recv(n, socket.MSG_WAITALL)
        return None if frame is None else frame.get("ok")
    except OSError:
        return None
print(json.dumps(read()), flush=True)
sys.stdin.readline()
time.sleep(float(sys.argv[3]))
print(json.dumps(read()), flush=True)
"""


def add_principal(d: PrivsepDaemon, factory: AccountFactory, name: str) -> tuple[str, Path, dict[str, Any]]:
    """Bind a new principal ``name`` to a new account in users.yaml (seen within a second):
    ``(its token, the users file, the principals written)``."""
    from mcpd.common import identity

    acct = factory.user()
    path = d.state_dir / "users.yaml"
    users = identity.load_users(path)
    token, rec = identity.new_token()
    users[name] = identity.UserRecord(name=name, os_user=acct.name, tokens=[rec])
    identity.save_users(path, users)
    time.sleep(1.5)
    return token, path, users


def test_a_removed_principals_worker_ends_within_seconds_even_if_the_front_keeps_it(
        attacked: tuple[PrivsepDaemon, AccountFactory]) -> None:
    """docs/REFERENCE.md §5.3 (removing a principal ends its workers within seconds; docs/PRIVSEP.md §7: a
    compromised front keeps the workers it holds only until the policy process ends them), high:
    nothing on the root side ended them, so a compromised front went on reading with the account's
    rights through a worker it held, however long after the principal was removed."""
    from mcpd.common.identity import save_users

    d, factory = attacked
    token, path, users = add_principal(d, factory, "carol")
    with subprocess.Popen(["setpriv", f"--reuid={d.service.pw_uid}", f"--regid={d.service.pw_gid}", "--clear-groups",
                           sys.executable, "-I", "-c", PRELUDE + HELD_WORKER, str(d.socket_path), token, "5"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdin is not None
            assert json.loads(proc.stdout.readline()) is True  # carol's worker reads as her account
            del users["carol"]
            save_users(path, users)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline()) is None  # ended: nothing more is read as carol
        finally:
            proc.kill()


SPAWNS_OF = r"""
h = conn(sys.argv[1]); kept = []; replies = []
for token in sys.argv[2:]:  # bounded: one spawn per argument, the sockets kept so that every worker stays alive
    send(h, {"type": "spawn_worker", "id": len(replies) + 1, "token": token})
    rep, fds = recv(h)
    kept += fds
    replies.append(rep.get("ok"))
print(json.dumps(replies))
"""


def test_one_token_cannot_make_the_root_side_start_workers_without_bound(
        attacked: tuple[PrivsepDaemon, AccountFactory]) -> None:
    """docs/PRIVSEP.md §2 (workers pooled per account, ``workers.per_account``) and "nothing grows
    without bound", medium: the front's pool keeps at most ``per_account`` workers per account,
    but the policy process starts one for every ``spawn_worker`` a compromised front sends with one
    valid token. Each is a process in the helper's unit (not the front's, whose limits it escapes:
    about 20 MB each) and two descriptors in the policy process; a few hundred reach the helper
    unit's ``TasksMax=512``, which root, the policy process's threads, the walkers and every
    principal's workers share: then no worker or walker starts for anyone, and a new connection's
    thread cannot start in the policy process (an uncaught ``RuntimeError`` in its accept loop).
    Fixed: at most 4 x per_account workers per principal at once; more are refused."""
    d, _ = attacked
    replies = as_front(d, SPAWNS_OF, *[d.tokens["bob"]] * (4 * 4 + 1))
    assert replies == [True] * 16 + [False]
    assert any(r.get("reason") == "too many workers for one principal" for r in d.audit())


def test_principals_bound_to_one_account_each_have_their_own_bound_of_live_workers(
        attacked: tuple[PrivsepDaemon, AccountFactory]) -> None:
    """The root side's bound of live workers (4 x per_account) is per principal: two principals
    bound to one OS account each get their own (the front pools workers per principal), so one
    cannot take the other's; each is still refused past its own."""
    d, _ = attacked
    path = d.state_dir / "users.yaml"
    saved = path.read_bytes()
    users = identity.load_users(path)
    tokens = {}
    for name in ("carl1", "carl2"):
        tokens[name], rec = identity.new_token()
        users[name] = identity.UserRecord(name=name, os_user=users["bob"].os_user, tokens=[rec])
    identity.save_users(path, users)
    try:
        replies = as_front(d, SPAWNS_OF, *([tokens["carl1"]] * 16 + [tokens["carl2"]] * 16 + [tokens["carl1"]]))
    finally:
        path.write_bytes(saved)
    assert replies == [True] * 32 + [False]
