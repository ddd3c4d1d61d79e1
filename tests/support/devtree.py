"""Running ``mcpd dev`` in a test, and checking that its whole process tree ends with it.

``mcpd dev``'s output is a pipe (or a pseudo-terminal) whose reading end only the test holds,
drained by a thread that waits with ``select`` (:class:`Output`): every wait is bounded, and
closing it never blocks, even while a process that outlived ``mcpd dev`` still holds the other
end (closing a buffered reader whose ``read`` blocks in another thread waits for that read, which
is how orphaned fronts once hung the suite).

A :class:`Tree` is a snapshot of ``mcpd dev`` and its descendants, each held by a pidfd (so a
reused pid is never mistaken for it, and a leftover is killed exactly), with the accounts and
sessions they run in. :meth:`Tree.leftovers` finds what is still alive of it: by pid, and by
account (a process of one of the tree's accounts in one of its sessions, or any process of a
dedicated account the test made for it).
"""

from __future__ import annotations

import errno
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import process_tree

BIN = Path(sys.executable).parent
START_SECONDS = 60.0  # for `mcpd dev` to print its start-up text, and for a call to be answered
END_SECONDS = 30.0  # for `mcpd dev` and every process of its tree to end once it is told to
PRIVILEGED_LINE = "# privileged calls:"


@dataclass(frozen=True)
class Proc:
    """One process as ``/proc`` shows it: pid, real uid, session id, command line."""

    pid: int
    uid: int
    sid: int
    cmdline: str


