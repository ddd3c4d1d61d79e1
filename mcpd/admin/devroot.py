"""``mcpd dev`` run as root: the root helper, the front as the service user (docs/PRIVSEP.md).

:func:`mcpd.admin.devmode.run` hands over to :func:`run`, which calls :func:`setup_root_state`,
starts the root helper (:func:`spawn_helper`) and runs the front beside it (:func:`supervise`).

The helper and the front are this process's children, each in its own session (the terminal's
signals reach only ``mcpd dev``), and the development tree ends with ``mcpd dev`` however it ends:

- SIGINT (even when inherited ignored, as in ``mcpd dev &`` from a script), SIGTERM and SIGHUP
  (a closed terminal) stop it in order: the front (uvicorn's graceful stop), then the helper (which
  stops the policy process first), each SIGKILLed after :data:`STOP_SECONDS`;
- when it dies without that chance (SIGKILL, a crash, a second SIGINT or SIGTERM while it
  stops), the kernel SIGKILLs the helper and the front, which were started with a parent-death
  signal (:func:`die_with_this_process`); the policy process dies with the helper (its own
  parent-death signal), the fork server ends when the helper's socket closes, and the workers
  die with the fork server (theirs), so the port and the folder's lock are free at once.

As root the state folder becomes::

    <state>/                 0751 root:mcpd   the front may enter and list; the policy enter
      mcpd.yaml              0640 root:mcpd   helper_socket run/helper.sock, audit in audit/
      server.key             0640 root:mcpd   the front's TLS key; ca.key stays 0600 root
      users.yaml             0600 root        principal ``dev`` → the unprivileged ``mcpd-dev``
      mcp-sudo.yaml          0600 root        example grant: mcpd-dev may read root-only/
      run/helper.sock        0660 root:mcpd   the helper's socket (folder 0750 root:mcpd)
      audit/audit.jsonl      0600 mcpd-policy (folder 0700 mcpd-policy, made by the helper)
      helper/                0700 mcpd-policy login tokens and lockout (made by the helper)
      root-only/secret.txt   0600 root        (folder 0700 root) the example's sample file

Accounts are created when missing, as system accounts without a login shell: ``mcpd`` (the
service user the helper accepts on its socket), ``mcpd-policy`` (the policy process),
``mcpd-walk`` (privileged list/find walkers) and ``mcpd-dev``.
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
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import yaml

from mcpd.common import config
from mcpd.common import identity
from mcpd.admin.devmode import DEV_PRINCIPAL, DevState, DevStop, print_exports, print_privileged, stop_signals

SERVICE_USER = "mcpd"
DEV_ACCOUNT = "mcpd-dev"
NOLOGIN = "/usr/sbin/nologin"
HELPER_START_SECONDS = 30.0
STOP_SECONDS = 15.0
SAMPLE_TEXT = "only root can read this file; the dev principal reads it through its grant\n"
_LOCK_RETRIES = 40


class DevRootError(Exception):
    """An account could not be created, or the root helper did not start."""


@dataclass(frozen=True)
class RootSetup:
    """What :func:`setup_root_state` made (absolute paths)."""

    config_path: Path
    socket_path: Path
    helper_log: Path
    sample_file: Path
    service: pwd.struct_passwd
    dev_account: pwd.struct_passwd


def ensure_system_account(name: str) -> pwd.struct_passwd:
    """Return account ``name``, creating it first when missing (``useradd --system``, own group,
    no home folder, shell ``/usr/sbin/nologin``). Retries while another process holds the passwd lock.

    Raises:
        DevRootError: ``useradd`` failed.
    """
    for _ in range(_LOCK_RETRIES):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
        proc = subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
             "--shell", NOLOGIN, name],
            capture_output=True, text=True, timeout=60, check=False,
        )
        if proc.returncode == 0 or "already exists" in proc.stderr:
            continue
        if "lock" not in proc.stderr.lower() and proc.returncode != 10:
            raise DevRootError(f"useradd {name} failed: {proc.stderr.strip()}")
        time.sleep(0.25)
    raise DevRootError(f"could not create account {name}: /etc/passwd stayed locked")


def _own(path: Path, uid: int, gid: int, mode: int) -> None:
    os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, mode, follow_symlinks=False)


def _folder(path: Path, gid: int, mode: int) -> None:
    path.mkdir(exist_ok=True)
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        raise DevRootError(f"{path} is not a folder")
    _own(path, 0, gid, mode)


def check_reachable(folder: Path, account: pwd.struct_passwd) -> None:
    """Check that ``account`` may enter every folder above ``folder`` (the front, running as the
    service user, must open its config and TLS files there).

    Raises:
        DevRootError: a parent folder is closed to the account (the message names it).
    """
    groups = set(os.getgrouplist(account.pw_name, account.pw_gid))
    for parent in folder.parents:
        st = os.stat(parent)
        if st.st_uid == account.pw_uid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid in groups:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
        if not ok:
            raise DevRootError(f"the account {account.pw_name} cannot enter {parent}: "
                               "choose a --state-dir whose parent folders others may enter")


def example_grants(folder: Path) -> dict[str, object]:
    """The example ``mcp-sudo.yaml`` (format: etc/mcpd/mcp-sudo.yaml): ``mcpd-dev`` may read and list ``folder``."""
    def rule() -> dict[str, object]:  # a fresh mapping per tool, so the YAML has no anchors
        return {"allowed": True, "paths": [str(folder)]}

    return {"users": {DEV_ACCOUNT: {"privileged": {"tools": {"files/read": rule(), "files/list": rule()}}}}}


def setup_root_state(state: DevState) -> RootSetup:
    """Make ``state``'s folder fit for privilege separation (see the module docstring).

    ``users.yaml`` keeps the ``dev`` token just issued but binds it to ``mcpd-dev``; an existing
    ``mcp-sudo.yaml`` is kept (only its owner and mode are fixed), a missing one gets the example.

    Raises:
        DevRootError: an account could not be created.
        OSError: the folder cannot be changed.
        identity.UsersFileError: ``users.yaml`` is malformed.
    """
    folder: Path = state.state_dir
    service = ensure_system_account(SERVICE_USER)
    dev = ensure_system_account(DEV_ACCOUNT)
    ensure_system_account(config.WALK_USER)
    policy = ensure_system_account(config.POLICY_USER)
    check_reachable(folder, service)
    check_reachable(folder, policy)
    _folder(folder, service.pw_gid, 0o751)
    _folder(folder / "run", service.pw_gid, 0o750)
    for own in (folder / "audit", folder / "helper"):  # the policy's own (an older dev folder had them root's)
        if own.is_dir() and not own.is_symlink() and own.stat().st_uid == 0:
            for path in [own, *own.iterdir()]:
                os.chown(path, policy.pw_uid, policy.pw_gid, follow_symlinks=False)
    (folder / "front").mkdir(exist_ok=True)  # the front's access log: the service user's own folder
    _own(folder / "front", service.pw_uid, service.pw_gid, 0o700)
    root_only = folder / "root-only"
    _folder(root_only, 0, 0o700)
    sample = root_only / "secret.txt"
    if not sample.exists():
        sample.write_text(SAMPLE_TEXT)
    _own(sample, 0, 0, 0o600)

    cfg_data = yaml.safe_load(state.config_path.read_text()) or {}
    cfg_data.update(helper_socket="run/helper.sock", audit_log="audit/audit.jsonl", helper_state_dir="helper",
                    service_user=SERVICE_USER, access_log="front/access.jsonl")
    with open(state.config_path, "w", encoding="utf-8") as f:
        f.write("# mcpd development configuration, written by `mcpd dev` as root (rewritten on each run)\n")
        yaml.safe_dump(cfg_data, f, sort_keys=False)
    _own(state.config_path, 0, service.pw_gid, 0o640)
    cfg = config.load(state.config_path)
    _own(Path(cfg.tls.key), 0, service.pw_gid, 0o640)
    for public in (Path(cfg.tls.cert), state.cacert):
        _own(public, 0, 0, 0o644)

    users = identity.load_users(cfg.users_file)
    record = users[DEV_PRINCIPAL]
    users[DEV_PRINCIPAL] = identity.UserRecord(name=record.name, os_user=DEV_ACCOUNT, tokens=record.tokens)
    identity.save_users(cfg.users_file, users)
    _own(Path(cfg.users_file), 0, 0, 0o600)
    grants = Path(cfg.grants_file)
    if not grants.exists():
        with open(grants, "w", encoding="utf-8") as f:
            f.write("# example grant written by `mcpd dev`; the format is explained in etc/mcpd/mcp-sudo.yaml.\n"
                    "# Edit it: the helper reloads it, and `mcpd grants check FILE` validates it.\n")
            yaml.safe_dump(example_grants(root_only), f, sort_keys=False)
    _own(grants, 0, 0, 0o600)
    return RootSetup(config_path=state.config_path, socket_path=Path(cfg.helper_socket),
                     helper_log=folder / "helper.log", sample_file=sample, service=service, dev_account=dev)


def _stop(proc: subprocess.Popen[bytes], sig: int) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_SECONDS)
    return proc.returncode


RESTART_DELAY_SECONDS = 1.0  # as systemd's RestartSec= would wait (the unit says 2 s)
RESTART_BURST = 5  # at most this many restarts ...
RESTART_WINDOW_SECONDS = 60.0  # ... in this many seconds, then give up (systemd's StartLimitBurst)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


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


def _say(err: TextIO, text: str) -> None:
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
        _stop(proc, signal.SIGTERM)
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
                    _say(err, f"# the root helper exited {code} (configuration); not restarted, see {setup.helper_log}")
                elif len(restarts) > RESTART_BURST:
                    _say(err, f"# the root helper died {len(restarts)} times in {RESTART_WINDOW_SECONDS:g} s; "
                              f"not restarted again, see {setup.helper_log}")
                else:
                    _say(err, f"# the root helper exited ({code}); restarting it in {RESTART_DELAY_SECONDS:g} s")
                    restart_at = now + RESTART_DELAY_SECONDS
            elif restart_at is not None and time.monotonic() >= restart_at:
                restart_at = None
                try:
                    children["helper"] = _Child(spawn_helper(setup))
                    _say(err, f"# the root helper runs again (pid {children['helper'].proc.pid})")
                except DevRootError as exc:
                    _say(err, f"# {exc}")
    except DevStop:
        if "front" not in children:
            return 0
        code = _stop(children["front"].proc, signal.SIGTERM)  # uvicorn's graceful stop
        return 0 if code in (0, -signal.SIGTERM) else code
    finally:
        for name in ("front", "helper"):  # the front first: it stops taking calls
            if name in children:
                _stop(children[name].proc, signal.SIGTERM)
                children[name].reap()


PAM_SERVICE = Path("/etc/pam.d/mcpd")
SHIPPED_PAM_SERVICE = Path(__file__).resolve().parents[2] / "etc" / "pam.d" / "mcpd"


def ensure_pam_service(err: TextIO, target: Path = PAM_SERVICE, shipped: Path = SHIPPED_PAM_SERVICE) -> bool:
    """Install the PAM service ``mcpd`` that ``linuxctl login`` needs (``target``, 0644 root),
    from the project's ``etc/pam.d/mcpd``, when the host has none; an existing one is never
    touched. Says on ``err`` what it did, or exactly how to do it. Returns whether one is there."""
    if os.path.lexists(target):
        return True
    try:
        data = shipped.read_bytes()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(target, 0o644)
    except OSError as exc:
        err.write(f"# no PAM service mcpd, so `linuxctl login` will fail ({exc.strerror}); install it with:\n"
                  f"#   install -m 0644 {shipped} {target}\n")
        return False
    err.write(f"# installed the PAM service mcpd ({target}, from {shipped}) for `linuxctl login`\n")
    return True


def print_routes(state: DevState, out: TextIO) -> None:
    """Print one line showing the ordinary and the privileged route to the example's sample file."""
    sample = state.state_dir / "root-only" / "secret.txt"
    out.write(f"# the dev token reads as OS account {DEV_ACCOUNT}; a root-only file shows both routes:\n"
              f"#   linuxctl get files {sample}               -> PERMISSION_DENIED\n"
              f"#   linuxctl get files --privileged {sample}  -> its content (grant in mcp-sudo.yaml, audited)\n")
    out.flush()


