"""The root helper's entry point: ``python -I -m mcpd.helper --config FILE`` (``mcpd-helper``).

Loaded without the CLI: this module imports, at the top, everything root ever runs, so
``sys.modules`` after importing it is the whole root surface (``tests/unit/test_root_surface.py``
counts it). Start-up order matters: every capability but :data:`~mcpd.helper.forkserver.KEEP` goes first
(:func:`drop_capabilities`, whoever started it: systemd's unit, ``mcpd helper`` or ``mcpd dev``),
``mcpd.yaml`` is read once on a checked descriptor, the fork server is forked while this process
has one thread, the policy process is started from it, and
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
import threading
from collections.abc import Callable

import yaml

from mcpd.helper import forkserver
from mcpd.helper.monitor import CHANNELS, Monitor, log
from mcpd.helper.wire.rootconf import EXIT_CONFIG, POLICY_USER, WALK_USER, plain_ids, root_settings
from mcpd.helper.wire.securefile import ConfigFileError, read_secure_file

STOP_SECONDS = 10.0  # how long a stopping helper waits for the policy process to finish
_PR_CAPBSET_READ, _PR_CAPBSET_DROP = 23, 24


def drop_capabilities() -> None:
    """Keep only :data:`~mcpd.helper.forkserver.KEEP`: every other capability leaves the bounding set (so no ``exec`` as
    root regains one) and the permitted and effective sets; the inheritable set, and with it the
    ambient set, ends empty. Raises ``OSError`` (the helper then does not start)."""
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
        last = int(f.read())
    for cap in sorted(set(range(last + 1)) - set(forkserver.KEEP.values())):
        if forkserver.prctl(_PR_CAPBSET_READ, cap) == 1:
            forkserver.prctl(_PR_CAPBSET_DROP, cap)
    forkserver.capset(sum(1 << cap for cap in forkserver.KEEP.values()))  # the inheritable set (and the ambient) empty


def listening_socket() -> socket.socket:
    """The listening socket the helper's starter hands it as fd 3 (``LISTEN_PID`` this process,
    ``LISTEN_FDS=1``): systemd's ``mcpd-helper.socket``, or ``mcpd helper``, which makes it as that
    unit does (:func:`mcpd.admin.cli.helper_socket`). Root binds nothing itself. Raises ``OSError``
    when none was handed over, or fd 3 is not a socket."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()) or os.environ.get("LISTEN_FDS") != "1":
        raise OSError("no listening socket was handed over (fd 3, LISTEN_FDS=1): start the helper "
                      "with systemd's mcpd-helper.socket, or with `mcpd helper`")
    return socket.socket(fileno=3)


def main(argv: list[str] | None = None) -> int:
    """Run the root helper until SIGTERM/SIGINT or the policy process ends; SIGHUP is passed to
    the policy process (it reloads the grants and users files).

    Returns 0 after a clean stop; 78 (configuration broken, do not restart) when not root, when
    ``mcpd.yaml`` is not root's (owner, mode) or unreadable, an account (``mcpd-policy``,
    ``mcpd-walk``: uid and gid plain, :func:`plain_ids`; the service user) is unknown, no listening
    socket was handed over (:func:`listening_socket`), or the policy process exits
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
        accounts = service, walker, policy = tuple(pwd.getpwnam(n) for n in (settings.service_user, WALK_USER, POLICY_USER))
        if not plain_ids(walker.pw_uid, walker.pw_gid, policy.pw_uid, policy.pw_gid):
            raise OSError(f"the accounts {WALK_USER} and {POLICY_USER} must not be root (or have an id of -1)")
        listener = listening_socket()  # (fd 3 since this process started: the fork server closes it)
    except (ConfigFileError, yaml.YAMLError, ValueError, KeyError, OSError) as exc:  # (PyYAML's text quotes the file)
        why = f"{path}: not valid YAML (`mcpd config check` names the line)" if isinstance(exc, yaml.YAMLError) else exc
        log.error("cannot start: %s", "; ".join(getattr(exc, "errors", [])) or why)
        return EXIT_CONFIG
    forks = forkserver.start((walker.pw_uid, walker.pw_gid), listener)  # one thread here: the only safe moment to fork
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(CHANNELS)]
    fds = [listener.fileno(), *(b.fileno() for _, b in pairs)]
    pid = forkserver.forked(forkserver.policy_child, policy.pw_uid, policy.pw_gid, path, fds)  # still one thread
    pidfd = os.pidfd_open(pid)
    listener.close()
    monitor = Monitor(forks, settings, path, accounts)
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