def proc_info(pid: int) -> Proc | None:
    """``pid``'s :class:`Proc`, or ``None`` when it is gone or a zombie (it has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as f:
            uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return Proc(pid=pid, uid=uid, sid=int(fields[3]), cmdline=cmdline)


def all_procs() -> list[Proc]:
    return [p for p in (proc_info(int(e)) for e in os.listdir("/proc") if e.isdigit()) if p is not None]


@dataclass
class Tree:
    """``mcpd dev`` and its descendants at one moment, each with a pidfd.

    Attributes:
        procs: the processes seen.
        pidfds: pid → pidfd (readable once that very process has ended).
        account: the uid of an account made for this ``mcpd dev`` alone, or ``None``.
    """

    procs: list[Proc]
    pidfds: dict[int, int]
    account: int | None = None

    @classmethod
    def of(cls, pid: int, account: int | None = None) -> Tree:
        procs, pidfds = [], {}
        for p in process_tree(pid):
            try:
                fd = os.pidfd_open(p)
            except OSError:
                continue
            info = proc_info(p)
            if info is None:
                os.close(fd)
                continue
            procs.append(info)
            pidfds[p] = fd
        return cls(procs, pidfds, account)

    @property
    def uids(self) -> set[int]:
        return {p.uid for p in self.procs}

    def by_uid(self, uid: int) -> list[Proc]:
        return [p for p in self.procs if p.uid == uid]

    def _alive(self, pid: int) -> bool:
        return not select.select([self.pidfds[pid]], [], [], 0)[0]

    def leftovers(self) -> list[Proc]:
        """What is still alive of the tree: a process seen (by pidfd), a process of one of its
        accounts in one of its sessions (a worker started after the snapshot), or any process
        of its own account."""
        mine = {os.getsid(0)}  # the test's own session is never the tree's
        sids = {p.sid for p in self.procs} - mine
        left = {p.pid: p for p in self.procs if self._alive(p.pid)}
        for p in all_procs():
            if (p.sid in sids and p.uid in self.uids) or (self.account is not None and p.uid == self.account):
                left.setdefault(p.pid, p)
        return list(left.values())

    def wait_gone(self, timeout: float = END_SECONDS) -> list[Proc]:
        """Wait (bounded) until nothing of the tree is alive; return what still is (empty: all gone)."""
        deadline = time.monotonic() + timeout
        while True:
            alive = [fd for pid, fd in self.pidfds.items() if self._alive(pid)]
            if alive:  # wait for the next of them to end
                select.select(alive[:1], [], [], max(0.0, min(1.0, deadline - time.monotonic())))
            left = self.leftovers()
            if not left or time.monotonic() > deadline:
                return left
            if not alive:
                time.sleep(0.1)  # only unseen leftovers: no pidfd to wait on

    def kill(self) -> None:
        """SIGKILL whatever is left of the tree (the seen processes through their pidfds, never a
        reused pid) and close the pidfds: a test leaves no process behind, even when it fails."""
        for _pid, fd in self.pidfds.items():
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.leftovers():
            if p.pid not in self.pidfds:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for fd in self.pidfds.values():
            os.close(fd)
        self.pidfds.clear()


class Output:
    """The reading end of ``mcpd dev``'s stdout and stderr (a pipe, or a pseudo-terminal's
    master; a terminal's ``\\r\\n`` reads as ``\\n``), drained by a thread as it comes, so the
    daemons never block on a full pipe. The thread waits with ``select`` on the descriptor and on
    a pipe of its own, so :meth:`close` stops it at once and then closes the descriptor, even
    while a process that outlived ``mcpd dev`` still holds the other end.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lines: list[str] = []  # every line read so far (by readline)
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._drain, name="dev-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        buf = b""
        while True:
            if self._wake_r in select.select([self.fd, self._wake_r], [], [])[0]:
                break
            try:
                chunk = os.read(self.fd, 65536)
            except OSError as exc:  # a terminal whose other side closed answers EIO
                if exc.errno != errno.EIO:
                    raise
                chunk = b""
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self._queue.put(line.decode(errors="replace").rstrip("\r") + "\n")
        self._queue.put(None)

    def readline(self, timeout: float) -> str | None:
        """The next line, or ``None`` at end of file or when ``timeout`` seconds pass first."""
        try:
            line = self._queue.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        if line is None:
            self._queue.put(None)  # stays at the end
            return None
        self.lines.append(line)
        return line

    def until(self, prefix: str, timeout: float = START_SECONDS) -> list[str]:
        """Read lines until one starts with ``prefix``; return all lines read so far.

        Raises:
            AssertionError: the output ended, or ``timeout`` seconds passed, first.
        """
        deadline = time.monotonic() + timeout
        while not self.lines or not self.lines[-1].startswith(prefix):
            if self.readline(deadline - time.monotonic()) is None:
                raise AssertionError(f"no line starting {prefix!r}; read: {''.join(self.lines)}")
        return self.lines

    def close(self) -> None:
        """Stop the thread, then close the descriptor (for a terminal's master: hang it up)."""
        if self.fd < 0:
            return
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=END_SECONDS)
        for fd in (self.fd, self._wake_r, self._wake_w):
            os.close(fd)
        self.fd = -1


