"""The root helper's entry point: ``python -I -m mcpd.helper --config FILE`` (``mcpd-helper``).

Loaded without the CLI: this module imports, at the top, everything the root side ever runs, so
``sys.modules`` after importing it is the whole root surface (``tests/unit/test_root_surface.py``
counts it). Start-up order matters: the configuration is checked, then the fork server is forked
while this process has one thread, and only then are files, the socket and threads opened.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import pwd
import signal
import socket
import stat
import sys

from mcpd.common import config, identity, sdnotify
from mcpd.common.reload import Reloading
from mcpd.helper import forkserver, server
from mcpd.common.audit import AuditLog
from mcpd.helper.grants import secret_paths
from mcpd.helper.grants_reload import PolicyHolder
from mcpd.helper.login import Accounts, Login, Store

log = logging.getLogger("mcpd.helper")


def root_folder(path: str, leaf_mask: int = 0o077) -> int:
    """Open a folder root keeps state in, creating it 0700 when missing, and return a descriptor
    (``O_RDONLY|O_DIRECTORY``: files are opened relative to it, it can be listed and locked): the
    helper's state folder; ``mcpd dev``'s state folder when run as root.

    The folder and every folder above it must be owned by root and not writable by group or
    others (a sticky folder such as ``/tmp`` excepted, above the leaf), so no path root uses inside
    it can be changed by another account (SPEC §4.5a). Each level is opened with ``O_NOFOLLOW``
    relative to the one above. ``leaf_mask``: mode bits the folder itself must not have (default:
    it must be 0700).

    Raises:
        OSError: a level is a symlink, is not a folder, or fails the owner/mode check.
    """
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        for name in [p for p in os.path.abspath(path).split("/") if p]:
            try:
                nfd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(name, 0o700, dir_fd=fd)
                nfd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
            st = os.fstat(fd)
            if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
                raise OSError(f"{path}: {name} must be owned by root and not writable by group or others")
        if os.fstat(fd).st_mode & leaf_mask:
            raise OSError(f"{path}: must be mode 0700" if leaf_mask == 0o077 else
                          f"{path}: must not be writable by group or others")
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


def listening_socket(path: str, service_gid: int) -> socket.socket:
    """The socket from systemd (``LISTEN_FDS``, fd 3), or a new one at ``path``: mode 0660, owner
    root, group ``service_gid``."""
    if os.environ.get("LISTEN_PID") == str(os.getpid()) and os.environ.get("LISTEN_FDS") == "1":
        return socket.socket(fileno=3)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o117)  # 0660
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chown(path, 0, service_gid, follow_symlinks=False)
    sock.listen(64)
    return sock


def enrolled(users: Reloading[dict[str, identity.UserRecord]]) -> set[str]:
    """The OS accounts bound to a principal in ``users.yaml`` as it is now (re-read on change)."""
    users.refresh()
    return {u.os_user for u in users.current.values()}


def main(argv: list[str] | None = None) -> int:
    """Run the root helper until SIGTERM/SIGINT; SIGHUP reloads the grants and users files.

    Returns 0 after a clean stop, 78 (configuration broken, do not restart) when not root, when
    ``mcpd.yaml`` is not root's (owner, mode), the service user or the walker account
    (``mcpd-walk``, uid and gid not 0) is unknown, the state folder is unsafe, or the first grants
    load fails (fail closed).
    """
    parser = argparse.ArgumentParser(prog="mcpd-helper", description="The mcpd root helper.")
    parser.add_argument("--config", default="/etc/mcpd/mcpd.yaml")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="mcpd-helper: %(levelname)s %(message)s")
    if os.geteuid() != 0:
        log.error("the root helper must run as root")
        return config.EXIT_CONFIG
    try:
        cfg = config.load(opts.config, owner_uid=0)  # one read, of the descriptor checked: root's, not g/o-writable
        service, walker = pwd.getpwnam(cfg.service_user), pwd.getpwnam(config.WALK_USER)
        if 0 in (walker.pw_uid, walker.pw_gid):
            raise OSError(f"the walker account {config.WALK_USER} must not be root")
        os.close(root_folder(cfg.helper_state_dir))
    except (config.ConfigError, KeyError, OSError) as exc:
        log.error("cannot start: %s", exc)
        return config.EXIT_CONFIG
    forks = forkserver.start((walker.pw_uid, walker.pw_gid))  # one thread here: the only safe moment to fork
    audit = AuditLog(cfg.audit_log)
    holder = PolicyHolder(cfg.grants_file, audit=audit, secrets=secret_paths(cfg, opts.config))
    if holder.last_errors:
        log.error("grants file not loaded: %s", "; ".join(holder.last_errors))
        return config.EXIT_CONFIG
    users: Reloading[dict[str, identity.UserRecord]] = Reloading(
        cfg.users_file, functools.partial(identity.load_users, owner_uid=0), empty={}, fail_closed=True)
    issued = Store(root_folder(cfg.helper_state_dir), cfg.login.tokens_per_user)  # after the fork: not inherited
    login = Login(cfg.login, issued, audit, lambda: enrolled(users))
    state = server.State(cfg=cfg, audit=audit, users=users, policy=holder, forks=forks, issued=issued, login=login,
                         accounts=Accounts())
    flags = {"stop": False, "hup": False}
    signal.signal(signal.SIGTERM, lambda *_: flags.update(stop=True))
    signal.signal(signal.SIGINT, lambda *_: flags.update(stop=True))
    signal.signal(signal.SIGHUP, lambda *_: flags.update(hup=True))

    def tick() -> None:
        if flags["hup"]:
            flags["hup"] = False
            result = holder.reload()
            users.refresh(force=True)
            log.info("reload: %s", "; ".join(result.summary or result.errors))
        else:
            holder.reload_if_changed()

    sock = listening_socket(cfg.helper_socket, service.pw_gid)
    sdnotify.notify()
    log.info("root helper listening; accepting uid %d (%s)", service.pw_uid, cfg.service_user)
    server.serve(state, sock, service.pw_uid, lambda: flags["stop"], tick)
    sock.close()
    for w in list(state.workers.values()):
        server.kill_worker(state, w)
    audit.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
