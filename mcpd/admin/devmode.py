"""``mcpd dev``: a working daemon on 127.0.0.1 in one command (docs/REFERENCE.md §1.1, §5.1).

The state folder (default ``./dev-state``, mode 0700) holds the private CA and a certificate for
localhost/127.0.0.1/::1, ``mcpd.yaml`` (paths relative to the folder; no root helper unless run
as root), ``users.yaml`` (principal ``dev`` → the current OS account), the grants and audit
paths, ``dev-token`` (the plain token, 0600, so a restart keeps it) and ``dev.lock`` (held while
this folder's ``mcpd dev`` runs).

Before it changes anything it checks that the port is free and takes the folder's lock: a second
start on a busy port or folder refuses (exit 75) and leaves the running one untouched. It prints
the ``export`` lines for ``linuxctl`` and whether privileged calls are on, then serves until
SIGINT, SIGTERM or SIGHUP. Not root, the front runs in this process and its workers die with it;
as root, :mod:`mcpd.admin.devroot` takes over. The run's records and start-up lines are in
:mod:`mcpd.admin.devstate`, its stop signals in :mod:`mcpd.admin.devstop`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import signal
import socket
import stat
import sys
from pathlib import Path

import yaml

from mcpd.admin import certs, devroot
from mcpd.admin.devstate import DEV_PRINCIPAL, DevState, print_exports, print_privileged
from mcpd.admin.devstop import DevStop, stop_signals
from mcpd.common import config, identity

DEV_HOSTS = ["localhost", "127.0.0.1", "::1"]
LISTEN_HOST = "127.0.0.1"
TOKEN_FILE = config.DEV_TOKEN_FILE
LOCK_FILE = "dev.lock"
EXIT_BUSY = 75  # EX_TEMPFAIL (sysexits.h): another instance holds the port or the folder


class DevBusy(Exception):
    """The port or the state folder is in use; nothing was changed."""


def check_port_free(port: int, host: str = LISTEN_HOST) -> None:
    """Check that ``host:port`` can be bound (as the server will, with ``SO_REUSEADDR``).

    Raises:
        DevBusy: something listens there already.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise DevBusy(f"port {port} on {host} is in use (another `mcpd dev`, or another server); "
                          "choose another with --port N") from None


