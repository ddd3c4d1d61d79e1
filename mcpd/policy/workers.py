"""The policy process's worker registry: the workers it started, their checks and their end.

A worker gets a descriptor only once seen hardened (:func:`check_started`); a call names only a
worker of its own principal (:func:`bound_worker`); an ended worker is forgotten once
(:func:`kill_worker`, :func:`reap`), and its control socket is kept while another process of its
account holds what this process sent on it (:func:`untaken`). The sweep (:func:`reap`,
:func:`end_revoked`) runs from the accept loop (:mod:`mcpd.policy.connections`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pwd
import resource
import select
import socket
import stat
import threading
import time

from mcpd.common import frames, identity
from mcpd.helper.wire.errors import PERMISSION_DENIED, ToolError
from mcpd.helper.wire.rootconf import WORKER_START_GID
from mcpd.policy.state import EXITED_KEPT, State, Worker

REVOKE_SECONDS = 1.0  # how often the workers' tokens are checked again (end_revoked)
START_SECONDS = 10.0  # a worker must have reported itself hardened within this of its first privileged call
NOT_YOURS = "not your worker"  # the reason of a call naming a worker that is not its principal's
#: descriptors a principal's workers may leave untaken (sent by this process, never read off their
#: control socket: a peek leaves them there) before its privileged content calls are refused; each
#: counts against this account's soft RLIMIT_NOFILE in the kernel (SCM_RIGHTS in flight)
UNTAKEN_MAX = 4
UNTAKEN = "its workers left descriptors untaken"  # the reason of a call refused for that
#: all principals' untaken descriptors together, past which a principal with any gets no more:
#: a quarter of this process's soft RLIMIT_NOFILE (the kernel's bound on them all)
UNTAKEN_TOTAL = max(UNTAKEN_MAX, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4)


def check_started(w: Worker, pw: pwd.struct_passwd) -> str | None:
    """Why worker ``w`` of account ``pw`` may not be passed a descriptor, or None when it may. It
    must have reported itself hardened, or do so within :data:`START_SECONDS` (its first frame on
    its control socket: ``{"ready": true}`` and a descriptor of its own ``/proc/self/status``), and
    that file must show it as it should be now (:func:`_status_problem`). Called before a worker's
    first privileged call, which holds ``w.busy``."""
    fds: list[int] = []
    try:
        w.ctl.settimeout(START_SECONDS)
        hello, fds = frames.recv_frame_fds(w.ctl, 4096, 1)
        w.ctl.settimeout(None)
    except (OSError, frames.FrameError):
        hello = None
    try:
        if hello != {"ready": True} or len(fds) != 1:
            return "it did not report itself hardened"
        return _status_problem(fds[0], w.pid, pw)
    finally:
        for fd in fds:
            os.close(fd)


_PROC_DEV: list[int] = []  # st_dev of this process's /proc (the workers share the mount)


def _status_problem(fd: int, pid: int, pw: pwd.struct_passwd) -> str | None:
    """What is wrong with the worker ``pid`` of account ``pw`` according to ``fd``, a descriptor
    of its ``/proc/PID/status`` it opened once hardened, or None. The kernel writes that file, and
    only the process itself (or one that may ptrace it) opens it under the unit's
    ``ProtectProc=invisible``: a regular file of this process's ``/proc`` owned by root (the
    ``/proc`` files of a process are its own while it is dumpable), for process ``pid``, traced by
    none, all four uids the account's, all four gids the account's (or all the start gid, on kernels
    that reset them at ``exec``: see :func:`mcpd.worker.main._seal`), no_new_privs, no capability."""
    st = os.fstat(fd)
    if not _PROC_DEV:
        _PROC_DEV.append(os.stat("/proc/self/status").st_dev)
    if not stat.S_ISREG(st.st_mode) or st.st_dev != _PROC_DEV[0]:
        return "its status descriptor is no file of /proc"
    if st.st_uid != 0:
        return "it is dumpable"
    fields = dict(line.partition(":\t")[::2] for line in os.pread(fd, 16384, 0).decode("ascii", "replace").splitlines())
    want = {"Pid": str(pid), "TracerPid": "0", "Uid": "\t".join([str(pw.pw_uid)] * 4), "NoNewPrivs": "1",
            "CapPrm": "0" * 16, "CapEff": "0" * 16, "CapAmb": "0" * 16}
    wrong = [key for key, value in want.items() if fields.get(key) != value]
    if fields.get("Gid") not in ("\t".join([str(pw.pw_gid)] * 4), "\t".join([str(WORKER_START_GID)] * 4)):
        wrong.append("Gid")
    return f"its state is not a hardened worker's: {', '.join(wrong)}" if wrong else None


def bound_worker(state: State, principal: identity.Principal, pid: int) -> Worker:
    with state.lock:
        w = state.workers.get(pid)
    if w is None or w.owner != (principal.name, principal.os_user):
        state.audit.record("alert", user=principal.name, pid=pid, reason="worker of another principal or unknown")
        raise ToolError(PERMISSION_DENIED, "permission denied", reason=NOT_YOURS)
    return w


def _forget(state: State, w: Worker) -> bool:
    """Take ``w`` out of the worker table (its owner kept in :attr:`State.exited`); whether this
    caller did, and so owns closing its pidfd and control socket (two requests or the reaper
    racing for one worker must never close a descriptor number twice: the second close would hit
    whatever the number was given to meanwhile, another principal's socket or file)."""
    with state.lock:
        if state.workers.get(w.pid) is not w:
            return False
        del state.workers[w.pid]
        state.exited[w.pid] = w.owner
        while len(state.exited) > EXITED_KEPT:
            state.exited.popitem(last=False)
    return True


def _outq(sock: socket.socket) -> int:
    """Bytes this process sent on ``sock`` that its peer has not read yet (``SIOCOUTQ``; a closed
    socket: 0). A message's descriptors stay in flight, counted against this account, until the
    peer reads the message (not a peek) or the last holder of the peer end closes it."""
    try:
        return frames.queued_bytes(sock.fileno())
    except (OSError, ValueError):
        return 0


def _retire(state: State, w: Worker) -> None:
    """Close the control socket of ``w``, forgotten; one whose peer end still holds what this
    process sent (another process of the account kept a copy of it) is kept in
    :attr:`State.untaken` instead, counted against its owner until it is released."""
    if _outq(w.ctl) == 0:
        w.ctl.close()
        return
    with state.lock:
        state.untaken.setdefault(w.owner, []).append(w.ctl)


def untaken(state: State, owner: tuple[str, str] | None = None, calling: Worker | None = None) -> int:
    """How many control sockets of ``owner`` (a principal's ``(name, os_user)``) or, with None,
    of everyone, still hold what this process sent on them: those of ended workers kept in
    :attr:`State.untaken` (closed and dropped here once released) and those of live workers
    between calls that hold a call they reported but never took off their socket (a peek).
    ``calling``, the worker of the call asking, is killed first when it is one of those (it is
    then counted only when another process keeps a copy of its socket). The rule: a principal
    with :data:`UNTAKEN_MAX` of them gets no more descriptors until they are released."""
    if calling is not None and calling.checked and not calling.busy.locked() and _outq(calling.ctl):
        kill_worker(state, calling, "a privileged call could not be passed to it: it did not read its control socket")
    with state.lock:
        live = [w for w in state.workers.values() if (owner is None or w.owner == owner) and w.checked]
    count = sum(1 for w in live if not w.busy.locked() and _outq(w.ctl))
    with state.lock:
        owners = list(state.untaken) if owner is None else [owner]
        for who in owners:
            kept = []
            for s in state.untaken.get(who, []):
                if _outq(s):
                    kept.append(s)
                else:
                    s.close()
            if kept:
                state.untaken[who] = kept
            else:
                state.untaken.pop(who, None)
            count += len(kept)
    return count


def kill_worker(state: State, w: Worker, reason: str = "the daemon stopping", token_id: str | None = None) -> None:
    """SIGKILL worker ``w`` (root does, through its pidfd), wait (at most 5 s) until it is gone, forget it; one
    audit ``kill`` record saying why (``reason``) and, when asked by the front, with ``token_id``. Nothing
    when another request or the reaper has already forgotten it."""
    if not _forget(state, w):
        return
    with contextlib.suppress(ToolError, OSError):  # already gone: root forgot it
        state.root.kill(w.pid)
    os.close(w.pidfd)
    _retire(state, w)
    state.audit.record("kill", user=w.owner[0], os_user=w.owner[1], token_id=token_id, pid=w.pid,
                       decision="accept", reason=reason)



def reap(state: State) -> None:
    """Forget workers that have exited (their pidfd is readable), one audit ``exit`` record each."""
    with state.lock:
        items = list(state.workers.values())
    poller = select.poll()  # (not select(): no limit on descriptor numbers)
    for w in items:
        poller.register(w.pidfd, select.POLLIN)
    # (a pidfd a kill on another thread closed meanwhile comes back POLLNVAL, not readable)
    done = {fd for fd, events in poller.poll(0) if events & select.POLLIN}
    for w in items:  # one in a call is left to that call (it reads the worker's last report first)
        if w.pidfd in done and not w.busy.locked() and _forget(state, w):
            os.close(w.pidfd)
            _retire(state, w)
            state.audit.record("exit", user=w.owner[0], os_user=w.owner[1], pid=w.pid, reason="worker ended")


def _still_bound(state: State, w: Worker, usable: dict[str, bool]) -> bool:
    """Whether the token that spawned ``w`` still authenticates its principal: in ``users.yaml``
    (the principal still there, bound to the same account, with that token unexpired), as a
    live login token whose account may still use it (``usable``: root's answer per account, asked
    once per sweep), or as an OAuth token not past its ``exp`` (and the leeway) whose account may
    still use it (this process keeps no token: the front's re-check ends the others sooner)."""
    users, (name, os_user) = state.users.current, w.owner
    if w.oauth_expires:  # an OAuth token (not kept here): bound until its exp, while its account may log in
        return time.time() < w.oauth_expires + state.cfg.oauth.leeway_seconds and _usable(state, os_user, usable)
    if not w.login:
        p = users.get(name)
        now = datetime.datetime.now(datetime.UTC)
        return p is not None and p.os_user == os_user and any(
            t.id == w.token_id and (not t.expires or now < identity.parse_time(t.expires)) for t in p.tokens)
    rec = state.issued.live(w.token_id)
    principal = None if rec is None or rec.os_user != os_user else identity.login_principal(users, os_user, rec.id)
    if principal is None or principal.name != name:
        return False
    return _usable(state, os_user, usable)


def _usable(state: State, os_user: str, usable: dict[str, bool]) -> bool:
    """Root's answer whether ``os_user`` may still use its tokens, asked once per sweep (``usable``)."""
    if os_user not in usable:
        try:
            usable[os_user] = state.root.usable(os_user)
        except ToolError:  # root busy: judged again at the next sweep
            usable[os_user] = True
    return usable[os_user]


def end_revoked(state: State) -> None:
    """End the workers whose principal was removed or rebound, whose token was removed, rotated
    or expired, or whose login's account was locked or expired (docs/REFERENCE.md §5.3: within seconds). The
    front ends them too; this is for a front that would not (docs/PRIVSEP.md §7): it could
    otherwise go on reading with the account's rights through a worker it holds. Each is killed
    (one ``kill`` record) on a thread of its own, so the accept loop never waits on root."""
    state.users.refresh()
    with state.lock:
        items = list(state.workers.values())
    usable: dict[str, bool] = {}
    for w in items:
        try:
            bound = _still_bound(state, w, usable)
        except (ValueError, OSError):  # a malformed expiry or an unreadable token record: fail closed
            bound = False
        if not bound:
            threading.Thread(target=kill_worker, args=(state, w, "its principal or token was revoked"),
                             daemon=True).start()