def run(state: DevState, out: TextIO, err: TextIO) -> int:
    """``mcpd dev`` as root, after :func:`mcpd.admin.devmode.prepare`: make the folder fit for
    privilege separation (:func:`setup_root_state`), start the root helper, print the start-up
    text on ``out`` and :func:`supervise` the helper and the front until a stop signal
    (:func:`stop_signals`) or the front's exit. Returns the exit code: 78 when the setup or the
    helper's start fails, 0 after a stop signal, else the front's.

    Every child is started from this thread with :func:`die_with_this_process`, so none outlives
    this process, whether it stops in order or is killed."""
    helper: subprocess.Popen[bytes] | None = None
    with stop_signals():
        try:
            try:
                setup = setup_root_state(state)
                ensure_pam_service(err)
                helper = spawn_helper(setup)
            except Exception as exc:  # an account, the folder, the users file, or the helper's start
                _say(err, f"mcpd dev: {exc}")
                return config.EXIT_CONFIG
            print_exports(state, out)
            print_routes(state, out)
            print_privileged(True, state, out)
            return supervise(state, setup, helper, err)
        except DevStop:  # before the front ran
            return 0
        finally:
            if helper is not None and helper.returncode is None:  # supervise did not reap it
                _stop(helper, signal.SIGTERM)

