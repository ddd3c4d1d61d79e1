"""The root helper against a compromised policy process (docs/REFERENCE.md §4.5a; docs/PRIVSEP.md).

The policy process (account ``mcpd-policy``) is the only peer root serves. These tests play a
policy process whose code an attacker runs: the test stops the real one (SIGSTOP), copies its
channel to root (fd 4, the first of its channels) with ``pidfd_getfd`` as root may, and speaks root's request table directly.
Whatever it asks, root never opens the daemon's own secrets, a device or a FIFO for reading,
never makes a worker as root or an unknown account, never runs PAM for root, never kills a process
it did not make, and ends (taking the policy and every worker with it) on a malformed request.
What a compromised policy process *can* do is asserted too, so the documented threat model stays
true: it can have root open any other file, as a decision it owns.
"""

from __future__ import annotations

import errno
import os
import pwd
import select
import socket
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from mcpd.common import frames
from mcpd.common.config import POLICY_USER
from tests.support.privsep_calls import read_once
from tests.support.privsep_fixture import (  # noqa: F401  (fixture)
    LOG_TEXT,
    PrivsepDaemon,
    children,
    privsep_daemon,
    proc_status,
)
from tests.support.root_channels import _ids, as_policy, policy_pid


def test_the_front_talks_to_an_unprivileged_policy_process_not_to_root(privsep_daemon: PrivsepDaemon) -> None:
    """The process behind the helper socket is mcpd-policy: no capability, no_new_privs, no
    supplementary group; root holds no socket the front can reach."""
    d = privsep_daemon
    policy = pwd.getpwnam(POLICY_USER)
    status = proc_status(policy_pid(d))
    assert status["Uid"].split() == [str(policy.pw_uid)] * 4 and status["Gid"].split() == [str(policy.pw_gid)] * 4
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0 and status["NoNewPrivs"] == "1"
    assert status["Groups"].strip() == ""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(d.socket_path))
        creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    assert int.from_bytes(creds[4:8], "little") == policy.pw_uid  # the peer's uid, from the kernel
    root_fds = {os.readlink(f"/proc/{d.helper_pid}/fd/{n}") for n in os.listdir(f"/proc/{d.helper_pid}/fd")}
    listening = [line.split()[6] for line in Path("/proc/net/unix").read_text().splitlines()[1:]
                 if line.split()[-1] == str(d.socket_path) and line.split()[5] == "01"]  # state 01: listening
    assert len(listening) == 1
    assert f"socket:[{listening[0]}]" not in root_fds  # root does not even hold the listening socket


