"""The root helper's entry point: ``python -I -m mcpd.helper --config FILE`` (``mcpd-helper``).

Loaded without the CLI: this module imports, at the top, everything root ever runs, so
``sys.modules`` after importing it is the whole root surface (``tests/unit/test_root_surface.py``
counts it). Start-up order matters: every capability but :data:`KEEP` goes first
(:func:`drop_capabilities`, whoever started it: systemd's unit, ``mcpd helper`` or ``mcpd dev``),
``mcpd.yaml`` is read once on a checked descriptor, the fork server is forked while this process
has one thread, the policy process is started from it, and
only then are threads started. Root then serves the policy's requests (:mod:`mcpd.helper.monitor`)
until it is stopped or the policy process ends; it keeps no state of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import pwd
import select
import signal
import socket
import stat
import threading
from collections.abc import Callable

import yaml

from mcpd.helper import forkserver
from mcpd.helper.monitor import CHANNELS, Monitor
from mcpd.helper.wire.rootconf import EXIT_CONFIG, POLICY_USER, WALK_USER, plain_ids, root_settings
from mcpd.helper.wire.securefile import ConfigFileError, read_secure_file

log = logging.getLogger("mcpd.helper")
STOP_SECONDS = 10.0  # how long a stopping helper waits for the policy process to finish
#: The capabilities root keeps (linux/capability.h numbers), the unit's CapabilityBoundingSet:
#: open and list any file or folder for a grant, and hand that to the walker; become an account in
#: the fork server's children (setgroups, setresgid, setresuid; the socket's group, below); signal
#: the children it made, which run as other uids. PAM as root reads /etc/shadow with these too.
KEEP = {"CAP_DAC_READ_SEARCH": 2, "CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7}
_PR_CAPBSET_READ, _PR_CAPBSET_DROP = 23, 24
_PR_SET_PDEATHSIG, _PR_GET_PDEATHSIG = 1, 2


def drop_capabilities() -> None:
    """Keep only :data:`KEEP`: every other capability leaves the bounding set (so no ``exec`` as
    root regains one) and the permitted and effective sets; the inheritable set, and with it the
    ambient set, ends empty. Raises ``OSError`` (the helper then does not start)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
        last = int(f.read())
    for cap in sorted(set(range(last + 1)) - set(KEEP.values())):
        if libc.prctl(_PR_CAPBSET_READ, cap, 0, 0, 0) == 1 and libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"cannot drop capability {cap} from the bounding set")
    forkserver.capset(sum(1 << cap for cap in KEEP.values()))  # the inheritable set (and the ambient) empty


def listening_socket(path: str, service_gid: int) -> socket.socket:
    """The socket from systemd (``LISTEN_FDS``, fd 3), or a new one at ``path``: mode 0660, owner
    root, group ``service_gid``. The change of effective gid this takes clears the parent-death
    signal the starter gave (``mcpd dev``'s: the helper dies with it), so it is set again, and
    ``OSError`` is raised when that fails or the starter ended meanwhile."""
    if os.environ.get("LISTEN_PID") == str(os.getpid()) and os.environ.get("LISTEN_FDS") == "1":
        return socket.socket(fileno=3)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old, libc, death, parent = os.umask(0o117), ctypes.CDLL(None, use_errno=True), ctypes.c_int(), os.getppid()
    libc.prctl(_PR_GET_PDEATHSIG, ctypes.byref(death), 0, 0, 0)  # the starter's (mcpd dev's), if any
    os.setegid(service_gid)  # the new socket's group, without CAP_CHOWN
    try:
        sock.bind(path)
    finally:
        os.setegid(0)
        os.umask(old)
    if death.value and (libc.prctl(_PR_SET_PDEATHSIG, death.value, 0, 0, 0) != 0 or os.getppid() != parent):
        raise OSError("the process that started the helper ended, or its parent-death signal was lost")
    sock.listen(64)
    return sock


def main(argv: list[str] | None = None) -> int:
    """Run the root helper until SIGTERM/SIGINT or the policy process ends; SIGHUP is passed to
    the policy process (it reloads the grants and users files).

    Returns 0 after a clean stop; 78 (configuration broken, do not restart) when not root, when
    ``mcpd.yaml`` is not root's (owner, mode) or unreadable, an account (``mcpd-policy``,
    ``mcpd-walk``: uid and gid plain, :func:`plain_ids`; the service user) is unknown, or the policy process exits
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
        drop_capabilities()
        # its own keys only, with PyYAML's safe loader: the policy process holds the whole file to the
        # strict loader (no duplicate or merge key) and exits 78 otherwise, and root with it
        settings = root_settings(yaml.safe_load(read_secure_file(path, 0)), path)
        service, walker, policy = (pwd.getpwnam(n) for n in (settings.service_user, WALK_USER, POLICY_USER))
        if not plain_ids(walker.pw_uid, walker.pw_gid, policy.pw_uid, policy.pw_gid):
            raise OSError(f"the accounts {WALK_USER} and {POLICY_USER} must not be root (or have an id of -1)")
    except (ConfigFileError, yaml.YAMLError, ValueError, KeyError, OSError) as exc:  # (PyYAML's text quotes the file)
        why = f"{path}: not valid YAML (`mcpd config check` names the line)" if isinstance(exc, yaml.YAMLError) else exc
        log.error("cannot start: %s", "; ".join(getattr(exc, "errors", [])) or why)
        return EXIT_CONFIG
    forks = forkserver.start((walker.pw_uid, walker.pw_gid))  # one thread here: the only safe moment to fork
    listener = listening_socket(settings.helper_socket, service.pw_gid)
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(CHANNELS)]
    fds = [listener.fileno(), *(b.fileno() for _, b in pairs)]
    pid = forkserver.forked(forkserver.policy_child, policy.pw_uid, policy.pw_gid, path, fds)  # still one thread
    pidfd = os.pidfd_open(pid)
    listener.close()
    monitor = Monitor(forks, settings, path)
    for ours, theirs in pairs:
        theirs.close()
        threading.Thread(target=monitor.serve, args=(ours,), daemon=True).start()
    stop = {"now": False}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGHUP, lambda *_: signal.pidfd_send_signal(pidfd, signal.SIGHUP))
    log.info("root helper started the policy process (pid %d, %s)", pid, POLICY_USER)
    code = serve(monitor, pidfd, lambda: stop["now"])
    if code is None:  # stopped: the policy stops first (its workers, its audit), still served meanwhile
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        select.select([pidfd], [], [], STOP_SECONDS)
        code = 0
    monitor.close()
    status = _wait(pid, pidfd)
    os.close(pidfd)
    return EXIT_CONFIG if code and status == EXIT_CONFIG else code


def serve(monitor: Monitor, pidfd: int, stopped: Callable[[], bool]) -> int | None:
    """Wait until ``stopped()`` (``None``), or the policy process ends or breaks the protocol on a
    channel (1). The channels are served by their own threads (each spawn forgets the children
    that have ended, :meth:`Monitor.reap`)."""
    while not stopped():
        if select.select([pidfd], [], [], 0.5)[0] or monitor.broken.is_set():
            log.error("the policy process %s", "broke the protocol" if monitor.broken.is_set() else "ended")
            return 1
    return None


def _wait(pid: int, pidfd: int) -> int:
    """Reap the policy process (SIGKILL after 5 s); its exit status (minus the signal when killed)."""
    if not select.select([pidfd], [], [], 5.0)[0]:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

