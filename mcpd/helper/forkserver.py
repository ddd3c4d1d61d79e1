"""The fork server: the only process of the root side that forks (docs/PRIVSEP.md).

The helper starts it before it starts any thread, so every ``fork`` happens in a single-threaded
process (a fork from a threaded process copies locks held by other threads). It serves two
requests from the helper over a socketpair, one at a time:
- ``spawn``: a worker for one OS account. The child drops to the account (groups, the account's
  gid as effective and saved gid but :data:`~mcpd.helper.wire.rootconf.WORKER_START_GID` as real gid,
  all three uids), sets no_new_privs, keeps only the worker's two sockets (as fd 3 and 4), and
  execs ``python -I -m mcpd.worker``. After ``setresuid`` to a non-root uid its capabilities are
  empty. The real gid that differs from the effective one is what keeps the new worker out of
  reach of the account's other processes until it has made itself non-dumpable (the ptrace check
  wants the caller's gid to equal the target's real, effective and saved gids at once; an
  ``exec`` with equal ids would make it dumpable again); the worker then takes the account's gid
  back (docs/PRIVSEP.md, rule 5: a worker's start).
- ``walk``: a walker for one privileged files/list or files/find. The child keeps only its
  channel (fd 3), drops to the walker account (:data:`mcpd.common.config.WALK_USER`, no groups)
  keeping CAP_DAC_READ_SEARCH alone (:func:`drop_to_walker`), and execs ``python -I -m
  mcpd.walker``, which reads the call from the helper on its channel, walks and answers.

Each reply carries the child's pid and a pidfd, so the helper signals the right process even
after the pid is reused. The fork server reaps every child it made. Its one send, the reply, is
bounded in time (``SO_SNDTIMEO``: a helper that stopped reading ends the fork server, and with
it new workers and walkers, rather than hanging it); the helper reads each reply at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from mcpd.helper.wire import frames
from mcpd.helper.wire.rootconf import WORKER_START_GID, plain_ids

_PR_SET_PDEATHSIG, _PR_SET_KEEPCAPS, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE = 1, 8, 38, 47, 2
#: The capabilities root keeps (linux/capability.h numbers), the unit's CapabilityBoundingSet:
#: open and list any file or folder for a grant, and hand that to the walker; become an account in
#: the fork server's children (setgroups, setresgid, setresuid); signal
#: the children it made, which run as other uids. PAM as root reads /etc/shadow with these too.
#: A walker keeps CAP_DAC_READ_SEARCH alone.
KEEP = {"CAP_DAC_READ_SEARCH": 2, "CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7}
_CAP_VERSION_3 = 0x20080522
FORK_REQUEST_CAP = 1024 * 1024  # bytes: a spawn request carries the account's groups


def prctl(option: int, *args: int) -> int:
    """``prctl(option, *args)``, the arguments not given 0: its result. Raises ``OSError`` when it fails."""
    if (result := ctypes.CDLL(None, use_errno=True).prctl(option, *args, *[0] * (4 - len(args)))) < 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, ...) failed")
    return int(result)


def capset(permitted: int, inheritable: int = 0) -> None:
    """Make the capability mask ``permitted`` (capabilities 0 to 31) this process's effective and
    permitted sets, and ``inheritable`` its inheritable set (``capset``, version 3). Raises ``OSError``."""
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)  # struct __user_cap_header_struct {version, pid}
    data = (ctypes.c_uint32 * 6)(permitted, permitted, inheritable, 0, 0, 0)  # 2 x {effective, permitted, inheritable}
    if ctypes.CDLL(None, use_errno=True).capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def drop_to_walker(uid: int, gid: int) -> None:
    """As root: become ``uid``/``gid`` (:func:`_become`: all three ids, no supplementary group,
    no_new_privs) keeping only CAP_DAC_READ_SEARCH in the permitted, effective, inheritable and
    ambient sets, so it survives the ``exec`` of the walker. Raises ``OSError`` (the child then exits)."""
    prctl(_PR_SET_KEEPCAPS, 1)  # setresuid away from root keeps the permitted set (exec clears it)
    _become(uid, gid, [])
    capset(1 << KEEP["CAP_DAC_READ_SEARCH"], inheritable=1 << KEEP["CAP_DAC_READ_SEARCH"])
    prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE, KEEP["CAP_DAC_READ_SEARCH"])


def _keep_only(fds: list[int], nulled: tuple[int, ...] = (0, 1, 2)) -> None:
    """Move ``fds`` to 3, 4, ... and close every other descriptor (``nulled`` become /dev/null)."""
    high = [os.dup(fd) for fd in fds]  # above every target, so no dup2 below clobbers a source
    for i, fd in enumerate(high):
        os.dup2(fd, 3 + i)
    null = os.open(os.devnull, os.O_RDWR)
    for std in nulled:
        os.dup2(null, std)
    os.closerange(3 + len(fds), os.sysconf("SC_OPEN_MAX"))


def _become(uid: int, gid: int, groups: list[int], real_gid: int | None = None) -> None:
    """All three uids and gids (``real_gid`` as the real gid when given), those supplementary
    groups, then no_new_privs (capabilities go with root). Raises ``OSError`` (the child then
    exits) unless the ids asked for are plain (:func:`~mcpd.helper.wire.rootconf.plain_ids`) and
    are then exactly the process's: ``setresuid(-1, -1, -1)`` changes nothing, and the child must
    never go on as root."""
    os.setgroups(groups)
    os.setresgid(real := gid if real_gid is None else real_gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if not plain_ids(uid, real, gid, *groups) or os.getresuid() != (uid, uid, uid) or os.getresgid() != (real, gid, gid) \
            or set(os.getgroups()) != set(groups):
        raise OSError("the child's ids are not plain, or not the ones asked for")
    prctl(_PR_SET_NO_NEW_PRIVS, 1)


def forked(child: Callable[..., object], *args: Any, code: int = 127) -> int:
    """Fork: the child runs ``child(*args)`` and then exits ``code`` whatever happens (it never
    returns into its parent's code, which would go on as root); the parent gets the child's pid.
    Fork only while the process has one thread (the helper before its first, the fork server)."""
    pid = os.fork()
    if pid == 0:
        try:
            child(*args)
        finally:
            os._exit(code)
    return pid


def _exec(module: str, args: list[str], **env: str) -> None:
    os.chdir("/")
    os.execve(sys.executable, [sys.executable, "-I", "-m", module, *args], {"PATH": os.defpath, "LANG": "C.UTF-8", **env})


def _child(req: dict[str, Any], fds: list[int], walker: tuple[int, int]) -> None:
    """In the fork server's child: become the worker or walker ``req`` asks for, holding ``fds``."""
    _keep_only(fds)
    if req["type"] == "spawn":
        _become(req["uid"], req["gid"], req["groups"], WORKER_START_GID)
        _exec("mcpd.worker", ["--fd", "3", "--ctl", "4", "--parent", str(os.getppid()), "--limits", req["limits"]], HOME=req["home"], USER=req["user"])
    drop_to_walker(*walker)
    _exec("mcpd.walker", ["--fd", "3"])


def policy_child(uid: int, gid: int, config: str, fds: list[int]) -> None:
    """In a child the helper forked while single-threaded: keep only ``fds`` (the front's
    listening socket as fd 3, the channels to the helper from fd 4 on) and stderr (the journal),
    become ``uid``/``gid`` (no supplementary group), set no_new_privs and the parent-death signal,
    and exec ``python -I -m mcpd.policy``."""
    _keep_only(fds, (0, 1))
    _become(uid, gid, [])
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it: dies with the helper
    _exec("mcpd.policy", ["--config", config, "--channels", str(len(fds) - 1)])


def serve(sock: socket.socket, walker: tuple[int, int], *helpers: socket.socket) -> None:
    """In the fork server: close the helper's sockets ``helpers`` (its end of ``sock``, so the
    helper's exit ends this process, and the front's listening socket), then serve spawn and walk
    requests on ``sock`` until the helper closes it; reap children. ``walker``: the ``(uid,
    gid)`` walkers run as."""
    for held in helpers:
        held.close()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:  # reap what has exited
                pass
        if not select.select([sock], [], [], 0.5)[0]:
            continue
        req, fds = frames.recv_frame_fds(sock, FORK_REQUEST_CAP, 4)
        if req is None:
            return
        pid = forked(_child, req, fds, walker)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        frames.send_frame(sock, {"pid": pid}, [pidfd])
        os.close(pidfd)


class ForkServer:
    """The helper's handle on the fork server (thread-safe; one request at a time).

    Args:
        sock: the helper's end of the socketpair.
        pid: the fork server's pid.
    """

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock, self.pid = sock, pid
        self._lock = threading.Lock()

    def request(self, req: dict[str, Any], fds: list[int]) -> tuple[int, int]:
        """Send one ``spawn`` or ``walk`` request with ``fds`` (which stay the caller's to close).

        Returns:
            ``(pid, pidfd)`` of the new child; the pidfd is the caller's to close.
        Raises:
            OSError: the fork server is gone or answered without a pidfd.
        """
        with self._lock:
            frames.send_frame(self.sock, req, fds)
            reply, got = frames.recv_frame_fds(self.sock, 4096, 1)
        if reply is None or len(got) != 1:
            for fd in got:
                os.close(fd)
            raise OSError("the fork server did not answer")
        return int(reply["pid"]), got[0]


def start(walker: tuple[int, int], listener: socket.socket) -> ForkServer:
    """Fork the fork server; walkers will run as ``walker`` = ``(uid, gid)`` (not root's: the
    caller checks); ``listener``, the front's listening socket, is closed there. Call before any
    thread exists (raises ``RuntimeError`` otherwise)."""
    if threading.active_count() != 1:
        raise RuntimeError("the fork server must be started before any thread")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    frames.limit_sends(theirs, frames.SEND_SECONDS)
    pid = forked(serve, theirs, walker, ours, listener, code=0)
    theirs.close()
    return ForkServer(ours, pid)