def test_root_refuses_the_daemons_secrets_whatever_the_policy_asks(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    secrets = [d.config_path, d.state_dir / "users.yaml", d.grants_path, d.audit_path,
               d.state_dir / "tls" / "server.key", d.state_dir / "tls" / "ca.key"]
    with as_policy(d) as root:
        for path in secrets:
            for follow in (False, True):
                error = root.refused("open", path=str(path), follow=follow, want="file")
                assert error["code"] == "PERMISSION_DENIED" and error["details"]["reason"] == "daemon secret", path
        # and what a compromised policy process can do: any other file, root-only or not
        reply, fds = root.ask("open", path=str(d.log_file), follow=False, want="file")
        assert reply["ok"] is True and len(fds) == 1
        try:
            assert os.read(fds[0], 1 << 16) == LOG_TEXT.encode()
        finally:
            os.close(fds[0])
    assert read_once(d, d.log_file, privileged=True)[0] == LOG_TEXT  # the real policy goes on


def test_root_never_opens_a_device_or_a_fifo_for_reading(privsep_daemon: PrivsepDaemon, tmp_path: Path) -> None:
    d = privsep_daemon
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with as_policy(d) as root:
        for path in (fifo, Path("/dev/zero")):
            error = root.refused("open", path=str(path), follow=False, want="file")
            assert error["code"] == "NOT_A_REGULAR_FILE", error
        reply, fds = root.ask("open", path="/dev/zero", follow=False, want="any")  # filetype: an O_PATH handle only
        assert reply["ok"] is True and len(fds) == 1
        try:
            assert stat.S_ISCHR(os.fstat(fds[0]).st_mode)
            with pytest.raises(OSError) as info:
                os.read(fds[0], 1)
            assert info.value.errno == errno.EBADF  # O_PATH: the driver never ran
        finally:
            os.close(fds[0])
    with pytest.raises(OSError) as info:  # nobody ever opened the FIFO for reading
        os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    assert info.value.errno == errno.ENXIO


def test_root_makes_no_worker_and_runs_no_pam_for_root_or_an_unknown_account(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    with as_policy(d) as root:
        assert root.refused("spawn", user="root", limits="{}")["details"]["reason"] == "root account"
        assert root.refused("spawn", user="mcpd-no-such-account", limits="{}")["details"]["reason"] == "unknown OS account"
        for account in ("mcpd", POLICY_USER, "mcpd-walk"):  # the front's TLS key, the policy's tokens, ...
            assert root.refused("spawn", user=account, limits="{}")["details"]["reason"] == "daemon account"
        assert root.refused("pam", user="root", password="x")["details"]["reason"] == "root account"
        assert root.refused("config", path="/etc/shadow")["code"] == "PERMISSION_DENIED"
        reply, fds = root.ask("account", user="root")
        assert reply == {"ok": True, "usable": False, "id": reply["id"]} and fds == []
        reply, fds = root.ask("spawn", user=d.accounts["bob"].name, limits='{"default_bytes": 10}')
        try:
            assert reply["ok"] is True and len(fds) == 3
            deadline = time.monotonic() + 15
            while (worker := proc_status(reply["pid"]))["Uid"].split()[0] == "0":  # forked, not yet dropped
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert worker["Uid"].split() == [str(d.accounts["bob"].uid)] * 4 and int(worker["CapEff"], 16) == 0
        finally:
            for fd in fds:
                os.close(fd)
        root.ask("kill", pid=reply["pid"])


def test_root_kills_only_the_children_it_made(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    assert d.front is not None
    with as_policy(d) as root:
        for pid in (d.front.pid, 1, os.getpid(), policy_pid(d)):
            assert root.refused("kill", pid=pid)["details"]["reason"] == "unknown pid"
    assert d.front.poll() is None
    assert read_once(d, d.log_file, privileged=True)[0] == LOG_TEXT


@pytest.mark.parametrize("request_", [
    {"type": "open", "path": "/etc/hostname", "follow": False, "want": "file", "extra": 1},
    {"type": "open", "path": "/etc/hostname", "follow": 0, "want": "file"},
    {"type": "open", "path": "/etc", "follow": False, "want": "dir"},
    {"type": "spawn", "user": "x"},
    {"type": "setuid", "uid": 0},
    {"type": "kill", "pid": True},
])
def test_a_malformed_request_ends_the_helper_and_everything_it_started(
        privsep_daemon: PrivsepDaemon, request_: dict[str, Any]) -> None:
    """A policy process that breaks the table is treated as taken over: root stops (systemd
    restarts the service), and the policy and the workers go with it."""
    d = privsep_daemon
    read_once(d, d.log_file, privileged=True)  # a worker exists
    kids = children(d.helper_pid)
    kids += [g for k in kids for g in children(k)]  # the fork server's workers too
    assert len(kids) >= 3
    with as_policy(d) as root:
        frames.send_frame(root.sock, dict(request_, id=1))
        assert select.select([root.sock], [], [], 30)[0]
        assert frames.recv_frame_fds(root.sock, 4096, 4)[0] is None  # root closed the channel
    assert d.helper is not None and d.helper.wait(timeout=30) == 1
    deadline = time.monotonic() + 15
    while any(os.path.exists(f"/proc/{p}") and not proc_status(p)["State"].startswith("Z") for p in kids):
        assert time.monotonic() < deadline, "a child of the helper outlived it"
        time.sleep(0.1)
    d.start_helper()
    assert read_once(d, d.log_file, privileged=True)[0] == LOG_TEXT


def test_root_runs_one_pam_conversation_per_account_at_a_time(privsep_daemon: PrivsepDaemon) -> None:
    """A policy process used as a password oracle gets one guess per account per PAM failure
    delay: a second conversation for the same account while one runs is refused at once."""
    d = privsep_daemon
    bob = d.accounts["bob"].name
    with as_policy(d, channels=2) as root:  # two of root's threads at once
        pair = [root, root.others[0]]
        for channel in pair:
            frames.send_frame(channel.sock, {"type": "pam", "id": next(_ids), "user": bob, "password": "wrong"})
        replies = []
        for channel in pair:
            assert select.select([channel.sock], [], [], 30)[0]
            reply, fds = frames.recv_frame_fds(channel.sock, 1 << 20, 4)
            assert reply is not None and fds == []
            replies.append(reply)
    ran, busy = sorted(replies, key=lambda r: r["ok"], reverse=True)  # which one ran: the threads decide
    assert ran["ok"] is True and ran["pass"] is False and ran["code"] != 0
    assert busy["ok"] is False and busy["error"]["details"]["reason"] == "busy"
