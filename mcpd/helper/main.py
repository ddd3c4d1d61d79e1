"""The root helper's entry point: ``python -I -m mcpd.helper --config FILE`` (``mcpd-helper``).

Loaded without the CLI: this module imports, at the top, everything root ever runs, so
``sys.modules`` after importing it is the whole root surface (``tests/unit/test_root_surface.py``
counts it). Start-up order matters: ``mcpd.yaml`` is read once on a checked descriptor, the fork
server is forked while this process has one thread, the policy process is started from it, and
only then are threads started. Root then serves the policy's requests (:mod:`mcpd.helper.monitor`)
until it is stopped or the policy process ends; it keeps no state of its own.
"""

from __future__ import annotations

import argparse
import logging
import os
import pwd
import select
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable

from mcpd.common.rootconf import EXIT_CONFIG, POLICY_USER, WALK_USER, root_settings
from mcpd.common.strictyaml import ConfigFileError, parse_strict_yaml, read_secure_file
from mcpd.helper import forkserver
from mcpd.helper.monitor import CHANNELS, Monitor

log = logging.getLogger("mcpd.helper")
STOP_SECONDS = 10.0  # how long a stopping helper waits for the policy process to finish


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


def main(argv: list[str] | None = None) -> int:
    """Run the root helper until SIGTERM/SIGINT or the policy process ends; SIGHUP is passed to
    the policy process (it reloads the grants and users files).

    Returns 0 after a clean stop; 78 (configuration broken, do not restart) when not root, when
    ``mcpd.yaml`` is not root's (owner, mode) or unreadable, an account (``mcpd-policy``,
    ``mcpd-walk``: uid and gid not 0; the service user) is unknown, or the policy process exits
    78 (its own folders are unsafe, the configuration or the grants are broken); 1 when the policy
    process ends otherwise. Root touches none of the policy's files: systemd-tmpfiles (or
    ``mcpd helper``) makes its folders.
    """
    parser = argparse.ArgumentParser(prog="mcpd-helper", description="The mcpd root helper.")
    parser.add_argument("--config", default="/etc/mcpd/mcpd.yaml")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="mcpd-helper: %(levelname)s %(message)s")
    if os.geteuid() != 0:
        log.error("the root helper must run as root")
        return EXIT_CONFIG
    path = os.path.abspath(opts.config)
    try:
        settings = root_settings(parse_strict_yaml(read_secure_file(path, 0), path), path)
        service, walker, policy = (pwd.getpwnam(n) for n in (settings.service_user, WALK_USER, POLICY_USER))
        if {0} & {walker.pw_uid, walker.pw_gid, policy.pw_uid, policy.pw_gid}:
            raise OSError(f"the accounts {WALK_USER} and {POLICY_USER} must not be root")
    except (ConfigFileError, ValueError, KeyError, OSError) as exc:
        log.error("cannot start: %s", "; ".join(getattr(exc, "errors", [])) or exc)
        return EXIT_CONFIG
    forks = forkserver.start((walker.pw_uid, walker.pw_gid))  # one thread here: the only safe moment to fork
    listener = listening_socket(settings.helper_socket, service.pw_gid)
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(CHANNELS)]
    pid = os.fork()  # still one thread
    if pid == 0:
        try:
            forkserver.policy_child(policy.pw_uid, policy.pw_gid, path, [listener.fileno(), *(b.fileno() for _, b in pairs)])
        finally:
            os._exit(127)
    pidfd = os.pidfd_open(pid)
    listener.close()
    monitor = Monitor(forks, settings, path)
    for ours, theirs in pairs:
        theirs.close()
        threading.Thread(target=monitor.serve, args=(ours,), daemon=True).start()
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGHUP, lambda *_: signal.pidfd_send_signal(pidfd, signal.SIGHUP))
    log.info("root helper started the policy process (pid %d, %s)", pid, POLICY_USER)
    code = serve(monitor, pidfd, lambda: stop["now"])
    if code is None:  # stopped: the policy stops first (its workers, its audit), still served meanwhile
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        end = time.monotonic() + STOP_SECONDS
        while time.monotonic() < end and not select.select([pidfd], [], [], 0.5)[0]:
            monitor.reap()
        code = 0
    monitor.close()
    status = _wait(pid, pidfd)
    os.close(pidfd)
    return EXIT_CONFIG if code and status == EXIT_CONFIG else code


def serve(monitor: Monitor, pidfd: int, stopped: Callable[[], bool]) -> int | None:
    """Reap children until ``stopped()`` (``None``), or the policy process ends or breaks the
    protocol on a channel (1). The channels are served by their own threads."""
    while not stopped():
        monitor.reap()
        if select.select([pidfd], [], [], 0.5)[0] or monitor.broken.is_set():
            log.error("the policy process %s", "broke the protocol" if monitor.broken.is_set() else "ended")
            return 1
    return None


def _wait(pid: int, pidfd: int) -> int:
    """Reap the policy process (SIGKILL after 5 s); its exit status (minus the signal when killed)."""
    if not select.select([pidfd], [], [], 5.0)[0]:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


if __name__ == "__main__":
    sys.exit(main())
