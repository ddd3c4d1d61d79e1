"""Privilege separation v2 under attack (SPEC §4.5a; docs/PRIVSEP.md "threat model").

The front is assumed compromised: a test plays it by running code as the service user and
talking to the helper's socket directly. It holds some principals' tokens and tries to get more
than those tokens are granted. Other tests look at the processes themselves through ``/proc``:
who decodes the bytes of a privileged read, what the root side maps, what it opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.admin import devroot
from mcpd.client.api import MCPClientError, RPCError
from mcpd.common.config import POLICY_USER, WALK_USER
from mcpd.front.sessions.backpressure import CALLS_AT_ONCE
from mcpd.helper import forkserver

from tests.conftest import EVENT_TIMEOUT
from tests.support.privsep_fixture import (  # noqa: F401  (fixture)
    LOG_TEXT,
    HungWalks,
    SECRET_TEXT,
    PrivsepDaemon,
    children,
    privsep_daemon,
    proc_status,
)
from tests.support.privsep_calls import client, read, read_once, uid_pids, wait_for
from tests.support.root_channels import _grab_fd, as_front

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
    '{"type": "authenticate", "id": 1, "token": ' + "[" * 64 + "]" * 64 + "}",      # 65 levels: over SPEC's 64
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


@pytest.fixture
def find_granted(privsep_daemon: PrivsepDaemon) -> Iterator[PrivsepDaemon]:  # noqa: F811
    """alice may also list and find in ``app`` (restored to the fixture's grants afterwards)."""
    d = privsep_daemon
    tools = {t: {"allowed": True, "paths": [str(d.app)]} for t in ("files/read", "files/list", "files/find")}
    d.write_grants({"users": {d.accounts["alice"].name: {"privileged": {"tools": tools}}}})
    time.sleep(1.0)  # the helper re-reads the grants file when it changes
    try:
        yield d
    finally:
        d.write_grants(d.default_grants())
        time.sleep(1.0)


def _find(d: PrivsepDaemon, args: dict[str, Any], rid: int = 1) -> dict[str, Any]:
    (reply,) = as_front(d, [{"type": "privileged_call", "id": rid, "token": d.tokens["alice"], "session": "s",
                             "peer": "p", "op": "files/find", "args": {**args, "privileged": True}}])
    return reply


def _big_tree(d: PrivsepDaemon) -> Path:
    """``app/big``: 40 root-only folders of 500 root-only files (20,040 entries under it)."""
    big = d.app / "big"
    for i in range(40):
        sub = big / f"d{i:02d}"
        sub.mkdir(parents=True, mode=0o700)
        for j in range(500):
            (sub / f"f{j:03d}").touch(mode=0o600)
    os.chmod(big, 0o700)
    return big


def _walker_during(d: PrivsepDaemon, args: dict[str, Any], act: Any) -> tuple[dict[str, Any], int, float]:
    """Run a privileged find with ``args``; call ``act(pid)`` once on its walker (bounded wait).
    Returns (the reply, the walker's pid, seconds from ``act`` to the reply)."""
    replies: list[tuple[dict[str, Any], float]] = []
    finder = threading.Thread(target=lambda: replies.append((_find(d, args), time.monotonic())))
    finder.start()
    deadline, pid = time.monotonic() + 20, 0
    while not pid and finder.is_alive() and time.monotonic() < deadline:
        pid = next(iter(d.walkers()), 0)
        time.sleep(0.005)
    acted = time.monotonic()
    if pid:
        act(pid)
    finder.join(60)
    assert pid and replies, "no walker seen, or no reply"
    return replies[0][0], pid, replies[0][1] - acted


def test_a_hung_walker_is_killed_at_the_deadline(find_granted: PrivsepDaemon) -> None:
    """A walker that stops answering (SIGSTOP) is SIGKILLed through its pidfd at the call's
    deadline (time_budget_seconds + 5 s) and the call answers TIMEOUT."""
    d = find_granted
    big = _big_tree(d)
    try:
        reply, pid, waited = _walker_during(d, {"root": str(big), "time_budget_seconds": 1},
                                            lambda pid: os.kill(pid, signal.SIGSTOP))
    finally:
        shutil.rmtree(big)
    print(f"hung walker: TIMEOUT after {waited:.1f} s")
    assert reply["ok"] is False and reply["error"]["code"] == "TIMEOUT", reply
    assert 3.0 < waited < 15.0
    time.sleep(0.5)  # the fork server reaps it within its 0.5 s tick
    assert not Path(f"/proc/{pid}").exists()


def test_a_walker_that_dies_fails_only_its_call(find_granted: PrivsepDaemon) -> None:
    d = find_granted
    big = _big_tree(d)
    try:
        reply, _, waited = _walker_during(d, {"root": str(big), "name": "nomatch"},
                                          lambda pid: os.kill(pid, signal.SIGKILL))
    finally:
        shutil.rmtree(big)
    assert reply["ok"] is False and reply["error"]["code"] == "INTERNAL_ERROR" and waited < 3.0, reply
    assert _find(d, {"root": str(d.app)})["ok"] is True


def test_the_walker_of_a_privileged_find_holds_dac_read_search_only(find_granted: PrivsepDaemon) -> None:
    """During a privileged find on a big root-only tree, the process that walks is not root (all
    four uids), holds CAP_DAC_READ_SEARCH alone, has no_new_privs and no supplementary group, and
    holds no descriptor but its channel, /dev/null as 0-2 and the folders of its own walk."""
    d = find_granted
    big = _big_tree(d)
    replies: list[dict[str, Any]] = []
    started = time.monotonic()
    finder = threading.Thread(target=lambda: replies.append(_find(d, {"root": str(big), "name": "nomatch"})))
    finder.start()
    seen: list[tuple[dict[str, str], dict[int, str]]] = []  # (status, fd -> target), many per walker
    try:
        while finder.is_alive() and time.monotonic() - started < 30:
            for pid in d.walkers():
                try:
                    status = proc_status(pid)
                    fds = {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
                    if "mcpd.walker" in Path(f"/proc/{pid}/cmdline").read_text():
                        seen.append((status, fds))
                except OSError:
                    continue  # ended meanwhile
            time.sleep(0.01)
    finally:
        finder.join(60)
        shutil.rmtree(big)
    walking = [fds for _, fds in seen if any(t.startswith(str(big)) for t in fds.values())]
    print(f"privileged find over 20,040 entries: {time.monotonic() - started:.2f} s; "
          f"{len(seen)} looks at the walker, {len(walking)} while it held a folder of the walk")
    assert replies and replies[0]["ok"] is True and replies[0]["result"]["scanned"] == 20040, replies
    assert walking, "the walker was never seen walking"
    walk_uid = str(pwd.getpwnam(WALK_USER).pw_uid)
    for status, fds in seen:
        assert status["Uid"].split() == [walk_uid] * 4 and "0" not in status["Gid"].split()
        assert status["Groups"] == ""
        assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == 1 << 2  # CAP_DAC_READ_SEARCH
        assert status["NoNewPrivs"] == "1"
        assert [fds[i] for i in (0, 1, 2)] == ["/dev/null"] * 3, fds
        # at most one socket, its channel (gone already when the walker is seen after its reply)
        assert [fd for fd, t in fds.items() if not t.startswith("/")] in ([3], []), fds
        assert not [t for t in fds.values() if t.startswith(str(d.state_dir))], fds  # no audit log, no state
    for fds in walking:  # past start-up (the interpreter's own files): only the walk's folders
        assert all(t == str(big) or t.startswith(str(big) + "/") for fd, t in fds.items() if fd > 3), fds


def test_the_walker_account_cannot_write_root_files_or_signal_root(tmp_path: Path) -> None:
    """The walker's exact credentials (the fork server's own drop_to_walker, then exec): it lists a
    root-only folder, but cannot write or create a root-owned file, chmod it, or signal root."""
    devroot.ensure_system_account(WALK_USER)
    walker = pwd.getpwnam(WALK_USER)
    os.chmod(tmp_path, 0o700)
    target = tmp_path / "root-owned"
    target.write_text("root's\n")
    os.chmod(target, 0o644)
    probe = r"""
import json, os, sys
folder, target, root_pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
def attempt(fn):
    try:
        fn()
        return "done"
    except OSError as exc:
        return exc.__class__.__name__
print(json.dumps({
    "listed": sorted(os.listdir(folder)),
    "write": attempt(lambda: os.close(os.open(target, os.O_WRONLY))),
    "create": attempt(lambda: os.close(os.open(os.path.join(folder, "new"), os.O_WRONLY | os.O_CREAT, 0o600))),
    "chmod": attempt(lambda: os.chmod(target, 0o666)),
    "unlink": attempt(lambda: os.unlink(target)),
    "signal": attempt(lambda: os.kill(root_pid, 0)),
    "setuid": attempt(lambda: os.setuid(0)),
    "status": open("/proc/self/status").read(),
}))
"""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(wfd, 1)
            forkserver.drop_to_walker(walker.pw_uid, walker.pw_gid)
            os.execve(sys.executable, [sys.executable, "-I", "-c", probe, str(tmp_path), str(target),
                                       str(os.getppid())], {"PATH": os.defpath})
        finally:
            os._exit(127)
    os.close(wfd)
    with os.fdopen(rfd) as out:
        text = out.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text
    got = json.loads(text)
    assert got["listed"] == ["root-owned"]  # CAP_DAC_READ_SEARCH: any folder can be listed
    assert {k: got[k] for k in ("write", "create", "chmod", "unlink", "signal", "setuid")} == {
        "write": "PermissionError", "create": "PermissionError", "chmod": "PermissionError",
        "unlink": "PermissionError", "signal": "PermissionError", "setuid": "PermissionError"}
    caps = dict(line.split(":\t") for line in got["status"].splitlines() if line.startswith("Cap"))
    assert {k: int(v, 16) for k, v in caps.items() if k != "CapBnd"} == {
        "CapInh": 4, "CapPrm": 4, "CapEff": 4, "CapAmb": 4}
    assert target.read_text() == "root's\n" and stat.S_IMODE(target.stat().st_mode) == 0o644


def test_the_walker_answers_bad_arguments_with_the_same_codes(find_granted: PrivsepDaemon) -> None:
    """The helper checks only the path; the walker parses the rest with the tool's own checks, so a
    compromised front sending bad arguments gets INVALID_ARGUMENT as on the unprivileged route."""
    d = find_granted
    for rid, bad in enumerate([{"max_results": 0}, {"follow_symlinks": True}, {"type": "nonsense"},
                               {"time_budget_seconds": 61}, {"extra": 1}, {"name": "a\0b"}], 1):
        reply = _find(d, {"root": str(d.app), **bad}, rid)
        assert reply["ok"] is False and reply["error"]["code"] == "INVALID_ARGUMENT", (bad, reply)
    reply = _find(d, {"root": "relative"}, 9)
    assert reply["error"]["code"] == "INVALID_ARGUMENT"  # the path: checked by the helper itself
    assert _find(d, {"root": str(d.app)}, 10)["ok"] is True


@pytest.mark.parametrize("account", ["mcpd-no-such-walker", "root"])
def test_the_helper_refuses_to_start_without_a_non_root_walker_account(privsep_daemon: PrivsepDaemon,
                                                                        account: str) -> None:
    """Fail closed: no walker account, or one that is root, is a broken configuration (exit 78)."""
    d = privsep_daemon
    code = ("import sys; import mcpd.helper.wire.rootconf as c; c.WALK_USER = sys.argv[1]; "
            "from mcpd.helper.main import main; sys.exit(main(['--config', sys.argv[2]]))")
    proc = subprocess.run([sys.executable, "-I", "-c", code, account, str(d.config_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 78, proc.stderr
    assert "cannot start" in proc.stderr and (account in proc.stderr or "getpwnam" in proc.stderr), proc.stderr


# ------------------------------------------------------------------ kept descriptors, remembered decisions
# The policy process keeps the descriptors of privileged reads by path (mcpd/policy/opened.py) and
# remembers the decisions of static tokens per loaded grants file (grants.decide). A local user
# who can write in the granted folder, or an administrator changing grants or groups, changes
# things between two reads of one session: every answer must be what a fresh decision and a
# fresh open would give now.


def _policy_pid(d: PrivsepDaemon) -> int:
    uid = pwd.getpwnam(POLICY_USER).pw_uid
    (pid,) = children(d.helper_pid, uid)
    return pid


def _regrant(d: PrivsepDaemon, grants: dict[str, Any]) -> None:
    """Write the grants and wait (bounded) until the policy process has loaded them."""
    loaded = len([r for r in d.audit() if r.get("event") == "reload"])
    d.write_grants(grants)
    wait_for(lambda: len([r for r in d.audit() if r.get("event") == "reload"]) > loaded)


def _session(d: PrivsepDaemon, steps: list[tuple[Any, str, str]], principal: str = "alice") -> list[tuple[Any, str]]:
    """In one session, for each ``(change, tool, path)``: run ``change()``, then call ``tool`` on
    ``path`` privileged. Returns ``(text or structuredContent, error reason or code or "")`` each."""

    async def go() -> list[tuple[Any, str]]:
        out = []
        async with client(d, principal) as c:
            for change, tool, path in steps:
                change()
                if tool == "files/read":
                    text, err = await read(c, path, privileged=True)
                    out.append((text, err.get("details", {}).get("reason") or err.get("code", "")))
                else:
                    res = await c.call_tool(tool, {"path": str(path), "privileged": True}, check=False)
                    err = res["structuredContent"].get("error", {}) if res.get("isError") else {}
                    out.append((None if err else res["structuredContent"],
                                err.get("details", {}).get("reason") or err.get("code", "")))
        return out

    return asyncio.run(go())


def test_a_kept_file_unlinked_under_a_deleted_suffix_is_not_served_from_elsewhere(privsep_daemon: PrivsepDaemon) -> None:
    """The kernel names an unlinked file's descriptor ``PATH (deleted)``. A local user who can
    write in the granted folder names a file ``f (deleted)`` and has it read (its descriptor is
    kept under that path), renames it to ``f``, hard-links it to a place outside the grant and
    unlinks ``f``: the kept descriptor's link now reads exactly ``.../f (deleted)`` and its file
    has one hard link again, outside the grant. The next read of ``.../f (deleted)`` must answer
    what is at that path now (another file), never the bytes of the file now outside the grant."""
    d = privsep_daemon
    kept = d.app / "f (deleted)"
    outside = d.srv / "outside-grant"
    outside.mkdir()
    kept.write_text("granted text\n")

    def move_away() -> None:
        os.rename(kept, d.app / "f")
        os.link(d.app / "f", outside / "moved")
        os.unlink(d.app / "f")
        (outside / "moved").write_text(SECRET_TEXT)  # the same inode, now a secret outside the grant
        kept.write_text("the file at the path now\n")

    try:
        answers = _session(d, [(lambda: None, "files/read", str(kept)), (move_away, "files/read", str(kept))])
    finally:
        kept.unlink(missing_ok=True)
        shutil.rmtree(outside, ignore_errors=True)
    assert answers == [("granted text\n", ""), ("the file at the path now\n", "")]


def test_a_grant_removed_or_a_deny_added_between_two_reads_refuses_the_second(privsep_daemon: PrivsepDaemon) -> None:
    """A static token's decision is remembered per loaded grants file and the descriptor is
    kept: a reload that adds a deny, then one that removes the grant, refuses the very next call
    of the same session, for both tools."""
    d = privsep_daemon
    alice = d.accounts["alice"].name
    base = {"allowed": True, "paths": [str(d.app)]}
    _regrant(d, {"users": {alice: {"privileged": {"tools": {"files/read": base, "files/filetype": dict(base)}}}}})
    denied = dict(base, deny=[str(d.log_file)])
    steps = [(lambda: None, "files/read", str(d.log_file)), (lambda: None, "files/filetype", str(d.log_file)),
             (lambda: _regrant(d, {"users": {alice: {"privileged": {"tools": {
                 "files/read": denied, "files/filetype": dict(denied)}}}}}), "files/read", str(d.log_file)),
             (lambda: None, "files/filetype", str(d.log_file)),
             (lambda: _regrant(d, {"users": {alice: {"privileged": {"tools": {
                 "files/read": {"allowed": True, "paths": [str(d.srv / "elsewhere")]}}}}}}), "files/read", str(d.log_file))]
    try:
        answers = _session(d, steps)
    finally:
        _regrant(d, d.default_grants())
    assert answers[0] == (LOG_TEXT, "")
    assert answers[1][1] == "" and answers[1][0]["text"] is True
    assert answers[2:] == [(None, "path is denied by the grant"), (None, "path is denied by the grant"),
                           (None, "no grant covers this path")]


def test_another_principal_never_gets_a_descriptor_kept_for_alice(privsep_daemon: PrivsepDaemon) -> None:
    """alice's read keeps the descriptor; bob (no grant) asking for the same path, or for a
    secret through a path that cleans to one, is refused, and only alice's worker gets it."""
    d = privsep_daemon
    assert read_once(d, d.log_file, privileged=True) == (LOG_TEXT, {})
    for path in (str(d.log_file), f"{d.app}/./log.txt", f"{d.app}//log.txt"):
        text, err = read_once(d, path, privileged=True, principal="bob")
        assert text is None and err["details"]["reason"] == "no grant covers this path", path
    text, err = read_once(d, f"{d.app}/../secret", privileged=True)
    assert text is None and err["details"]["reason"] == "no grant covers this path"
    text, err = read_once(d, d.config_path.parent / "users.yaml", privileged=True)
    assert text is None and err["code"] == "PERMISSION_DENIED"
    assert SECRET_TEXT.strip() not in d.audit_text()


def test_paths_that_clean_to_the_kept_one_read_the_same_file(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    forms = [str(d.log_file), f"{d.app}//log.txt", f"{d.app}/./log.txt", f"{d.app}/x/../log.txt", f"{d.log_file}/"]
    answers = _session(d, [(lambda: None, "files/read", p) for p in forms])
    assert answers == [(LOG_TEXT, "")] * len(forms)


def test_many_granted_paths_keep_the_policy_process_descriptors_bounded(privsep_daemon: PrivsepDaemon) -> None:
    """150 distinct granted files read in one session (the kept descriptors churn, least recently
    used first) while the first one is read again and again: the policy process holds at most a
    bounded number of descriptors, and every answer is the right file."""
    d = privsep_daemon
    churn = d.app / "churn"
    churn.mkdir()
    for i in range(150):
        (churn / f"f{i}").write_text(f"file {i}\n")
    pid = _policy_pid(d)
    before = len(os.listdir(f"/proc/{pid}/fd"))
    steps, expected = [], []
    for i in range(150):
        steps.append((lambda: None, "files/read", str(churn / f"f{i}")))
        expected.append((f"file {i}\n", ""))
        if i % 10 == 0:
            steps.append((lambda: None, "files/read", str(d.log_file)))
            expected.append((LOG_TEXT, ""))
    try:
        answers = _session(d, steps)
        held = len(os.listdir(f"/proc/{pid}/fd"))
    finally:
        shutil.rmtree(churn, ignore_errors=True)
    assert answers == expected
    assert held <= before + 64 + 8, (before, held)


def test_filetype_and_read_after_a_kept_regular_file_became_a_fifo(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    alice = d.accounts["alice"].name
    base = {"allowed": True, "paths": [str(d.app)]}
    _regrant(d, {"users": {alice: {"privileged": {"tools": {"files/read": base, "files/filetype": dict(base)}}}}})
    target = d.app / "became-fifo"
    target.write_text("regular\n")

    def to_fifo() -> None:
        target.unlink()
        os.mkfifo(target, 0o600)

    try:
        answers = _session(d, [(lambda: None, "files/read", str(target)), (lambda: None, "files/filetype", str(target)),
                               (to_fifo, "files/filetype", str(target)), (lambda: None, "files/read", str(target))])
    finally:
        target.unlink(missing_ok=True)
        _regrant(d, d.default_grants())
    assert answers[0] == ("regular\n", "")
    assert (answers[1][0]["type"], answers[1][0]["text"]) == ("file", True)
    assert (answers[2][0]["type"], answers[2][0]["mime"], answers[2][0].get("text")) == ("fifo", "inode/fifo", None)
    assert answers[3] == (None, "NOT_A_REGULAR_FILE")


def test_an_account_removed_from_a_group_loses_the_groups_grant_within_seconds(privsep_daemon: PrivsepDaemon) -> None:
    """A group grant, a read (decision remembered, descriptor kept), then the account leaves the
    group: within a few seconds the same session is refused. (Joining the group takes effect within
    the same few seconds: an earlier test's read may have left the account's old groups cached.)"""
    d = privsep_daemon
    alice = d.accounts["alice"].name
    group = f"mcpdg{os.urandom(3).hex()}"
    subprocess.run(["groupadd", group], check=True, timeout=30)
    subprocess.run(["gpasswd", "-a", alice, group], check=True, timeout=30, capture_output=True)
    try:
        _regrant(d, {"groups": {group: {"privileged": {"tools": {"files/read": {"allowed": True,
                                                                                  "paths": [str(d.app)]}}}}}})

        async def go() -> tuple[Any, list[Any]]:
            async with client(d) as c:
                for _ in range(40):  # the account's groups, as an earlier read saw them, are kept up to 5 s
                    first = await read(c, d.log_file, privileged=True)
                    if first[0] is not None:
                        break
                    await asyncio.sleep(0.25)
                subprocess.run(["gpasswd", "-d", alice, group], check=True, timeout=30, capture_output=True)
                later = []
                for _ in range(40):  # bounded: 40 reads, 0.25 s apart
                    later.append(await read(c, d.log_file, privileged=True))
                    if later[-1][0] is None:
                        break
                    await asyncio.sleep(0.25)
                return first, later

        first, later = asyncio.run(go())
    finally:
        subprocess.run(["groupdel", group], timeout=30, capture_output=True)
        _regrant(d, d.default_grants())
    assert first == (LOG_TEXT, {})
    assert later[-1][0] is None and later[-1][1]["details"]["reason"] == "no grant covers this path"
    assert len(later) <= 30  # GROUPS_SECONDS (5 s) at most, with room for a slow machine


def test_a_compromised_workers_flags_on_its_descriptor_do_not_reach_another_principals_read(
        privsep_daemon: PrivsepDaemon) -> None:
    """alice and bob are both granted the app folder. alice's worker, compromised (a bug in the
    reading core), sets ``O_DIRECT`` on the descriptor of its privileged read (a flag of the open
    file description, not of the descriptor). The test plays it on the very description alice's
    worker was handed (taken from the policy process, which kept it). bob's next read of the same
    path must not be affected by what alice's worker did: each principal's worker is its own."""
    import fcntl

    d = privsep_daemon
    rule = {"allowed": True, "paths": [str(d.app)]}
    _regrant(d, {"users": {d.accounts[p].name: {"privileged": {"tools": {"files/read": dict(rule)}}}
                           for p in ("alice", "bob")}})
    try:
        assert read_once(d, d.log_file, privileged=True) == (LOG_TEXT, {})
        fd = _grab_fd(_policy_pid(d), str(d.log_file))
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)  # what alice's worker can do
        finally:
            os.close(fd)
        assert read_once(d, d.log_file, privileged=True, principal="bob") == (LOG_TEXT, {})
    finally:
        _regrant(d, d.default_grants())


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> None:
    """``renameat2(a, b, RENAME_EXCHANGE)``: both names swap at once (the kernel's atomic swap)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(a))


def test_two_principals_reading_while_folders_and_files_are_exchanged_never_get_the_secret(
        privsep_daemon: PrivsepDaemon) -> None:
    """alice and bob, both granted the app folder, read the same kept path in their own sessions
    while a local user swaps (RENAME_EXCHANGE) the file's folder with one outside the grant whose
    ``f`` is a symlink to the secret, and the file with a sibling. Every answer is one of the two
    granted files or a refusal; the secret never. Bounded in reads and time."""
    from tests.support.privsep_calls import RACE_SECONDS

    d = privsep_daemon
    rule = {"allowed": True, "paths": [str(d.app)]}
    _regrant(d, {"users": {d.accounts[p].name: {"privileged": {"tools": {"files/read": dict(rule)}}}
                           for p in ("alice", "bob")}})
    sub, out = d.app / "xsub", d.srv / "xout"
    sub.mkdir()
    (out / "xsub").mkdir(parents=True)
    (sub / "f").write_text("granted A\n")
    (sub / "g").write_text("granted B\n")
    (out / "xsub" / "f").symlink_to(d.secret)
    stop, swaps = threading.Event(), [0]

    def swapper() -> None:
        while not stop.is_set() and swaps[0] < 200000:
            _exchange(sub, out / "xsub")
            _exchange(sub, out / "xsub")
            _exchange(sub / "f", sub / "g")
            swaps[0] += 1

    seconds = min(RACE_SECONDS, 20.0)

    async def reader(principal: str) -> list[tuple[str | None, str]]:
        got: list[tuple[str | None, str]] = []
        end = time.monotonic() + seconds
        async with client(d, principal) as c:
            while time.monotonic() < end and len(got) < 2000:
                text, err = await read(c, sub / "f", privileged=True)
                got.append((text, err.get("details", {}).get("reason") or err.get("code", "")))
        return got

    async def both() -> list[list[tuple[str | None, str]]]:
        return list(await asyncio.gather(reader("alice"), reader("bob")))

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    try:
        results = asyncio.run(both())
    finally:
        stop.set()
        thread.join(10)
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(sub, ignore_errors=True)
        _regrant(d, d.default_grants())
    answers = [a for r in results for a in r]
    assert swaps[0] > 0 and all(len(r) > 0 for r in results)
    assert {t for t, _ in answers if t is not None} <= {"granted A\n", "granted B\n"}
    assert {why for t, why in answers if t is None} <= {"symlink in path", "path changed while opening",
                                                        "FILE_NOT_FOUND", "file has several hard links"}
    assert any(t is not None for t, _ in answers)
    assert SECRET_TEXT.strip() not in d.audit_text()


def test_a_kept_file_near_path_max_is_read_and_dropped_like_any_other(privsep_daemon: PrivsepDaemon) -> None:
    """A granted file whose path is close to PATH_MAX (4096 bytes) is read twice (kept), then its
    deepest folder is renamed away and back: each answer is what is at the path now."""
    d = privsep_daemon
    folder = d.app / "deep"
    while len(os.fsencode(str(folder))) < 4096 - 250 - 10:
        folder = folder / ("d" * 200)
    folder.mkdir(parents=True)
    target = folder / "f"
    target.write_text("deep\n")
    assert len(os.fsencode(str(target))) > 3800
    moved = folder.with_name("e" * 200)
    steps = [(lambda: None, "files/read", str(target)), (lambda: None, "files/read", str(target)),
             (lambda: os.rename(folder, moved), "files/read", str(target)),
             (lambda: os.rename(moved, folder), "files/read", str(target))]
    try:
        answers = _session(d, steps)
    finally:
        shutil.rmtree(d.app / "deep", ignore_errors=True)
    assert answers == [("deep\n", ""), ("deep\n", ""), (None, "FILE_NOT_FOUND"), ("deep\n", "")]


@pytest.fixture
def mount_point(privsep_daemon: PrivsepDaemon) -> Iterator[Path]:  # noqa: F811
    """A folder in the granted tree for a tmpfs, lazily unmounted (and removed) afterwards."""
    where = privsep_daemon.app / f"mnt-{os.urandom(3).hex()}"
    where.mkdir()
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)
        shutil.rmtree(where, ignore_errors=True)


def test_a_file_system_mounted_over_a_kept_files_folder_is_read_as_it_is_now(
        privsep_daemon: PrivsepDaemon, mount_point: Path) -> None:
    """The administrator mounts a file system over the folder of a kept file: the path now names
    the file on the new file system, and that is what the next read must answer (a fresh open
    would), not the file now hidden under the mount."""
    d, target = privsep_daemon, mount_point / "f"
    target.write_text("under the mount\n")

    def mount() -> None:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount_point)],
                       check=True, timeout=30)
        target.write_text("on the new file system\n")

    answers = _session(d, [(lambda: None, "files/read", str(target)), (mount, "files/read", str(target))])
    assert answers == [("under the mount\n", ""), ("on the new file system\n", "")]


def test_a_file_system_where_a_file_was_read_can_still_be_unmounted(
        privsep_daemon: PrivsepDaemon, mount_point: Path) -> None:
    """A privileged read of a file on a mounted file system, then the administrator unmounts it:
    nothing of mcpd keeps it busy for more than a few seconds once the call is over (the policy
    process closes a kept descriptor not handed out for ``IDLE_SECONDS``; polled for at most
    that + 5 s)."""
    d, target = privsep_daemon, mount_point / "f"
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount_point)],
                   check=True, timeout=30)
    target.write_text("on a removable file system\n")
    assert read_once(d, target, privileged=True) == ("on a removable file system\n", {})
    from mcpd.policy.opened import IDLE_SECONDS

    end = time.monotonic() + IDLE_SECONDS + 5
    while (done := subprocess.run(["umount", str(mount_point)], capture_output=True, text=True,
                                  timeout=30)).returncode != 0 and time.monotonic() < end:
        time.sleep(0.5)
    assert done.returncode == 0, done.stderr


# -- the privileged route: capacity and records (attack session 12) -------------------------------


@pytest.fixture
def everyone_granted(privsep_daemon: PrivsepDaemon) -> Iterator[PrivsepDaemon]:  # noqa: F811
    """alice may read, list and find in ``app``; bob may read and find there (restored afterwards)."""
    d = privsep_daemon
    rule = {"allowed": True, "paths": [str(d.app)]}

    def regrant(grants: dict[str, Any]) -> None:
        loaded = len([r for r in d.audit() if r.get("event") == "reload"])
        d.write_grants(grants)
        wait_for(lambda: len([r for r in d.audit() if r.get("event") == "reload"]) > loaded)

    def tools(*names: str) -> dict[str, Any]:
        return {"privileged": {"tools": {t: dict(rule) for t in names}}}

    regrant({"users": {d.accounts["alice"].name: tools("files/read", "files/list", "files/find"),
                       d.accounts["bob"].name: tools("files/read", "files/find")}})
    try:
        yield d
    finally:
        regrant(d.default_grants())


#: calls one session runs at once (each reserves a share of its outgoing queue); more wait for room
SESSION_CALLS = CALLS_AT_ONCE


def _hung_find(root: Path) -> dict[str, Any]:
    """A privileged find allowed to run 60 s (the most): hung, it outlasts any other call's deadline."""
    return {"root": str(root), "privileged": True, "time_budget_seconds": 60}


def _access(d: PrivsepDaemon) -> list[dict[str, Any]]:
    if not d.access_path.exists():
        return []
    return [json.loads(line) for line in d.access_path.read_text().splitlines() if line.strip()]


def test_one_principals_hung_privileged_finds_never_hold_up_anothers_privileged_read(
        everyone_granted: PrivsepDaemon) -> None:
    """A hung request never delays another session, and no principal takes the helper's capacity
    from the others: alice's 12 privileged finds (four in each of three sessions) hang on a hung
    folder (those past her share of the call connections are refused RATE_LIMITED at once, each
    with one record); bob's privileged read of a granted file is still answered."""
    d = everyone_granted

    async def go() -> tuple[str | None, dict[str, Any], list[dict[str, Any]]]:
        async with client(d, "alice") as a1, client(d, "alice") as a2, client(d, "alice") as a3:
            finds = [asyncio.create_task(s.call_tool("files/find", _hung_find(d.app), check=False))
                     for s in (a1, a2, a3) for _ in range(SESSION_CALLS)]
            await asyncio.sleep(3)  # sequencing only: the finds have reached their walkers
            done = [t.result() for t in finds if t.done()]
            async with client(d, "bob") as b:
                res = await b.call_tool("files/read", {"path": str(d.log_file), "privileged": True}, check=False)
            for task in finds:
                task.cancel()
            await asyncio.gather(*finds, return_exceptions=True)
        refused = [r["structuredContent"]["error"] for r in done]
        if res.get("isError"):
            return None, res["structuredContent"]["error"], refused
        return res["content"][0]["text"], {}, refused

    with HungWalks(d):
        text, err, refused = asyncio.run(go())
    assert (text, err) == (LOG_TEXT, {})
    assert refused and {e["code"] for e in refused} == {"RATE_LIMITED"}, refused
    assert "share" in refused[0]["message"] and "retry when one ends" in refused[0]["message"]
    records = [r for r in _access(d) if r.get("user") == "alice" and r.get("outcome") == "RATE_LIMITED"]
    assert len(records) == len(refused), records
    assert records[0]["decision"] == "reject" and records[0]["route"] == "privileged"


def test_a_privileged_call_refused_for_the_principals_cap_leaves_a_record(everyone_granted: PrivsepDaemon) -> None:
    """Every call on either route leaves exactly one record: alice has her share of privileged
    finds in flight (hung; four in each of two sessions, what one session runs at once); her
    next, from a third session, is RATE_LIMITED by the front, which never sent it on: the
    front's access log holds that refusal, once, and the helper's audit log nothing of it."""
    d = everyone_granted

    async def go() -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        async with client(d, "alice") as a1, client(d, "alice") as a2, client(d, "alice") as a:
            hung = [asyncio.create_task(s.call_tool("files/find", _hung_find(d.app), check=False))
                    for s in (a1, a2) for _ in range(SESSION_CALLS)]
            await asyncio.sleep(2)  # sequencing only: all 8 are in flight
            before = len(_access(d)), len(d.audit())
            res = await a.call_tool("files/find", _hung_find(d.app / "."), check=False)
            await asyncio.sleep(1)
            new_access, new_audit = _access(d)[before[0]:], d.audit()[before[1]:]
            for task in hung:
                task.cancel()
            await asyncio.gather(*hung, return_exceptions=True)
            return res["structuredContent"]["error"], new_access, new_audit

    with HungWalks(d):
        err, new_access, new_audit = asyncio.run(go())
    assert err["code"] == "RATE_LIMITED", err
    assert [r["outcome"] for r in new_access] == ["RATE_LIMITED"], new_access
    rec = new_access[0]
    assert (rec["user"], rec["tool"], rec["route"], rec["decision"]) == ("alice", "files/find", "privileged", "reject")
    assert rec["requested_path"] == str(d.app / ".") and rec["reason"] == err["message"]
    assert not [r for r in new_audit if r.get("tool") == "files/find"], new_audit


def test_a_privileged_read_that_never_reached_the_helper_leaves_a_record(everyone_granted: PrivsepDaemon) -> None:
    """Every call leaves one record, also one that waited for a connection to the root helper
    past its time: alice's 8 hung finds (two sessions) and bob's 4 (one session) hold every
    call connection; bob's next privileged read, from another session, waits its whole time for
    one and answers TIMEOUT saying so; it never reached the policy process, so the front records
    it (once)."""
    d = everyone_granted

    async def go() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        async with client(d, "alice") as a1, client(d, "alice") as a2, client(d, "bob") as b1, \
                client(d, "bob") as b:
            finds = [asyncio.create_task(s.call_tool("files/find", _hung_find(d.app), check=False))
                     for s in (a1, a2, b1) for _ in range(SESSION_CALLS)]
            await asyncio.sleep(3)  # sequencing only: the finds hold their connections
            before = len(_access(d)), len(d.audit())
            res = await b.call_tool("files/read", {"path": str(d.log_file), "privileged": True}, check=False)
            await asyncio.sleep(1)
            new = [r for r in _access(d)[before[0]:] + d.audit()[before[1]:]
                   if r.get("user") == "bob" and r.get("tool") == "files/read"]
            for task in finds:
                task.cancel()
            await asyncio.gather(*finds, return_exceptions=True)
            return res["structuredContent"]["error"], new

    with HungWalks(d):
        err, records = asyncio.run(go())
    assert err["code"] == "TIMEOUT" and "no connection to the root helper came free" in err["message"], err
    assert len(records) == 1 and records[0]["event"] == "access", records
    assert records[0]["outcome"] == "TIMEOUT" and records[0]["route"] == "privileged"


def test_a_call_waiting_behind_its_sessions_hung_calls_answers_within_its_deadline(
        everyone_granted: PrivsepDaemon) -> None:
    """A call must answer within its deadline: alice's session runs its four calls at once, all
    hung finds; her next call on it, a privileged read, waits for room in the session and is
    answered ``-32000`` (not run) once its deadline (``workers.timeout_seconds``, 20 s) passed,
    though the stream sent her client keep-alive comments meanwhile (every 15 s here), which
    took it to no answer at all; it never reached the privileged route, so no audit record."""
    d = everyone_granted

    async def go() -> tuple[BaseException | dict[str, Any], float, list[dict[str, Any]]]:
        async with client(d, "alice") as a:
            hung = [asyncio.create_task(a.call_tool("files/find", _hung_find(d.app), check=False))
                    for _ in range(SESSION_CALLS)]
            await asyncio.sleep(2)  # sequencing only: the finds run (hung)
            before, started = len(d.audit()), time.monotonic()
            try:
                out: BaseException | dict[str, Any] = await a.call_tool(
                    "files/read", {"path": str(d.log_file), "privileged": True}, check=False, timeout=40)
            except MCPClientError as exc:
                out = exc
            took = time.monotonic() - started
            new = [r for r in d.audit()[before:] if r.get("tool") == "files/read"]
            for task in hung:
                task.cancel()
            await asyncio.gather(*hung, return_exceptions=True)
            return out, took, new

    with HungWalks(d):
        out, took, audited = asyncio.run(go())
    assert isinstance(out, RPCError) and out.rpc_code == -32000 and "not run" in str(out), out
    assert took < 30, took  # its deadline is 20 s: it never waits on for as long as the client listens
    assert audited == [], audited


def test_a_privileged_read_whose_worker_dies_before_reading_is_audited(privsep_daemon: PrivsepDaemon) -> None:
    """Every privileged decision is one audit record: alice's workers are stopped, a granted
    privileged read is handed to one of them (root opened the file), and the worker is killed
    before it reads: the call answers INTERNAL_ERROR, its accept record (outcome INTERNAL_ERROR)
    is in the audit log, the front records nothing of it, and the helper logs no traceback; nor
    is the front's request to kill the dead worker an alert."""
    d = privsep_daemon
    uid = d.accounts["alice"].uid

    victims: list[int] = []

    async def go() -> dict[str, Any]:
        async with client(d) as c:
            first = await c.call_tool("files/read", {"path": str(d.log_file), "privileged": True}, check=False)
            assert not first.get("isError")
            victims[:] = uid_pids(uid)
            for pid in victims:
                os.kill(pid, signal.SIGSTOP)
            task = asyncio.create_task(c.call_tool("files/read", {"path": str(d.log_file), "privileged": True},
                                                   check=False))
            await asyncio.sleep(1.0)  # sequencing only: the grant reached a stopped worker
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            res = await asyncio.wait_for(task, EVENT_TIMEOUT)
            return res["structuredContent"]["error"]

    before, access_before, log_before = len(d.audit()), len(_access(d)), len(d.log("helper.log"))
    err = asyncio.run(go())
    assert err["code"] == "INTERNAL_ERROR"
    wait_for(lambda: any(r.get("tool") == "files/read" and r.get("outcome") == "INTERNAL_ERROR"
                         for r in d.audit()[before:]), seconds=5)
    failed = [r for r in d.audit()[before:] if r.get("tool") == "files/read" and r.get("outcome") == "INTERNAL_ERROR"]
    assert len(failed) == 1 and failed[0]["decision"] == "accept", failed
    assert not [r for r in _access(d)[access_before:] if r.get("tool") == "files/read"]
    assert "Traceback" not in d.log("helper.log")[log_before:]
    # the front then has the dead worker killed: the policy process may have reaped it already, no alert
    wait_for(lambda: {r.get("pid") for r in d.audit()[before:] if r.get("event") in ("exit", "kill")} & set(victims))
    assert not [r for r in d.audit()[before:] if r.get("event") == "alert"], d.audit()[before:]


def test_a_burst_of_one_principals_privileged_reads_past_its_share_is_queued_not_refused(
        privsep_daemon: PrivsepDaemon) -> None:
    """The share of the helper's call connections refuses only walks: 12 privileged reads of
    one principal at once (more than its share, 8) while its workers are stopped wait for their
    turn, and all are answered once the workers go on."""
    d = privsep_daemon
    uid = d.accounts["alice"].uid
    stopped: set[int] = set()
    done = threading.Event()

    def freeze() -> None:  # every worker of alice is stopped as it appears, until done
        end = time.monotonic() + 30
        while not done.is_set() and time.monotonic() < end:
            for pid in uid_pids(uid):
                if pid not in stopped:
                    os.kill(pid, signal.SIGSTOP)
                    stopped.add(pid)
            time.sleep(0.005)

    async def go() -> list[tuple[str | None, dict[str, Any]]]:
        async with client(d) as c:
            assert (await read(c, d.log_file, privileged=True)) == (LOG_TEXT, {})
            freezer = threading.Thread(target=freeze, daemon=True)
            freezer.start()
            try:
                reads = [asyncio.create_task(read(c, d.log_file, privileged=True)) for _ in range(12)]
                await asyncio.sleep(2)  # sequencing only: the reads hold or wait for connections
            finally:
                done.set()
                freezer.join(5)
                for pid in stopped:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGCONT)
            return list(await asyncio.wait_for(asyncio.gather(*reads), EVENT_TIMEOUT))

    answers = asyncio.run(go())
    assert answers == [(LOG_TEXT, {})] * 12, answers