def lock_state_folder(state_dir: Path) -> int:
    """Create ``state_dir`` if missing (0700) and take the exclusive lock on its ``dev.lock``;
    return the lock's descriptor (close it, or exit, to release). The lock file holds the pid.

    Raises:
        DevBusy: another process holds the lock (its pid is in the message).
    """
    folder = state_dir.resolve()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
        os.close(fd)
        raise DevBusy(f"{folder} is in use by another `mcpd dev` (pid {holder}); stop it, or choose another "
                      "--state-dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def current_account() -> str:
    """The OS account name of the effective uid (the ``dev`` principal's ``os_user``)."""
    return pwd.getpwuid(os.geteuid()).pw_name


def dev_config(port: int, metrics_port: int = 0) -> dict[str, object]:
    """The development ``mcpd.yaml`` mapping; paths are relative to the state folder (config.load).
    ``metrics_port``: serve ``/metrics`` and ``/healthz`` on 127.0.0.1 there (0: off)."""
    return {
        "listen": {"host": LISTEN_HOST, "port": port},
        "tls": {"cert": "server.crt", "key": "server.key"},
        "users_file": "users.yaml",
        "grants_file": "mcp-sudo.yaml",
        "helper_socket": "",  # not root: no helper, privileged calls answer HELPER_UNAVAILABLE (devroot sets it)
        "audit_log": "audit.jsonl",
        "access_log": "access.jsonl",
        "state_dir": ".",
        # one principal (dev) does everything here: it may hold every session slot and all of the
        # root helper's capacity for privileged calls
        "max_sessions_per_principal": 1000,
        "max_privileged_per_principal": 64,
        "metrics_listen": f"{LISTEN_HOST}:{metrics_port}" if metrics_port else "",
    }


def prepare(state_dir: Path, port: int, new_token: bool = False, metrics_port: int = 0) -> DevState:
    """Create or refresh the development state folder; keep the ``dev`` token of the last run
    (from ``dev-token``, while ``users.yaml`` still accepts it) or issue a fresh one.

    Args:
        state_dir: the folder (created with mode 0700; an existing one is reused).
        port: TCP port for 127.0.0.1 (1..65535).
        new_token: revoke the ``dev`` token and issue a fresh one even when the last one is valid.
        metrics_port: TCP port on 127.0.0.1 for ``/metrics`` and ``/healthz`` (0: off).

    Raises:
        config.ConfigError: the written configuration does not validate (a bug, fail closed).
        identity.UsersFileError: an existing ``users.yaml`` in the folder is malformed.
    """
    folder = state_dir.resolve()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    pki = certs.make_pki(folder, DEV_HOSTS)
    config_path = folder / "mcpd.yaml"
    with open(config_path, "w", encoding="utf-8") as f:
        f.write("# mcpd development configuration, written by `mcpd dev` (rewritten on each run)\n")
        yaml.safe_dump(dev_config(port, metrics_port), f, sort_keys=False)
    cfg = config.load(config_path)
    users = identity.load_users(cfg.users_file)
    token_path = folder / TOKEN_FILE
    token = None if new_token else _saved_token(token_path, users)
    if token is None:
        token, record = identity.new_token()
        users[DEV_PRINCIPAL] = identity.UserRecord(name=DEV_PRINCIPAL, os_user=current_account(), tokens=[record])
        fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(token + "\n")
    else:  # the same token; bound again to this run's account (devroot rebinds it to mcpd-dev)
        users[DEV_PRINCIPAL] = identity.UserRecord(name=DEV_PRINCIPAL, os_user=current_account(),
                                                   tokens=users[DEV_PRINCIPAL].tokens,
                                                   redact=users[DEV_PRINCIPAL].redact)
    identity.save_users(cfg.users_file, users)
    return DevState(
        state_dir=folder, config_path=config_path, cacert=pki.ca_cert.resolve(),
        url=f"https://{LISTEN_HOST}:{port}", token=token,
    )


def _saved_token(path: Path, users: dict[str, identity.UserRecord]) -> str | None:
    """The plain token in ``path`` when ``users`` still accepts it as the ``dev`` principal's."""
    try:
        saved = path.read_text(encoding="ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    principal = identity.verify(users, saved) if saved else None
    return saved if principal is not None and principal.name == DEV_PRINCIPAL else None


def check_root_state_folder(state_dir: Path) -> None:
    """As root, refuse a state folder that root does not own or that another account can change:
    the folder (when it exists) and every folder above it must be root's and not writable by
    group or others (sticky ``/tmp`` excepted above it); no level may be a symlink.

    Raises:
        OSError: the message names the path and the rule it breaks.
    """
    from mcpd.common.folders import safe_folder

    path = os.path.abspath(state_dir)
    if os.path.lexists(path):
        os.close(safe_folder(path, leaf_mask=stat.S_IWGRP | stat.S_IWOTH))
        return
    while not os.path.lexists(path):  # missing levels are created by root below, root-owned
        path = os.path.dirname(path)
    os.close(safe_folder(path, leaf_mask=0))  # (a sticky /tmp above is fine)


def run(state_dir: Path, port: int, new_token: bool = False, metrics_port: int = 0) -> int:
    """Check the port, lock the folder, prepare it, print the exports, and run the server until
    Ctrl-C, SIGTERM or SIGHUP; return the exit code: 0 after one of those, :data:`EXIT_BUSY`
    when the port or folder is in use, 78 when the setup fails.

    As root the root helper runs too (restarted when it dies) and the front runs as the service
    user (``mcpd``), with the ``dev`` principal bound to the unprivileged ``mcpd-dev`` account.
    """
    try:
        check_port_free(port)
        if metrics_port:
            check_port_free(metrics_port)
        if os.geteuid() == 0:
            check_root_state_folder(state_dir)
        lock = lock_state_folder(state_dir)
    except DevBusy as exc:
        print(f"mcpd dev: {exc}", file=sys.stderr)
        return EXIT_BUSY
    except OSError as exc:
        print(f"mcpd dev: {exc}", file=sys.stderr)
        return config.EXIT_CONFIG
    try:
        return _run_locked(state_dir, port, new_token, metrics_port)
    finally:
        os.close(lock)


def _run_locked(state_dir: Path, port: int, new_token: bool, metrics_port: int = 0) -> int:
    try:
        state = prepare(state_dir, port, new_token, metrics_port)
    except Exception as exc:  # config, users file, OS error
        print(f"mcpd dev: {exc}", file=sys.stderr)
        return config.EXIT_CONFIG
    if os.geteuid() == 0:
        return _run_as_root(state)
    # The front runs in this process (uvicorn's graceful stop on SIGINT and SIGTERM; a hang-up
    # asks for the same); its workers die with it, however it ends (their parent-death signal).
    with stop_signals(on_hangup=lambda: os.kill(os.getpid(), signal.SIGTERM)):
        try:
            print_exports(state, sys.stdout)
            print_privileged(False, state, sys.stdout)
            from mcpd.front.server import serve

            return serve(str(state.config_path))
        except (KeyboardInterrupt, DevStop):  # uvicorn passes the signal on once it has stopped
            return 0


def _run_as_root(state: DevState) -> int:
    return devroot.run(state, sys.stdout, sys.stderr)
