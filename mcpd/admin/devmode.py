"""``mcpd dev``: a working daemon on 127.0.0.1 in one command (SPEC §1.1, §5.1; issue "two commands").

The state folder (default ``./dev-state``, mode 0700) holds::

    ca.crt ca.key server.crt server.key   private CA and a certificate for localhost/127.0.0.1/::1
    mcpd.yaml                             listen 127.0.0.1:PORT, paths relative here; no root helper
                                          unless run as root (mcpd/devroot.py then sets helper_socket)
    users.yaml                            principal ``dev`` → the current OS account, mode 0600
    mcp-sudo.yaml, audit.jsonl            grants and audit paths (used by the root helper, as root)

Re-running keeps the folder and the CA (clients keep trusting it) but revokes the ``dev`` token
and issues a fresh one. The command prints the ``export`` lines for ``linuxctl`` and a hint, then
runs the server in the foreground until Ctrl-C.
"""

from __future__ import annotations

import os
import stat
import pwd
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import yaml

from mcpd.admin import certs
from mcpd.common import config
from mcpd.common import identity

DEV_PRINCIPAL = "dev"
DEV_HOSTS = ["localhost", "127.0.0.1", "::1"]
LISTEN_HOST = "127.0.0.1"


@dataclass(frozen=True)
class DevState:
    """What :func:`prepare` made: absolute paths, the server URL and the fresh plain token."""

    state_dir: Path
    config_path: Path
    cacert: Path
    url: str
    token: str


def current_account() -> str:
    """The OS account name of the effective uid (the ``dev`` principal's ``os_user``)."""
    return pwd.getpwuid(os.geteuid()).pw_name


def dev_config(port: int) -> dict[str, object]:
    """The development ``mcpd.yaml`` mapping; paths are relative to the state folder (config.load)."""
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
    }


def prepare(state_dir: Path, port: int) -> DevState:
    """Create or refresh the development state folder and issue a fresh ``dev`` token.

    Args:
        state_dir: the folder (created with mode 0700; an existing one is reused).
        port: TCP port for 127.0.0.1 (1..65535).

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
        yaml.safe_dump(dev_config(port), f, sort_keys=False)
    cfg = config.load(config_path)
    users = identity.load_users(cfg.users_file)
    token, record = identity.new_token()
    users[DEV_PRINCIPAL] = identity.UserRecord(name=DEV_PRINCIPAL, os_user=current_account(), tokens=[record])
    identity.save_users(cfg.users_file, users)
    return DevState(
        state_dir=folder, config_path=config_path, cacert=pki.ca_cert.resolve(),
        url=f"https://{LISTEN_HOST}:{port}", token=token,
    )


def print_exports(state: DevState, out: TextIO) -> None:
    """Print the three ``export`` lines and the one-line hint (the token is shown here only)."""
    out.write(f"export MCPD_URL={state.url}\n")
    out.write(f"export MCP_TOKEN={state.token}\n")
    out.write(f"export MCPD_CACERT={shlex.quote(str(state.cacert))}\n")
    out.write("# then try: linuxctl get files /etc/hosts\n")
    out.flush()


def start_root_helper(state: DevState) -> Callable[[], None] | None:
    """Start the root helper for privileged reads when running as root; return its stopper.

    Not root: nothing happens (``None``; privileged calls answer ``HELPER_UNAVAILABLE``).
    As root, :func:`mcpd.admin.devroot.setup_root_state` first makes the folder fit for privilege
    separation (service user, ``mcpd-dev`` account, example grant, ``helper_socket``), then
    ``mcpd helper`` runs as a child process (its own session, so only this process gets Ctrl-C).

    Raises:
        mcpd.admin.devroot.DevRootError: an account could not be created or the helper did not start
            within its deadline (seconds, :data:`mcpd.admin.devroot.HELPER_START_SECONDS`).
    """
    if os.geteuid() != 0:
        return None
    from mcpd.admin import devroot

    setup = devroot.setup_root_state(state)
    devroot.ensure_pam_service(sys.stderr)
    return devroot.start_helper(setup)


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


def run(state_dir: Path, port: int) -> int:
    """Prepare the folder, print the exports, and run the server until Ctrl-C; return the exit code.

    As root the root helper runs too and the front runs as the service user (``mcpd``), with the
    ``dev`` principal bound to the unprivileged ``mcpd-dev`` account (SPEC §4, §5.1).
    """
    try:
        if os.geteuid() == 0:
            check_root_state_folder(state_dir)
        state = prepare(state_dir, port)
        stop_helper = start_root_helper(state)
    except Exception as exc:  # config, users file, OS error, account or helper start failure
        print(f"mcpd dev: {exc}", file=sys.stderr)
        return config.EXIT_CONFIG
    print_exports(state, sys.stdout)
    if stop_helper is not None:
        from mcpd.admin import devroot

        try:
            devroot.print_routes(state, sys.stdout)
            return devroot.run_front(state)
        finally:
            stop_helper()
    try:
        from mcpd.front.server import serve

        return serve(str(state.config_path))
    except KeyboardInterrupt:
        return 0
