"""``mcpd dev`` run as root: the root helper, the front as the service user (docs/PRIVSEP.md).

:func:`mcpd.admin.devmode.start_root_helper` calls :func:`setup_root_state` and :func:`start_helper`;
:func:`mcpd.admin.devmode.run` then runs the front through :func:`run_front`. As root the state folder
becomes::

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

import os
import pwd
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TextIO
from collections.abc import Callable

import yaml

from mcpd.common import config
from mcpd.common import identity
from mcpd.admin.devmode import DEV_PRINCIPAL, DevState

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


def _spawn_helper(setup: RootSetup) -> subprocess.Popen[bytes]:
    """Start ``mcpd helper`` and wait for its socket (see :func:`start_helper`)."""
    setup.socket_path.unlink(missing_ok=True)  # a previous helper's socket must not look ready
    with open(setup.helper_log, "ab") as log:
        os.fchmod(log.fileno(), 0o600)
        proc = subprocess.Popen(
            [sys.executable, "-m", "mcpd.admin.cli", "helper", "--config", str(setup.config_path)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=setup.config_path.parent,
            start_new_session=True,
        )
    deadline = time.monotonic() + HELPER_START_SECONDS
    while True:
        try:
            st = os.lstat(setup.socket_path)
            if stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660:
                break
        except FileNotFoundError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc, signal.SIGTERM)
            raise DevRootError(f"the root helper did not start (exit {proc.returncode}); see {setup.helper_log}")
        time.sleep(0.05)
    return proc


def start_helper(setup: RootSetup, err: TextIO = sys.stderr) -> Callable[[], None]:
    """Start ``mcpd helper`` (root) with its log in ``<state>/helper.log`` and keep it running, as
    systemd would in production: a helper that exits is started again after
    :data:`RESTART_DELAY_SECONDS`, except after exit 78 (a broken configuration) or more than
    :data:`RESTART_BURST` restarts in :data:`RESTART_WINDOW_SECONDS`; each restart is said on
    ``err``. Returns a stopper that ends the watch, then sends SIGTERM and, after
    :data:`STOP_SECONDS`, SIGKILL.

    Raises:
        DevRootError: the helper exited, or its socket did not appear within
            :data:`HELPER_START_SECONDS` seconds (the first start only).
    """
    import threading

    current = [_spawn_helper(setup)]
    stopping = threading.Event()
    guard = threading.Lock()  # a restart and the stopper never interleave

    def watch() -> None:
        restarts: list[float] = []
        while True:
            code = current[0].wait()
            if stopping.is_set():
                return
            if code == config.EXIT_CONFIG:
                err.write(f"# the root helper exited {code} (configuration); not restarted, see {setup.helper_log}\n")
                return
            now = time.monotonic()
            restarts = [t for t in restarts if now - t < RESTART_WINDOW_SECONDS] + [now]
            if len(restarts) > RESTART_BURST:
                err.write(f"# the root helper died {len(restarts)} times in {RESTART_WINDOW_SECONDS:g} s; not "
                          f"restarted again, see {setup.helper_log}\n")
                return
            err.write(f"# the root helper exited ({code}); restarting it in {RESTART_DELAY_SECONDS:g} s\n")
            err.flush()
            if stopping.wait(RESTART_DELAY_SECONDS):
                return
            with guard:
                if stopping.is_set():
                    return
                try:
                    current[0] = _spawn_helper(setup)
                except DevRootError as exc:
                    err.write(f"# {exc}\n")
                    return
            err.write(f"# the root helper runs again (pid {current[0].pid})\n")
            err.flush()

    watcher = threading.Thread(target=watch, name="helper-watch", daemon=True)
    watcher.start()

    def stop() -> None:
        stopping.set()
        with guard:
            _stop(current[0], signal.SIGTERM)
        watcher.join(timeout=STOP_SECONDS)

    return stop


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


class _Stop(Exception):
    pass


def run_front(state: DevState) -> int:
    """Run ``mcpd serve`` as the service user (uid, gid, no supplementary groups) in the
    foreground; Ctrl-C (SIGINT) or SIGTERM to this process stops it. Returns its exit code."""
    service = pwd.getpwnam(SERVICE_USER)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcpd.front.server", "--config", str(state.config_path)],
        stdin=subprocess.DEVNULL, cwd=state.state_dir, start_new_session=True,
        user=service.pw_uid, group=service.pw_gid, extra_groups=[],
        env={"PATH": os.defpath, "LANG": "C.UTF-8", "HOME": "/"},
    )

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise _Stop()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        return proc.wait()
    except (KeyboardInterrupt, _Stop):
        code = _stop(proc, signal.SIGTERM)  # uvicorn's graceful stop, without a KeyboardInterrupt trace
        return 0 if code in (0, -signal.SIGTERM) else code
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            _stop(proc, signal.SIGTERM)
