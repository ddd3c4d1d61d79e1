"""The privileged find's walker (``mcpd-walk``), through the real privilege-separated daemon: killed
at its deadline, its death fails only its call, it holds CAP_DAC_READ_SEARCH and nothing else, its
account can neither write root's files nor signal root, it answers bad arguments with the
unprivileged codes, and root refuses to start without a non-root walker account."""

from __future__ import annotations

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
from mcpd.common.config import WALK_USER
from mcpd.helper import forkserver
from tests.support.privsep_fixture import PrivsepDaemon, privsep_daemon, proc_status  # noqa: F401  (fixture)
from tests.support.root_channels import as_front

pytestmark = pytest.mark.root


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
