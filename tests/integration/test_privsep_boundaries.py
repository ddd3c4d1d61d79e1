"""What a compromised front gets from the root side: no more than its tokens are granted
(docs/REFERENCE.md §4.5a; docs/PRIVSEP.md "threat model").

The front is assumed compromised: a test plays it by running code as the service user and
talking to the helper's socket directly. It holds some principals' tokens and tries to get more
than those tokens are granted. Other tests look at the processes themselves through ``/proc``:
who decodes the bytes of a privileged read, what the root side maps, what it opens.
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mcpd.common.config import POLICY_USER
from tests.support.privsep_calls import read_once
from tests.support.privsep_fixture import LOG_TEXT, PrivsepDaemon, children, privsep_daemon, proc_status  # noqa: F401  (fixture)
from tests.support.root_channels import as_front

pytestmark = pytest.mark.root


def alerts(d: PrivsepDaemon) -> list[dict[str, Any]]:
    return [r for r in d.audit() if r.get("event") == "alert"]


def test_spawn_without_or_with_a_wrong_token_is_refused(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    before = len(alerts(d))
    assert as_front(d, [{"type": "spawn_worker", "id": 1}]) == [{"closed": True}]  # no token: a schema break
    assert len(alerts(d)) == before + 1
    (reply,) = as_front(d, [{"type": "spawn_worker", "id": 1, "token": "mcpd_000000000000_" + "A" * 43}])
    assert reply["ok"] is False and reply["error"]["code"] == "PERMISSION_DENIED"
    (reply,) = as_front(d, [{"type": "spawn_worker", "id": 1, "token": d.tokens["alice"], "os_user": "bob"}])
    assert reply == {"closed": True}  # no way to name an account: only the token's principal counts


def test_spawned_worker_runs_as_the_tokens_principal_only(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    (reply,) = as_front(d, [{"type": "spawn_worker", "id": 7, "token": d.tokens["bob"]}])
    assert reply["ok"] is True and reply["id"] == 7
    status = proc_status(reply["pid"])
    assert status["Uid"].split()[0] == str(d.accounts["bob"].uid)
    spawns = [r for r in d.audit() if r.get("event") == "spawn" and r.get("pid") == reply["pid"]]
    assert spawns and spawns[0]["user"] == "bob"


def test_killing_another_principals_worker_is_refused_and_audited(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    assert read_once(d, d.log_file, privileged=True, principal="alice") == (LOG_TEXT, {})
    (victim,) = d.workers("alice")[:1]
    (reply,) = as_front(d, [{"type": "kill_worker", "id": 1, "token": d.tokens["bob"], "pid": victim}])
    assert reply["ok"] is False and reply["error"]["code"] == "PERMISSION_DENIED"
    assert proc_status(victim)  # still alive
    assert any(r.get("pid") == victim and r.get("event") == "alert" for r in d.audit())


def test_privileged_call_needs_a_valid_token_and_a_grant(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    call = {"type": "privileged_call", "session": "s", "peer": "p", "op": "files/list",
            "args": {"path": str(d.app), "privileged": True}}
    wrong, bob = as_front(d, [dict(call, id=1, token="mcpd_000000000000_" + "B" * 43),
                              dict(call, id=2, token=d.tokens["bob"])])
    assert wrong["error"]["details"]["reason"] == "invalid token"
    assert bob["error"]["code"] == "PERMISSION_DENIED"
    (alice,) = as_front(d, [dict(call, id=3, token=d.tokens["alice"])])
    assert alice["ok"] is True and any(e["name"] == "log.txt" for e in alice["result"]["entries"])


def test_content_call_into_another_principals_worker_is_refused(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    read_once(d, d.log_file, privileged=True, principal="bob")  # refused, but bob's worker was started
    (bob_worker,) = d.workers("bob")[:1]
    call = {"type": "privileged_call", "id": 1, "token": d.tokens["alice"], "session": "s", "peer": "p",
            "op": "files/read", "args": {"path": str(d.log_file), "privileged": True}, "worker": bob_worker, "rid": 1}
    (reply,) = as_front(d, [call])
    assert reply["ok"] is False and reply["error"]["details"]["reason"] == "not your worker"


@pytest.mark.parametrize("bad", [
    "[" * 100000 + "]" * 100000,                                   # nesting far past any parser's depth
    '{"type": "authenticate", "id": 1, "token": ' + "[" * 5000 + "]" * 5000 + "}",  # under the cap, past the parser
    '{"type": "authenticate", "id": 1, "token": ' + "[" * 64 + "]" * 64 + "}",      # 65 levels: over the reference's 64
    {"type": "authenticate", "id": 1, "token": "x", "extra": 1},   # unknown key
    {"type": "authenticate", "id": True, "token": "x"},            # wrong type
    {"type": "no_such_request", "id": 1},
    "not json",
])
def test_malformed_requests_are_alerts_and_the_helper_keeps_serving(privsep_daemon: PrivsepDaemon, bad: Any) -> None:
    d = privsep_daemon
    before = len(alerts(d))
    assert as_front(d, [bad]) == [{"closed": True}]
    assert len(alerts(d)) == before + 1
    (reply,) = as_front(d, [{"type": "authenticate", "id": 2, "token": d.tokens["alice"]}])
    assert reply["ok"] is True and reply["principal"]["name"] == "alice"


def test_a_half_sent_frame_times_out(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    script = ("import socket,struct,sys,time; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]);"
              "s.sendall(struct.pack('!I', 100) + b'{'); t=time.monotonic(); s.settimeout(30);"
              "print(s.recv(1) == b'' and time.monotonic() - t)")
    out = subprocess.run(["setpriv", f"--reuid={d.service.pw_uid}", f"--regid={d.service.pw_gid}",
                          "--clear-groups", sys.executable, "-I", "-c", script, str(d.socket_path)],
                         capture_output=True, text=True, timeout=60, check=True)
    assert 1.0 < float(out.stdout) < 20.0  # closed by the helper, after its frame timeout


def test_no_privileged_answer_reaches_the_client_when_its_audit_record_cannot_be_written(
        privsep_daemon: PrivsepDaemon) -> None:
    """The worker answers the front directly, but the front reads that answer only after the
    policy's grant, which comes after the audit write: an access without its record never
    reaches the client. The audit log's path is made a folder (the policy process cannot reopen
    it after a "rotation"), then put back."""
    d = privsep_daemon
    assert read_once(d, d.log_file, privileged=True) == (LOG_TEXT, {})
    moved = d.audit_path.with_name("audit.jsonl.moved")
    os.rename(d.audit_path, moved)
    os.mkdir(d.audit_path)
    try:
        text, error = read_once(d, d.log_file, privileged=True)
    finally:
        os.rmdir(d.audit_path)
        os.rename(moved, d.audit_path)
    assert text is None and error.get("code") == "INTERNAL_ERROR", (text, error)
    assert LOG_TEXT not in json.dumps(error)
    before = len([r for r in d.audit() if r.get("event") == "accept"])
    assert read_once(d, d.log_file, privileged=True) == (LOG_TEXT, {})  # the log back: served and recorded
    assert len([r for r in d.audit() if r.get("event") == "accept"]) == before + 1


def test_the_reader_of_a_privileged_read_is_unprivileged(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    assert read_once(d, d.log_file, privileged=True) == (LOG_TEXT, {})
    accept = [r for r in d.audit() if r.get("event") == "accept" and r.get("tool") == "files/read"][-1]
    assert accept["bytes"] == len(LOG_TEXT.encode())
    workers = d.workers("alice")
    assert workers
    for pid in workers:
        status = proc_status(pid)
        assert status["Uid"].split()[0] != "0"
        assert int(status["CapEff"], 16) == 0 and status["NoNewPrivs"].strip() == "1"
        assert os.sched_getscheduler(pid) == os.SCHED_BATCH  # its wake-ups do not preempt the front
    policy = children(d.helper_pid, pwd.getpwnam(POLICY_USER).pw_uid)
    assert len(policy) == 1
    threads = os.listdir(f"/proc/{policy[0]}/task")  # the threads it started (one per front connection) too
    assert len(threads) > 1 and {os.sched_getscheduler(int(t)) for t in threads} == {os.SCHED_BATCH}
    root_side = [d.helper_pid, *children(d.helper_pid, 0)]
    for pid in root_side:
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "libmagic" not in maps, pid


def _inotify_opens(path: str) -> tuple[int, Any]:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    assert fd >= 0 and libc.inotify_add_watch(fd, path.encode(), 0x20) >= 0  # IN_OPEN

    def count() -> int:
        try:
            return len(os.read(fd, 65536)) // 16
        except BlockingIOError:
            return 0

    return fd, count


@pytest.mark.parametrize("privileged", [False, True])
def test_dev_zero_is_never_opened(privsep_daemon: PrivsepDaemon, privileged: bool) -> None:
    d = privsep_daemon
    if privileged:
        d.write_grants({"users": {d.accounts["alice"].name: {"privileged": {"tools": {
            "files/read": {"allowed": True, "paths": ["/dev"]}, "files/filetype": {"allowed": True, "paths": ["/dev"]}}}}}})
        time.sleep(1.0)  # the helper re-reads the grants file when it changes
    fd, opens = _inotify_opens("/dev/zero")
    try:
        opens()
        text, err = read_once(d, "/dev/zero", privileged=privileged)
        assert text is None and err["code"] == "NOT_A_REGULAR_FILE" and err["details"]["type"] == "char device", err
        assert opens() == 0
    finally:
        os.close(fd)
        if privileged:  # the module's other tests rely on the fixture's own grants
            d.write_grants(d.default_grants())
            time.sleep(1.0)


@pytest.mark.parametrize("privileged", [False, True])
def test_a_fifos_blocked_writer_stays_blocked(privsep_daemon: PrivsepDaemon, privileged: bool, tmp_path: Path) -> None:
    d = privsep_daemon
    os.chmod(tmp_path, 0o755)
    for parent in tmp_path.parents:
        if parent == Path("/tmp"):
            break
        os.chmod(parent, 0o755)
    fifo = d.app / "pipe" if privileged else tmp_path / "pipe"  # the grant covers the app folder
    os.mkfifo(fifo, 0o666)
    released = threading.Event()

    def writer() -> None:
        try:
            fd = os.open(fifo, os.O_WRONLY)  # blocks until some process opens the FIFO for reading
            os.close(fd)
        except OSError:
            pass
        released.set()

    threading.Thread(target=writer, daemon=True).start()
    try:
        time.sleep(0.2)
        text, err = read_once(d, fifo, privileged=privileged)
        assert text is None and err["code"] == "NOT_A_REGULAR_FILE" and err["details"]["type"] == "fifo", err
        assert not released.wait(1.0)
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # let the writer go
        released.wait(5)
        fifo.unlink()
