"""The root helper and the front as children of ``mcpd dev`` run as root.

Each child runs in its own session (the terminal's signals reach only ``mcpd dev``) and gets a
parent-death signal (:func:`die_with_this_process`), so the tree ends with ``mcpd dev``: a stop
signal stops it in order (:func:`supervise`: the front, then the helper, which stops the policy
process first, each SIGKILLed after :data:`STOP_SECONDS`); when ``mcpd dev`` dies without that
chance (SIGKILL, a crash, a second stop signal), the kernel SIGKILLs the helper and the front,
the policy process dies with the helper, the fork server when the helper's socket closes, and
the workers with the fork server, so the port and the folder's lock are free at once.

The folder and accounts they run with are :mod:`mcpd.admin.devroot`'s.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TextIO

from mcpd.admin.devstate import SERVICE_USER, DevRootError, DevState, RootSetup
from mcpd.admin.devstop import DevStop
from mcpd.common import config

HELPER_START_SECONDS = 30.0
STOP_SECONDS = 15.0
RESTART_DELAY_SECONDS = 1.0  # as systemd's RestartSec= would wait (the unit says 2 s)
RESTART_BURST = 5  # at most this many restarts ...
RESTART_WINDOW_SECONDS = 60.0  # ... in this many seconds, then give up (systemd's StartLimitBurst)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def stop_process(proc: subprocess.Popen[bytes], sig: int) -> int:
    """Send ``sig`` to ``proc`` unless it has exited, SIGKILL it after :data:`STOP_SECONDS`, and
    return its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_SECONDS)
    return proc.returncode


def die_with_this_process() -> Callable[[], None]:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets SIGKILL from the kernel when
    the calling process ends, however it ends (``PR_SET_PDEATHSIG``).

    The kernel sends it when the *thread* that started the child ends, so call ``Popen`` from the
    main thread only. ``Popen`` runs the function after its uid and gid change (which would clear
    the signal) and before ``exec`` (which keeps it for a program that is not set-uid); a child
    whose parent already ended (``getppid`` is no longer the caller) exits at once. Raises
    ``OSError`` in the child (``Popen`` then raises ``SubprocessError``) when ``prctl`` fails.
    """
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it

    def arm() -> None:
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # it ended before the line above took effect
            os._exit(1)

    return arm


def say(err: TextIO, text: str) -> None:
    """Write one line on ``err``, ignoring a terminal that has gone away."""
    try:
        err.write(text + "\n")
        err.flush()
    except (OSError, ValueError):
        pass


def spawn_helper(setup: RootSetup) -> subprocess.Popen[bytes]:
    """Start ``mcpd helper`` (root) with its log in ``<state>/helper.log``, in its own session (the
    terminal's signals reach only ``mcpd dev``), killed by the kernel if ``mcpd dev`` ends
    (:func:`die_with_this_process`); wait until its socket is there (mode 0660). Call from the
    main thread.

    Raises:
        DevRootError: the helper exited, or its socket did not appear within
            :data:`HELPER_START_SECONDS` seconds.
    """
    setup.socket_path.unlink(missing_ok=True)  # a previous helper's socket must not look ready
    with open(setup.helper_log, "ab") as log:
        os.fchmod(log.fileno(), 0o600)
        proc = subprocess.Popen(
            [sys.executable, "-m", "mcpd.admin.cli", "helper", "--config", str(setup.config_path)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=setup.config_path.parent,
            start_new_session=True, preexec_fn=die_with_this_process(),
        )
    try:
        deadline = time.monotonic() + HELPER_START_SECONDS
        while True:
            try:
                st = os.lstat(setup.socket_path)
                if stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660:
                    return proc
            except FileNotFoundError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise DevRootError(f"the root helper did not start (exit {proc.poll()}); see {setup.helper_log}")
            time.sleep(0.05)
    except BaseException:
        stop_process(proc, signal.SIGTERM)
        raise


def spawn_front(state: DevState) -> subprocess.Popen[bytes]:
    """Start ``mcpd serve`` as the service user (uid, gid, no supplementary groups) in its own
    session, killed by the kernel if ``mcpd dev`` ends (:func:`die_with_this_process`). Its
    stdout and stderr are this process's. Call from the main thread."""
    service = pwd.getpwnam(SERVICE_USER)
    return subprocess.Popen(
        [sys.executable, "-m", "mcpd.front.server", "--config", str(state.config_path)],
        stdin=subprocess.DEVNULL, cwd=state.state_dir, start_new_session=True,
        user=service.pw_uid, group=service.pw_gid, extra_groups=[],
        env={"PATH": os.defpath, "LANG": "C.UTF-8", "HOME": "/"},
        preexec_fn=die_with_this_process(),
    )


class _Child:
    """A child process and its pidfd (readable once it has exited), for ``select``."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.fd = os.pidfd_open(proc.pid)

    def fileno(self) -> int:
        return self.fd

    def reap(self) -> int:
        """Wait for the process (it has exited, or is being stopped) and close the pidfd."""
        code = self.proc.wait()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        return code


def supervise(state: DevState, setup: RootSetup, helper: subprocess.Popen[bytes], err: TextIO = sys.stderr) -> int:
    """Run the front (:func:`spawn_front`) and keep the root helper ``helper`` running, in this
    process's main thread, until the front exits (its code) or a :class:`DevStop` arrives (0 once
    the front stopped cleanly). As systemd would in production, a helper that exits is started
    again after :data:`RESTART_DELAY_SECONDS`, except after exit 78 (a broken configuration) or
    more than :data:`RESTART_BURST` restarts in :data:`RESTART_WINDOW_SECONDS`; each restart is
    said on ``err``. On leaving, the front then the helper get SIGTERM and, after
    :data:`STOP_SECONDS`, SIGKILL; should this process die first, the kernel kills both."""
    children = {"helper": _Child(helper)}
    restarts: list[float] = []
    restart_at: float | None = None
    try:
        front = children["front"] = _Child(spawn_front(state))
        while True:
            timeout = None if restart_at is None else max(0.0, restart_at - time.monotonic())
            ready = select.select(list(children.values()), [], [], timeout)[0]
            if front in ready:
                return front.reap()
            if "helper" in children and children["helper"] in ready:
                code = children.pop("helper").reap()
                now = time.monotonic()
                restarts = [t for t in restarts if now - t < RESTART_WINDOW_SECONDS] + [now]
                if code == config.EXIT_CONFIG:
                    say(err, f"# the root helper exited {code} (configuration); not restarted, see {setup.helper_log}")
                elif len(restarts) > RESTART_BURST:
                    say(err, f"# the root helper died {len(restarts)} times in {RESTART_WINDOW_SECONDS:g} s; "
                             f"not restarted again, see {setup.helper_log}")
                else:
                    say(err, f"# the root helper exited ({code}); restarting it in {RESTART_DELAY_SECONDS:g} s")
                    restart_at = now + RESTART_DELAY_SECONDS
            elif restart_at is not None and time.monotonic() >= restart_at:
                restart_at = None
                try:
                    children["helper"] = _Child(spawn_helper(setup))
                    say(err, f"# the root helper runs again (pid {children['helper'].proc.pid})")
                except DevRootError as exc:
                    say(err, f"# {exc}")
    except DevStop:
        if "front" not in children:
            return 0
        code = stop_process(children["front"].proc, signal.SIGTERM)  # uvicorn's graceful stop
        return 0 if code in (0, -signal.SIGTERM) else code
    finally:
        for name in ("front", "helper"):  # the front first: it stops taking calls
            if name in children:
                stop_process(children[name].proc, signal.SIGTERM)
                children[name].reap()
