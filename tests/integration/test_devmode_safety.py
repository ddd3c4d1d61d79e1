"""A safe dev mode (issue 14): a second `mcpd dev` on a busy port or state folder refuses and
leaves the first serving its token; a restart keeps the token (``--new-token`` replaces it); the
start-up text says whether privileged calls are on; as root, a helper that dies is restarted."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mcpd.admin import devmode
from mcpd.common import identity
from tests.integration.test_devmode import free_port

BIN = Path(sys.executable).parent
DEADLINE = 60.0  # seconds for a start, a refusal or a restart


@dataclass
class Dev:
    proc: subprocess.Popen[str]
    lines: list[str]
    env: dict[str, str]
    err: queue.Queue[str] = field(default_factory=queue.Queue)
    pumps: list[threading.Thread] = field(default_factory=list)

    def linuxctl(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[bytes]:
        """``linuxctl get files ARGS`` with this instance's exports, retried while it is unreachable."""
        env = dict(self.env, **({"MCP_TOKEN": token} if token else {}))
        deadline = time.monotonic() + DEADLINE
        while True:
            res = subprocess.run([str(BIN / "linuxctl"), "get", "files", *args], env=env, capture_output=True,
                                 timeout=DEADLINE)
            if res.returncode != 4 or time.monotonic() > deadline or self.proc.poll() is not None:
                return res
            time.sleep(0.2)

    @property
    def token(self) -> str:
        return self.env["MCP_TOKEN"]


def _pump(stream: object, out: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        out.put(line)


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    """A folder for state folders; as root one the service user `mcpd` may enter (under /tmp)."""
    if os.geteuid() != 0:
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="mcpd-devsafe-", dir="/tmp"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start(state: Path, port: int, *extra: str) -> Dev:
    """Start `mcpd dev` and read its start-up text up to the privileged-calls line."""
    env = {k: v for k, v in os.environ.items() if k not in ("MCPD_URL", "MCP_TOKEN", "MCPD_CACERT")}
    env["XDG_CONFIG_HOME"] = str(state.parent / "xdg")
    proc = subprocess.Popen([str(BIN / "mcpd"), "dev", "--port", str(port), "--state-dir", str(state), *extra],
                            cwd=state.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: queue.Queue[str] = queue.Queue()
    dev = Dev(proc, [], env)
    dev.pumps = [threading.Thread(target=_pump, args=(proc.stdout, out), daemon=True),
                 threading.Thread(target=_pump, args=(proc.stderr, dev.err), daemon=True)]
    for pump in dev.pumps:
        pump.start()
    try:
        while not dev.lines or not dev.lines[-1].startswith("# privileged calls:"):
            dev.lines.append(out.get(timeout=DEADLINE))
    except BaseException:
        stop(dev)
        raise
    env.update(line.removeprefix("export ").strip().split("=", 1) for line in dev.lines[:3])
    return dev


def stop(dev: Dev) -> int:
    if dev.proc.poll() is None:
        dev.proc.send_signal(signal.SIGINT)
        try:
            dev.proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            dev.proc.kill()
    code = dev.proc.wait(timeout=15)
    for pump in dev.pumps:
        pump.join(timeout=15)
    for stream in (dev.proc.stdout, dev.proc.stderr):
        if stream is not None:
            stream.close()
    return code


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
        assert first.lines[-1].startswith(f"# privileged calls: {'ON' if on else 'OFF'}"), first.lines
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
        assert stop(first) == 0

    restarted = start(state, port)  # a restart keeps the token: the other shell's exports still work
    try:
        assert restarted.token == first.token
        assert restarted.linuxctl("/etc/hosts", token=first.token).returncode == 0
    finally:
        assert stop(restarted) == 0
    renewed = start(state, port, "--new-token")
    try:
        assert renewed.token != first.token
        assert renewed.linuxctl("/etc/hosts").returncode == 0
        denied = renewed.linuxctl("/etc/hosts", token=first.token)
        assert denied.returncode == 3 and b"401" in denied.stderr, denied.stderr
    finally:
        assert stop(renewed) == 0


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
        helpers = [p for p in _children(dev.proc.pid) if os.stat(f"/proc/{p}").st_uid == 0]
        assert len(helpers) == 1, helpers
        os.kill(helpers[0], signal.SIGKILL)
        deadline = time.monotonic() + DEADLINE
        while True:  # bounded: the restart is said on stderr, then privileged reads work again
            res = dev.linuxctl("--privileged", sample)
            if res.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert res.returncode == 0 and res.stdout == devroot.SAMPLE_TEXT.encode(), res.stderr
        now = [p for p in _children(dev.proc.pid) if os.stat(f"/proc/{p}").st_uid == 0]
        assert len(now) == 1 and now[0] != helpers[0]
        said = []
        while not dev.err.empty():
            said.append(dev.err.get())
        assert any("restarting it" in line for line in said), said
    finally:
        assert stop(dev) == 0