@dataclass
class Dev:
    """A started ``mcpd dev``.

    Attributes:
        proc: the process the test started (``mcpd dev`` itself, or the shell it runs under).
        pid: ``mcpd dev``'s pid.
        out: its output.
        env: the environment with its three exports, for ``linuxctl``.
    """

    proc: subprocess.Popen[bytes]
    pid: int
    out: Output
    env: dict[str, str]
    account: int | None = None

    @property
    def exports(self) -> dict[str, str]:
        return {k: v for k, v in self.env.items() if k in ("MCPD_URL", "MCP_TOKEN", "MCPD_CACERT")}

    @property
    def token(self) -> str:
        return self.env["MCP_TOKEN"]

    def linuxctl(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[bytes]:
        """``linuxctl get files ARGS`` with its exports (``token`` instead of its own when given),
        retried while the front is not yet up (exit 4)."""
        env = dict(self.env, **({"MCP_TOKEN": token} if token else {}))
        deadline = time.monotonic() + START_SECONDS
        while True:
            res = subprocess.run([str(BIN / "linuxctl"), "get", "files", *args], env=env,
                                 capture_output=True, timeout=START_SECONDS, stdin=subprocess.DEVNULL)
            if res.returncode != 4 or time.monotonic() > deadline or self.proc.poll() is not None:
                return res
            time.sleep(0.2)

    def tree(self) -> Tree:
        return Tree.of(self.pid, self.account)

    def wait(self, timeout: float = END_SECONDS) -> int | None:
        """Wait (bounded) for the started process to end; its exit code, or ``None`` if it did not."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """Kill what the test started if it still runs, reap it and close its output."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=END_SECONDS)
        self.out.close()


def dev_env(state: Path, home: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MCPD_URL", "MCP_TOKEN", "MCPD_CACERT")}
    env["XDG_CONFIG_HOME"] = str(state.parent / "xdg")
    if home is not None:
        env["HOME"] = home
    return env


def start(state: Path, port: int, *extra: str, how: str = "direct", account: tuple[int, int, str] | None = None,
          state_arg: bool = True) -> Dev:
    """Start ``mcpd dev --port PORT --state-dir STATE [EXTRA]`` in ``STATE``'s parent folder and
    read its start-up text up to the privileged-calls line.

    Args:
        state_arg: pass ``--state-dir`` (else ``mcpd dev`` uses its default, ``./dev-state``).
        how: ``"direct"`` (its own session, output on a pipe), ``"terminal"`` (its own session with
            a pseudo-terminal as its controlling terminal and stdin/stdout/stderr: ``setsid
            --ctty``), or ``"background"`` (an asynchronous command of a non-interactive shell,
            ``bash -c 'mcpd dev ... & wait'``, which starts it with SIGINT ignored).
        account: ``(uid, gid, home)`` to run it as (root only), or ``None`` for the test's own.

    Raises:
        AssertionError: it did not print its start-up text within :data:`START_SECONDS`.
    """
    argv = [str(BIN / "mcpd"), "dev", "--port", str(port), *(["--state-dir", str(state)] if state_arg else []), *extra]
    env = dev_env(state, account[2] if account else None)
    ids = dict(user=account[0], group=account[1], extra_groups=[]) if account else {}
    if how == "terminal":
        master, slave = os.openpty()
        proc = subprocess.Popen(["setsid", "--ctty", *argv], stdin=slave, stdout=slave, stderr=slave,
                                cwd=state.parent, env=env, **ids)  # type: ignore[call-overload]
        os.close(slave)
        out = Output(master)
    else:
        r, w = os.pipe()
        if how == "background":
            script = 'dev="$1"; shift; "$dev" "$@" & echo "dev-pid $!"; wait'
            argv = ["bash", "-c", script, "bash", *argv]
        elif how != "direct":
            raise ValueError(how)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=w, stderr=w, cwd=state.parent, env=env,
                                start_new_session=True, **ids)  # type: ignore[call-overload]
        os.close(w)
        out = Output(r)
    dev = Dev(proc, proc.pid, out, env, account[0] if account else None)
    try:
        lines = out.until(PRIVILEGED_LINE)
        if how == "background":
            dev.pid = int(next(line for line in lines if line.startswith("dev-pid ")).split()[1])
        exports = [line for line in lines if line.startswith("export ")]
        for line in exports:
            name, value = line.removeprefix("export ").strip().split("=", 1)
            env[name] = value
    except BaseException:
        Tree.of(dev.pid, dev.account).kill()
        dev.close()
        raise
    return dev


def stop(dev: Dev, sig: int = signal.SIGINT) -> tuple[int | None, list[Proc]]:
    """Send ``sig`` to ``mcpd dev`` and wait (bounded) for it and its whole tree to end.

    Returns:
        ``(its exit code or None if it did not end, what was left of its tree)``; whatever was
        left is then killed, and the output closed.
    """
    tree = dev.tree()
    try:
        if dev.proc.poll() is None:
            os.kill(dev.pid, sig)
        code = dev.wait()
        return code, tree.wait_gone() if code is not None else tree.leftovers()
    finally:
        tree.kill()
        dev.close()


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
