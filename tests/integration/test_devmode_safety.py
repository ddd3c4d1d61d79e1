"""A safe dev mode: a second `mcpd dev` on a busy port or state folder refuses and
leaves the first serving its token; a restart keeps the token (``--new-token`` replaces it); the
start-up text says whether privileged calls are on; as root, a helper that dies is restarted
(and its fork server, policy process and workers end with it); Ctrl-C leaves nothing running."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcpd.admin import devmode
from mcpd.common import identity
from tests.support.devtree import (
    Tree,
    base,  # noqa: F401  (fixture)
    start,
    stop,
)
from tests.support.net import free_port

BIN = Path(sys.executable).parent
DEADLINE = 60.0  # seconds for a start, a refusal or a restart


def refused(state: Path, port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "mcpd"), "dev", "--port", str(port), "--state-dir", str(state)],
                          cwd=state.parent, capture_output=True, text=True, timeout=DEADLINE)


def test_prepare_keeps_the_token_unless_a_new_one_is_asked_for(tmp_path: Path) -> None:
    first = devmode.prepare(tmp_path / "s", 9191)
    again = devmode.prepare(tmp_path / "s", 9191)
    assert again.token == first.token
    assert os.stat(tmp_path / "s" / devmode.TOKEN_FILE).st_mode & 0o777 == 0o600
    fresh = devmode.prepare(tmp_path / "s", 9191, new_token=True)
    users = identity.load_users(tmp_path / "s" / "users.yaml")
    assert fresh.token != first.token
    assert identity.verify(users, first.token) is None and identity.verify(users, fresh.token) is not None
    (tmp_path / "s" / devmode.TOKEN_FILE).write_text("mcpd_000000000000_" + "x" * 43 + "\n")  # not valid: replaced
    assert devmode.prepare(tmp_path / "s", 9191).token not in (fresh.token, "mcpd_000000000000_" + "x" * 43)


def test_second_dev_on_a_busy_port_or_folder_refuses_and_the_first_keeps_serving(base: Path) -> None:
    state, port = base / "dev-state", free_port()
    first = start(state, port)
    try:
        on = os.geteuid() == 0
        assert first.out.lines[-1].startswith(f"# privileged calls: {'ON' if on else 'OFF'}"), first.out.lines
        assert first.linuxctl("/etc/hosts").stdout == Path("/etc/hosts").read_bytes()
        users_before = (state / "users.yaml").read_bytes()

        busy_port = refused(base / "other-state", port)  # another folder, the same port
        assert busy_port.returncode == devmode.EXIT_BUSY and f"port {port}" in busy_port.stderr, busy_port.stderr
        assert not (base / "other-state" / "users.yaml").exists()  # refused before changing anything
        busy_folder = refused(state, free_port())  # the same folder, another port
        assert busy_folder.returncode == devmode.EXIT_BUSY and "in use by another" in busy_folder.stderr

        assert (state / "users.yaml").read_bytes() == users_before
        res = first.linuxctl("/etc/hosts")
        assert res.returncode == 0 and res.stdout == Path("/etc/hosts").read_bytes(), res.stderr
    finally:
        assert stop(first) == (0, [])

    restarted = start(state, port)  # a restart keeps the token: the other shell's exports still work
    try:
        assert restarted.token == first.token
        assert restarted.linuxctl("/etc/hosts", token=first.token).returncode == 0
    finally:
        assert stop(restarted) == (0, [])
    renewed = start(state, port, "--new-token")
    try:
        assert renewed.token != first.token
        assert renewed.linuxctl("/etc/hosts").returncode == 0
        denied = renewed.linuxctl("/etc/hosts", token=first.token)
        assert denied.returncode == 3 and b"401" in denied.stderr, denied.stderr
    finally:
        assert stop(renewed) == (0, [])


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, timeout=10).stdout
    return [int(p) for p in out.split()]


@pytest.mark.root
def test_dev_as_root_restarts_a_root_helper_that_dies(base: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: only root runs the root helper")
    from mcpd.admin import devroot

    dev = start(base / "dev-state", free_port())
    sample = str(base / "dev-state" / "root-only" / "secret.txt")
    try:
        assert dev.linuxctl("--privileged", sample).stdout == devroot.SAMPLE_TEXT.encode()
        helpers = [p for p in _children(dev.pid) if os.stat(f"/proc/{p}").st_uid == 0]
        assert len(helpers) == 1, helpers
        old = Tree.of(helpers[0])  # the helper, its fork server, the policy process, the worker
        assert len(old.procs) >= 4 and {p.uid for p in old.procs} >= {0, pwd.getpwnam(devroot.DEV_ACCOUNT).pw_uid}
        os.kill(helpers[0], signal.SIGKILL)
        left = old.wait_gone()  # they end with the helper: parent-death signal, EOF on their sockets
        old.kill()
        assert not left, left
        deadline = time.monotonic() + DEADLINE
        while True:  # bounded: the restart is said on stderr, then privileged reads work again
            res = dev.linuxctl("--privileged", sample)
            if res.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert res.returncode == 0 and res.stdout == devroot.SAMPLE_TEXT.encode(), res.stderr
        now = [p for p in _children(dev.pid) if os.stat(f"/proc/{p}").st_uid == 0]
        assert len(now) == 1 and now[0] != helpers[0]
        said = dev.out.until("# the root helper runs again", timeout=DEADLINE)  # said on stderr
        assert any("restarting it" in line for line in said), said
    finally:
        assert stop(dev) == (0, [])
