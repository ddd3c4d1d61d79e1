"""The policy process's request table and connections (SPEC §4, §4.5a, §5; docs/PRIVSEP.md).

The front's peer on the helper socket is this process (account ``mcpd-policy``, no capability),
not root. Like OpenSSH's monitor: a fixed table :data:`REQUESTS` of request types, each with a
strict schema (unknown, missing or wrongly typed keys are refused), a capacity class and a
handler. The front keeps a few persistent connections and multiplexes requests on them by ``id``;
each capacity class has a bounded number of requests in flight (and its own threads; privileged
calls run on their connection's thread, see :meth:`Connection.serve`), so a burst of one kind
(logins) never takes capacity from another (token checks, spawns, privileged calls): a full class
answers ``HELPER_UNAVAILABLE`` (reason ``busy``) at once. Anything malformed (a frame over the
cap, a body that is not one JSON object, an unknown type, a schema break, a frame not finished
within :data:`FRAME_SECONDS`) is an audit ``alert`` and ends that connection; it never kills a
thread.

It trusts nothing the front says: every request that acts for a principal carries that
principal's token, verified here, and the grant is decided here. What needs root it asks of the
root helper (:mod:`mcpd.policy.rootclient`): for ``files/read``/``files/filetype`` root opens the
granted file once (its checked opener); for ``files/read`` this process passes the descriptor to
the caller's own worker (uid of the account, CapEff 0, no_new_privs), which runs the reading core
and answers the front directly. For ``files/filetype`` the descriptor stays here: the worker gets
its ``fstat`` facts as data and, for a regular file, a sealed memfd holding the first
``SAMPLE_BYTES`` (copied, not parsed; :func:`mcpd.policy.opened.described`). ``files/list``/``files/find`` run as a metadata walk in a walker
(:mod:`mcpd.walker`): a killable child of root's fork server, not root, holding
CAP_DAC_READ_SEARCH only, which parses the call's arguments itself and filters every entry by the
grant.
"""

from __future__ import annotations

import array
import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime
import errno
import fcntl
import json
import logging
import os
import pwd
import resource
import select
import socket
import stat
import struct
import termios
import threading
import time
from collections.abc import Callable
from typing import Any

from mcpd.common import identity
from mcpd.helper.wire import frames
from mcpd.common.buckets import TokenBuckets
from mcpd.common.config import CAP_KEY, Config
from mcpd.helper.wire.errors import (HELPER_UNAVAILABLE, INTERNAL_ERROR, NOT_A_REGULAR_FILE, PERMISSION_DENIED, RATE_LIMITED,
                                TIMEOUT, ToolError, from_oserror)
from mcpd.common.reload import Reloading
from mcpd.helper.wire.rootconf import WORKER_START_GID, plain_ids
from mcpd.common.validate import check_path
from mcpd.common.audit.records import REFUSED_AT_OPEN, Prepared, find_fields
from mcpd.common.audit.writer import AuditLog
from mcpd.policy import grants
from mcpd.policy.grants_reload import PolicyHolder
from mcpd.policy.login import Issued, Login, Store
from mcpd.policy.opened import OpenedFiles, described
from mcpd.policy.rootclient import RootClient

log = logging.getLogger("mcpd.policy")

FRAME_SECONDS = 5.0  # a frame whose first byte arrived must be complete within this many seconds
MAX_CONNECTIONS = 32  # the front's shared connections, one per privileged call in flight, and reconnects
# capacity class -> threads (in flight: 4x); "call" requests run on their connection's thread instead
CLASSES = {"auth": 8, "spawn": 4, "call": 16, "login": 8}
CONTENT_OPS = ("files/read", "files/filetype")
WALK_OPS = {"files/list": "path", "files/find": "root"}  # walk op -> its path argument (the walker parses the rest)
#: workers one principal may have alive at once, in workers.per_account: the front's pool keeps at
#: most per_account per principal, plus the few it is replacing; a front asking for more is refused
#: (their processes share the helper unit's TasksMax, their descriptors the policy process's, with
#: every principal). Counted per principal, not per account: several principals bound to one
#: account each get their own pool in the front.
SPAWN_FACTOR = 4
REVOKE_SECONDS = 1.0  # how often the workers' tokens are checked again (end_revoked)
START_SECONDS = 10.0  # a worker must have reported itself hardened within this of its first privileged call
EXITED_KEPT = 256  # ended workers whose owner is remembered (State.exited)
WALK_MAX_SECONDS = 60.0  # files/find's largest time_budget_seconds (core.walk checks it in the walker)
_PEERCRED = struct.Struct("3i")
_ENDED = (errno.EAGAIN, errno.EPIPE, errno.ECONNRESET, errno.EBADF)  # a send error that ends a connection
NOT_YOURS = "not your worker"  # the reason of a call naming a worker that is not its principal's
#: descriptors a principal's workers may leave untaken (sent by this process, never read off their
#: control socket: a peek leaves them there) before its privileged content calls are refused; each
#: counts against this account's soft RLIMIT_NOFILE in the kernel (SCM_RIGHTS in flight)
UNTAKEN_MAX = 4
UNTAKEN = "its workers left descriptors untaken"  # the reason of a call refused for that
#: all principals' untaken descriptors together, past which a principal with any gets no more:
#: a quarter of this process's soft RLIMIT_NOFILE (the kernel's bound on them all)
UNTAKEN_TOTAL = max(UNTAKEN_MAX, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4)


class Refused(Exception):
    """A request that ends its connection with an audit ``alert`` (reason in the message)."""


@dataclasses.dataclass
class Worker:
    """A worker this helper started: bound to one principal (name and OS account)."""

    pid: int
    pidfd: int
    owner: tuple[str, str]
    ctl: socket.socket
    token_id: str = ""  # the token that spawned it: the worker ends when it no longer authenticates
    login: bool = False  # a password login's token (else one in users.yaml)
    busy: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    reports: bytearray = dataclasses.field(default_factory=bytearray)  # bytes of its reports read so far
    checked: bool = False  # seen hardened (_started), which it must be before it gets a descriptor


@dataclasses.dataclass
class State:
    """Everything the handlers share."""

    cfg: Config
    audit: AuditLog
    users: Reloading[dict[str, identity.UserRecord]]
    policy: PolicyHolder
    root: RootClient
    issued: Store
    login: Login
    workers: dict[int, Worker] = dataclasses.field(default_factory=dict)
    #: the owners of the workers last seen ending (pid -> owner), at most EXITED_KEPT: the front's
    #: kill request for one it found dead is answered without an alert (it is no attack)
    exited: collections.OrderedDict[int, tuple[str, str]] = dataclasses.field(default_factory=collections.OrderedDict)
    opened: OpenedFiles = dataclasses.field(default_factory=OpenedFiles)
    #: the control sockets of ended workers whose peer end still holds something this process
    #: sent (SIOCOUTQ above 0), per owner, under ``lock``: kept open only to see when it is released
    untaken: dict[tuple[str, str], list[socket.socket]] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    #: workers started per principal (under ``lock``): twice the front's bucket, so the front's own
    #: bound is never met here, even with its requests delayed or after a restart of the front; a
    #: front that asks past it (compromised) is refused without an audit record per request
    spawns: TokenBuckets = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.spawns = TokenBuckets(2 * self.cfg.workers.spawn_burst, self.cfg.workers.spawns_per_second)

    def authenticate(self, token: str) -> tuple[identity.Principal, Issued | None] | None:
        """The principal of a ``users.yaml`` token or of a login token (SPEC §5), else None."""
        self.users.refresh()
        principal = identity.verify(self.users.current, token)
        if principal is not None:
            return principal, None
        rec = self.issued.verify(token)
        if rec is None or not self.root.usable(rec.os_user):  # locked or expired since the login
            return None
        principal = identity.login_principal(self.users.current, rec.os_user, rec.id)
        return None if principal is None else (principal, rec)


def _who(state: State, req: dict[str, Any]) -> tuple[identity.Principal, Issued | None]:
    """The principal of the request's token; else one ``reject`` record (for a privileged call:
    its tool, route and requested path, as any other refusal of a call names them) and
    ``PERMISSION_DENIED`` (reason ``invalid token``)."""
    found = state.authenticate(req["token"])
    if found is None:
        call = {}
        if req["type"] == "privileged_call":
            path = req["args"].get(WALK_OPS.get(req["op"], "path"))
            call = {"route": "privileged", "requested_path": path if isinstance(path, str) else None,
                    **find_fields(req["op"], req["args"])}
        state.audit.record("reject", tool=req.get("op", req["type"]), decision="reject", reason="invalid token",
                           session=req.get("session"), peer=req.get("peer"), **call)
        raise ToolError(PERMISSION_DENIED, "permission denied", reason="invalid token")
    return found


# ------------------------------------------------------------------ handlers


def handle_authenticate(state: State, req: dict[str, Any]) -> dict[str, Any]:
    """``authenticate {token}`` → ``{principal: {name, os_user, token_id}}``, or ``ok: false``."""
    found = state.authenticate(req["token"])
    if found is None:
        return {"ok": False}
    return {"ok": True, "principal": dataclasses.asdict(found[0])}


def handle_spawn(state: State, req: dict[str, Any]) -> dict[str, Any]:
    """``spawn_worker {token}`` → a worker running as the token's principal's OS account (never
    uid 0, never one in :data:`~mcpd.helper.wire.rootconf.WORKER_START_GID`), bound to that principal;
    the front's socket end travels back by SCM_RIGHTS. The ``spawn`` record is written once that
    socket has reached the front, a ``spawn_failed`` one (and the worker killed) when it did not.
    The worker is checked before its first privileged call (:func:`_started`), not here: no
    thread waits here for a worker's start. Past the principal's :attr:`State.spawns`
    bucket: ``RATE_LIMITED`` (nothing started, nothing audited; a start root then failed gives its
    token back); past :data:`SPAWN_FACTOR` x
    ``per_account`` workers of the principal alive: ``HELPER_UNAVAILABLE``."""
    principal, login = _who(state, req)
    try:
        pw = pwd.getpwnam(principal.os_user)
    except KeyError:
        raise ToolError(PERMISSION_DENIED, "no such OS account", reason="unknown OS account") from None
    if not plain_ids(pw.pw_uid, pw.pw_gid):  # root's, or -1 (which setresuid takes as "no change")
        raise ToolError(PERMISSION_DENIED, "workers never run as root", reason="root account")
    if WORKER_START_GID in os.getgrouplist(pw.pw_name, pw.pw_gid):  # its processes could take a starting worker
        raise ToolError(PERMISSION_DENIED, f"the account is in group {WORKER_START_GID}, which workers start with",
                        reason="start group")
    with state.lock:
        alive = sum(w.owner == (principal.name, principal.os_user) for w in state.workers.values())
    if alive >= SPAWN_FACTOR * state.cfg.workers.per_account:  # the front's pool keeps per_account
        state.audit.record("alert", user=principal.name, os_user=principal.os_user,
                           reason="too many workers for one principal")
        raise ToolError(HELPER_UNAVAILABLE, "this principal has too many workers", reason="busy")
    with state.lock:
        wait = state.spawns.take(principal.name, time.monotonic())
    if wait:
        raise ToolError(RATE_LIMITED, f"too many new workers for this principal; retry in {wait:.2f} s",
                        limit=state.spawns.burst, retry_after_seconds=round(wait, 3))
    try:
        pid, front, ctl, pidfd = state.root.spawn(pw.pw_name, json.dumps(dataclasses.asdict(state.cfg.read)))
    except ToolError:  # root refused, was busy or did not answer: no worker of the principal's
        with state.lock:
            state.spawns.give_back(principal.name, time.monotonic())
        raise
    w = Worker(pid, pidfd, (principal.name, principal.os_user), ctl, principal.token_id, login is not None)
    who = {"user": principal.name, "os_user": principal.os_user, "token_id": principal.token_id, "pid": pid}
    with state.lock:
        state.workers[pid] = w

    def sent(delivered: bool) -> None:
        if delivered:
            state.audit.record("spawn", **who, decision="accept")
            return
        state.audit.record("spawn_failed", **who, outcome=INTERNAL_ERROR, reason="its socket did not reach the front")
        kill_worker(state, w, "its socket did not reach the front")

    return {"ok": True, "pid": pid, "_fds": [front], "_sent": sent}


def _started(w: Worker, pw: pwd.struct_passwd) -> str | None:
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


def _bound_worker(state: State, principal: identity.Principal, pid: int) -> Worker:
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
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0])
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


def kill_worker(state: State, w: Worker, reason: str = "helper stopping", token_id: str | None = None) -> None:
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


def handle_kill(state: State, req: dict[str, Any]) -> dict[str, Any]:
    """``kill_worker {token, pid}``: SIGKILL a worker bound to the token's principal (through its
    pidfd, so a reused pid is never hit); one of its workers that has ended on its own meanwhile
    is answered ``ok`` (nothing to kill); any other pid is refused and audited as an alert."""
    principal, _ = _who(state, req)
    with state.lock:
        gone = req["pid"] not in state.workers and state.exited.get(req["pid"]) == (principal.name, principal.os_user)
    if gone:  # it ended before the front noticed (its exit is recorded): nothing to kill
        return {"ok": True}
    kill_worker(state, _bound_worker(state, principal, req["pid"]), "asked by the front", principal.token_id)
    return {"ok": True}


def _deadline(args: dict[str, Any], default: float) -> float:
    budget = args.get("time_budget_seconds")  # not parsed here: NaN, bool and junk get the default
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        return default
    return float(min(budget, WALK_MAX_SECONDS)) + 5.0  # (min first: float(10**400) would overflow)


def handle_call(state: State, req: dict[str, Any]) -> dict[str, Any]:
    """``privileged_call {token, session, peer, op, args, cap?, worker?, rid?}`` (SPEC §4.1-4.5a).

    Decides the grant for the token's principal, then: content ops open the file once and hand the
    descriptor to the principal's worker ``worker`` (its reply, id ``rid``, goes to the front);
    walk ops run in a killable child and return their raw result. One audit record per call
    received, whatever happens to it (the front records none of these: it records only the calls
    whose request never reached this process).
    """
    started = time.monotonic()
    principal, login = _who(state, req)
    op, who = req["op"], {"session": req["session"], "peer": req["peer"], "user": principal.name,
                          "os_user": principal.os_user, "token_id": principal.token_id, "tool": req["op"],
                          "route": "privileged", **find_fields(req["op"], req["args"])}
    key = WALK_OPS.get(op, "path")
    args = dict(req["args"])  # only the path here: the worker or walker parses the rest (tool's own parse_args)
    try:
        if op not in WALK_OPS and op not in CONTENT_OPS:
            raise ToolError(PERMISSION_DENIED, "permission denied", reason="unknown tool")
        requested = check_path(args, key)
    except ToolError as exc:
        state.audit.record("reject", decision="reject", reason=exc.message, outcome=exc.code, **who)
        raise
    groups = grants.os_groups(principal.os_user)
    policy = state.policy.policy
    login_time = None if login is None else datetime.datetime.fromtimestamp(login.login_time, datetime.timezone.utc)
    used = login is not None and state.issued.used(login.id)  # before this call's claim: the walker decides alike
    decision = grants.decide(policy, principal.os_user, groups, op, requested, grants.utcnow(),
                             login_time=login_time, login_used=used)
    if decision.allowed and decision.reauth_after == 0 and login is not None and not state.issued.claim(login.id):
        decision = dataclasses.replace(decision, allowed=False, reason=grants.REAUTH)  # one login, one call
    # the rule that decided; for a refusal because a rule expired, that rule and when (decide's note)
    record = dict(who, requested_path=requested, resolved_path=decision.resolved_path,
                  grant=decision.rule or (decision.note if not decision.allowed and decision.note else None))
    if not decision.allowed or decision.resolved_path is None:
        state.audit.record("reject", decision="reject", reason=decision.reason, outcome=PERMISSION_DENIED, bytes=0,
                           duration_ms=_ms(started), **record)
        hint = "; run: linuxctl login, then use the new token" if decision.reason == grants.REAUTH else ""
        raise ToolError(PERMISSION_DENIED, f"permission denied: {requested}: {decision.reason}{hint}",
                        path=requested, reason=decision.reason)
    args[key] = decision.resolved_path
    try:
        if op not in WALK_OPS:
            reply, outcome, size, prepared = _content(state, op, args, principal, decision.covers_root, req, record)
            if outcome in (PERMISSION_DENIED, NOT_A_REGULAR_FILE):  # the worker's own check refused it
                state.audit.record("reject", decision=REFUSED_AT_OPEN, reason=f"refused by the worker ({outcome})",
                                   outcome=outcome, bytes=0, duration_ms=_ms(started), **record)
            else:
                state.audit.finish(prepared, outcome=outcome, bytes=size, duration_ms=_ms(started))
            return reply
        fresh = None if login is None else (login.login_time, used)
        reply = _walk(state, policy, op, args, principal.os_user, sorted(groups), decision.covers_root, fresh)
        outcome, size = None, len(reply["result"].get("entries", reply["result"].get("matches", [])))
    except ToolError as exc:
        if (refused := _refusal(exc)) is not None:  # root's opener (or the secrets' check, or the walker) said no
            state.audit.record("reject", decision=refused[0], reason=refused[1], outcome=exc.code, bytes=0,
                               duration_ms=_ms(started), **record)
        else:  # granted, and failed: TIMEOUT, a worker that died, no such file ...
            state.audit.record("accept", decision="accept", reason="granted", outcome=exc.code, bytes=0,
                               reason_detail=exc.details.get("reason"), duration_ms=_ms(started), **record)
        raise
    except Refused:  # a content call without its worker: the alert is its record, the connection ends
        raise
    except Exception:  # a flaw here: the call still has its one record (granted, failed)
        log.exception("privileged %s failed after its grant", op)
        state.audit.record("accept", decision="accept", reason="granted", outcome=INTERNAL_ERROR, bytes=0,
                           duration_ms=_ms(started), **record)
        raise ToolError(INTERNAL_ERROR, "internal error") from None
    state.audit.record("accept", decision="accept", reason="granted", outcome=outcome, bytes=size,
                       duration_ms=_ms(started), **record)
    return reply


def _refusal(exc: ToolError) -> tuple[str, str] | None:
    """``(decision, reason)`` of a call the grants allowed and a later step refused, else None (a
    failure: the call's record stays ``accept`` with the code as ``outcome``). ``PERMISSION_DENIED``
    and ``NOT_A_REGULAR_FILE`` after the grant are root's opener (a symlink in the path, several
    hard links, the path changed, not a regular file or directory), the check of the real path
    against the daemon's secrets, or the walker opening its folder: :data:`REFUSED_AT_OPEN`; a
    worker the front named that is not the principal's is a plain ``reject``."""
    if exc.code == HELPER_UNAVAILABLE and exc.details.get("reason") == UNTAKEN:
        return "reject", UNTAKEN
    if exc.code == PERMISSION_DENIED:
        reason = str(exc.details.get("reason") or exc.message)
        return ("reject" if reason == NOT_YOURS else REFUSED_AT_OPEN), reason
    if exc.code == NOT_A_REGULAR_FILE:
        kind = exc.details.get("type")
        return REFUSED_AT_OPEN, exc.message.partition(":")[0] + (f" ({kind})" if kind else "")
    return None


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


def _content(state: State, op: str, args: dict[str, Any], principal: identity.Principal, follow: bool,
             req: dict[str, Any], record: dict[str, Any]) -> tuple[dict[str, Any], str | None, int, Prepared]:
    """Hand the opened file to the principal's worker (``files/read``: root's descriptor;
    ``files/filetype``: only :func:`~mcpd.policy.opened.described`'s facts and sample memfd) and
    wait for its report; the accept record (``record``'s fields, and ``real_path``, the real path
    of what root opened when it is not the one judged) is encoded while the worker reads, and
    written by the caller."""
    if not isinstance(req.get("worker"), int) or req.get("rid") is None:
        raise Refused("content call without worker and rid")
    w = _bound_worker(state, principal, req["worker"])
    held = untaken(state, w.owner, w)
    if state.workers.get(w.pid) is not w:  # it was one of them: killed
        raise ToolError(INTERNAL_ERROR, "the worker ended during the call: it did not read its control socket")
    if held >= UNTAKEN_MAX or (held and untaken(state) >= UNTAKEN_TOTAL):
        raise ToolError(HELPER_UNAVAILABLE, f"no privileged read for this principal: its workers left {held} "
                        "descriptors untaken in their sockets (a process of its account keeps them); "
                        "none is passed until they are released", reason=UNTAKEN)
    fd = None if follow else state.opened.take(args["path"], principal.name)  # an earlier read's, checked again
    if fd is not None:
        real = args["path"]
    else:
        fd, real = state.root.open(args["path"], follow, "any" if op == "files/filetype" else "file", principal.name)
        if not follow:
            state.opened.keep(args["path"], principal.name, fd)
    if real != args["path"]:  # through a symlink (a grant on /): the record names the file root opened too
        record["real_path"] = real
    try:
        if grants.is_secret(state.policy.policy, real):
            raise ToolError(PERMISSION_DENIED, f"permission denied: {args['path']}", path=args["path"],
                            reason=grants.SECRET)
        if not w.busy.acquire(blocking=False):
            raise ToolError(HELPER_UNAVAILABLE, "that worker is busy", reason="busy")
        try:
            if not w.checked:  # once per worker: only one seen hardened gets a descriptor
                why = _started(w, pwd.getpwnam(w.owner[1]))
                if why is not None:
                    kill_worker(state, w, f"it did not start safely: {why}")
                    raise ToolError(INTERNAL_ERROR, f"the worker did not start safely: {why}")
                w.checked = True
            if req.get("cap") is not None:
                args[CAP_KEY] = req["cap"]  # the principal's max_file_bytes: it can only narrow the cap
            frame: dict[str, Any] = {"id": req["rid"], "op": op, "args": args}
            if op == "files/filetype":  # root's descriptor stays here: facts as data, a sample memfd
                try:
                    frame["facts"], sample = described(fd)
                except OSError as err:
                    raise from_oserror(err, args["path"]) from None
                os.close(fd)
                fd = -1 if sample is None else sample
            _pass(state, w, frame, [fd] if fd >= 0 else [])
            if fd >= 0:
                os.close(fd)
            fd = -1
            prepared = state.audit.prepare("accept", decision="accept", reason="granted", **record)
            report = _await_report(w, req["rid"], _deadline(args, state.cfg.workers.timeout_seconds))
            if report is None:
                report = _end_late(state, w, req["rid"])
        finally:
            w.busy.release()
    finally:
        if fd >= 0:
            os.close(fd)
    if report is None:
        raise ToolError(TIMEOUT, "the call did not finish in time")
    return {"ok": True, "dispatched": True}, report.get("code"), int(report.get("bytes") or 0), prepared


def _pass(state: State, w: Worker, frame: dict[str, Any], fds: list[int]) -> None:
    """Send one call (``frame`` and ``fds``) to worker ``w``'s control socket, never waiting: only
    when the worker has taken all it was sent before (nothing of ours unread in its socket,
    ``SIOCOUTQ`` 0: a worker reads a call whole before it reports), and only at once and whole
    (``MSG_DONTWAIT``). So at most one call and one descriptor per worker are ever in flight, and
    no thread waits on a worker that does not read. Otherwise the worker is killed and forgotten
    (its socket's queue, and the descriptor in it, go with its last holder: the worker alone) and
    this call fails: ``INTERNAL_ERROR``, the worker replaced by the front like any that ended."""
    data = frames.encode(frame)
    why = "it did not read its control socket"
    try:
        if struct.unpack("i", fcntl.ioctl(w.ctl.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0] == 0:
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
            if w.ctl.sendmsg([data], rights, socket.MSG_DONTWAIT) == len(data):
                return
    except OSError as exc:  # (EBADF: a kill on another thread closed it meanwhile)
        if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.EBADF):
            why = "it ended"
        elif exc.errno != errno.EAGAIN:
            why = f"its control socket failed ({errno.errorcode.get(exc.errno or 0, exc.errno)})"
    kill_worker(state, w, f"a privileged call could not be passed to it: {why}")
    raise ToolError(INTERNAL_ERROR, f"the worker ended during the call: {why}")


def _end_late(state: State, w: Worker, rid: Any) -> dict[str, Any] | None:
    """A worker past its call's deadline: have root SIGKILL it first (it holds the granted
    descriptor, and would otherwise still read the file and answer the front after the call was
    recorded as ``TIMEOUT`` with 0 bytes), then take the report it may have sent before it died
    (it reports before it answers, so without a report no answer left it)."""
    with contextlib.suppress(ToolError, OSError):
        state.root.kill(w.pid)
    try:
        report = _await_report(w, rid, 1.0)
    except ToolError:  # ended without (another) report
        report = None
    kill_worker(state, w, "its privileged call passed its deadline")
    return report


def _await_report(w: Worker, rid: Any, seconds: float) -> dict[str, Any] | None:
    """The worker's report ``{"id": rid, ...}`` within ``seconds``, or None; read through the
    worker's buffer (one ``recv`` per report as a rule). Reports of other ids (a call that timed
    out earlier) are skipped.

    Raises:
        ToolError: ``INTERNAL_ERROR`` when the worker ended (its socket at its end, or reset: a
            worker killed with the call's frame unread) or sent a report over 4 KiB or not a
            JSON object (a broken worker: the call fails, its record says so).
    """
    end = time.monotonic() + seconds
    while True:
        try:
            while (body := frames.take_frame(w.reports, 4096)) is not None:
                if (report := frames.decode_body(body)).get("id") == rid:
                    return report
        except frames.FrameError:
            raise ToolError(INTERNAL_ERROR, "the worker sent a malformed report") from None
        left = end - time.monotonic()
        try:
            if left <= 0 or not frames.ready([w.ctl.fileno()], left):
                return None
            chunk = w.ctl.recv(frames.READ_CHUNK)
        except (OSError, ValueError):  # ECONNRESET: it died with our frame unread; closed: reaped meanwhile
            chunk = b""
        if not chunk:
            raise ToolError(INTERNAL_ERROR, "the worker ended during the call")
        w.reports += chunk


def _walk(state: State, policy: grants.Policy, op: str, args: dict[str, Any], os_user: str, groups: list[str],
          follow: bool, login: tuple[float, bool] | None = None) -> dict[str, Any]:
    """Run one walk in a new walker (root's fork server; :mod:`mcpd.walker`): send it the call and
    ``policy``, the grants that decided the call (not the ones in force now: a reload since the
    decision must not filter its entries, or the answer would be one neither grants give), wait
    for its one reply until the deadline, then have root SIGKILL it whatever happened
    (``TIMEOUT`` when no reply came in time, ``INTERNAL_ERROR`` when it ended without one).
    ``login``: the caller's password login (UNIX login time, whether its one ``reauth_after: 0``
    call was used before this one), or None for a static token, so the walker judges every
    entry's ``reauth_after`` as this call was judged."""
    pid, ours, pidfd = state.root.walk()
    # (the frame after the walker's start: whatever a reload does meanwhile, it carries ``policy``)
    frame = {"op": op, "args": args, "os_user": os_user, "groups": groups, "follow": follow,
             "grants": policy.text, "secrets": list(policy.secrets),
             "login_time": None if login is None else login[0], "login_used": login is not None and login[1]}
    end = time.monotonic() + _deadline(args, state.cfg.workers.timeout_seconds)
    try:
        ours.settimeout(max(end - time.monotonic(), 0.001))
        frames.send_frame(ours, frame)
        ours.settimeout(max(end - time.monotonic(), 0.001))
        reply = frames.recv_frame(ours, frames.reply_cap(state.cfg.read.response_cap)) or {"ok": False}
    except TimeoutError:
        reply = None
    except (OSError, frames.FrameError):  # it ended (or garbled) without a reply: INTERNAL_ERROR
        reply = {"ok": False}
    finally:
        ours.close()
        os.close(pidfd)
        with contextlib.suppress(ToolError, OSError):
            state.root.kill(pid)
    if reply is None:
        raise ToolError(TIMEOUT, "the call did not finish in time")
    if not reply.get("ok") or not isinstance(reply.get("result"), dict):
        raise ToolError.from_dict(reply.get("error"))
    return {"ok": True, "result": reply["result"]}


def handle_login(state: State, req: dict[str, Any]) -> dict[str, Any]:
    """``pam_login {user, password, peer}`` (SPEC §5.2, §5.3) → ``{token, expires, os_user}`` once,
    or ``ok: false`` whatever went wrong (the reason is in the audit record only); every answer
    leaves after the same time (:mod:`mcpd.policy.login`)."""
    found = state.login.login(req["user"], req["password"], req["peer"])
    if found is None:
        return {"ok": False}
    return {"ok": True, "token": found[0], "expires": found[1].expires, "os_user": found[1].os_user}


def handle_revoke(state: State, req: dict[str, Any]) -> dict[str, Any]:
    """``revoke {token}``: the holder of a login token deletes it (``linuxctl logout``)."""
    rec = state.issued.verify(req["token"])
    if rec is None:
        return {"ok": False}
    state.issued.revoke(rec.id)
    state.audit.record("logout", tool="login", os_user=rec.os_user, token_id=rec.id, decision="accept",
                       reason="revoked by its holder")
    return {"ok": True}


Handler = Callable[[State, dict[str, Any]], dict[str, Any]]
_ID = (int, True, 0)
_TOKEN = (str, True, 256)

#: type -> (capacity class, schema {key: (type, required, max length)}, handler). Nothing else is served.
REQUESTS: dict[str, tuple[str, dict[str, tuple[type, bool, int]], Handler]] = {
    "authenticate": ("auth", {"token": _TOKEN}, handle_authenticate),
    "revoke": ("auth", {"token": _TOKEN}, handle_revoke),
    "spawn_worker": ("spawn", {"token": _TOKEN}, handle_spawn),
    "kill_worker": ("spawn", {"token": _TOKEN, "pid": (int, True, 0)}, handle_kill),
    "privileged_call": ("call", {"token": _TOKEN, "session": (str, True, 64), "peer": (str, True, 100),
                                 "op": (str, True, 64), "args": (dict, True, 0), "cap": (int, False, 0),
                                 "worker": (int, False, 0), "rid": (int, False, 0)}, handle_call),
    "pam_login": ("login", {"user": (str, True, 64), "password": (str, True, 4096), "peer": (str, True, 100)},
                  handle_login),
}


#: each request type's whole schema: its own keys, ``type`` and ``id``
_SCHEMAS = {kind: dict(entry[1], type=(str, True, 32), id=_ID) for kind, entry in REQUESTS.items()}


def check_request(req: dict[str, Any]) -> str:  # noqa: C901
    """Return the request's type after checking it against its schema (strict: unknown keys,
    missing keys, wrong types and overlong strings are refused). Raises :class:`Refused`."""
    kind = req.get("type")
    if not isinstance(kind, str) or kind not in REQUESTS:
        raise Refused("unknown request type")
    schema = _SCHEMAS[kind]
    for key in req.keys() - schema.keys():
        raise Refused(f"{kind}: unknown key {key!r}")
    for key, (typ, required, limit) in schema.items():
        if key not in req:
            if required:
                raise Refused(f"{kind}: missing key {key!r}")
            continue
        value = req[key]
        if not isinstance(value, typ) or isinstance(value, bool) or (limit and len(str(value)) > limit):
            raise Refused(f"{kind}: malformed key {key!r}")
    return kind


# ------------------------------------------------------------------ connections


class Connection:
    """One persistent front connection: a reader thread and replies sent under one lock, each
    send waiting at most :data:`~mcpd.helper.wire.frames.SEND_SECONDS` for the front to read."""

    def __init__(self, state: State, sock: socket.socket, peer: str,
                 pools: dict[str, tuple[concurrent.futures.ThreadPoolExecutor, threading.Semaphore]]) -> None:
        self.state, self.sock, self.peer, self.pools = state, sock, peer, pools
        self._send = threading.Lock()
        self._buf = bytearray()
        frames.limit_sends(sock, frames.SEND_SECONDS)

    def reply(self, rid: int, reply: dict[str, Any]) -> None:
        """Send one reply frame with the request's id; its descriptors (``reply["_fds"]``,
        sockets, closed here) travel with its first byte. ``reply["_sent"]``, when given, is
        called once with whether they reached the front: right after that byte, before the rest
        of the frame (so what it records is written before the front can act on the reply), or
        after the send failed. A send that fails, or that the front does not take within
        :data:`~mcpd.helper.wire.frames.SEND_SECONDS` (an alert), ends this connection: a front that
        stops reading holds no thread longer, and no reply is lost silently; except when only the
        descriptors could not be passed (``ETOOMANYREFS``: nothing was sent), when that request
        alone is answered ``INTERNAL_ERROR`` instead."""
        extra = reply.pop("_fds", [])
        sent: Callable[[bool], None] | None = reply.pop("_sent", None)
        data = frames.encode(dict(reply, id=rid, **({"fds": len(extra)} if extra else {})))
        delivered = False
        try:
            with self._send:
                if extra:
                    socket.send_fds(self.sock, [data[:1]], [s.fileno() for s in extra])
                    delivered = True
                    if sent is not None:
                        sent(True)
                self.sock.sendall(data[1:] if extra else data)
        except OSError as exc:
            if extra and not delivered and exc.errno not in _ENDED:  # (ETOOMANYREFS): nothing was sent
                failed = {"ok": False, "error": ToolError(INTERNAL_ERROR, "the reply's descriptors could not be sent "
                                                          f"({errno.errorcode.get(exc.errno or 0, exc.errno)})").to_dict()}
                for s in extra:
                    s.close()
                extra = []
                if sent is not None:
                    sent(False)
                    sent = None
                self.reply(rid, failed)  # that call fails, the connection goes on
                return
            self._end(exc)
        except Exception as exc:  # the frame may be cut short: this connection cannot go on
            self._end(exc)
        finally:
            for s in extra:
                s.close()
        if sent is not None and not delivered:
            sent(False)

    def _end(self, exc: BaseException) -> None:
        """End this connection after a reply's send failed with ``exc`` (an alert when it timed
        out); called in the ``except`` block."""
        if isinstance(exc, BlockingIOError):  # SO_SNDTIMEO
            self.state.audit.record("alert", peer=self.peer, reason="the front did not take a reply in time")
        elif not isinstance(exc, OSError):
            log.exception("a reply failed")
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def _run(self, kind: str, req: dict[str, Any], slot: threading.Semaphore) -> None:
        try:
            reply = REQUESTS[kind][2](self.state, req)
        except ToolError as exc:
            reply = {"ok": False, "error": exc.to_dict()}
        except Refused as exc:
            self.state.audit.record("alert", peer=self.peer, reason=str(exc))
            self.sock.shutdown(socket.SHUT_RDWR)
            return
        except Exception:
            log.exception("request %s failed", kind)
            reply = {"ok": False, "error": ToolError(INTERNAL_ERROR, "internal error").to_dict()}
        finally:
            slot.release()
        self.reply(req["id"], reply)

    def _read_frame(self) -> dict[str, Any] | None:
        """The next request, read through a buffer: one ``recv`` per request as a rule (a frame
        usually arrives whole). A frame whose first byte arrived must be complete within
        :data:`FRAME_SECONDS`. Returns None at a clean end of the connection."""
        started = None
        while True:
            if (body := frames.take_frame(self._buf, frames.HELPER_REQUEST_CAP)) is not None:
                return frames.decode_body(body)
            if self._buf:  # inside a frame
                started = started or time.monotonic()
                left = started + FRAME_SECONDS - time.monotonic()
                if left <= 0 or not frames.ready([self.sock.fileno()], left):
                    raise Refused("half-sent frame timed out")
            chunk = self.sock.recv(frames.READ_CHUNK)
            if not chunk:
                if self._buf:
                    raise frames.FrameError("connection closed inside a frame")
                return None
            self._buf += chunk

    def serve(self) -> None:
        """Read requests until the front closes the connection or misbehaves (an ``alert``).

        A privileged call runs on this thread before the next request is read: the front gives
        each privileged call a connection of its own, so nothing waits behind it, and no thread
        hand-over (a wake-up and a GIL transfer) lies on the privileged route's critical path.
        Other requests go to their capacity class's threads."""
        try:
            while (req := self._read_frame()) is not None:
                kind = check_request(req)
                cls = REQUESTS[kind][0]
                pool, slot = self.pools[cls]
                if not slot.acquire(blocking=False):
                    if kind == "privileged_call":  # received, so recorded here (the front does not)
                        self.state.audit.record("reject", tool=req["op"], route="privileged", session=req["session"],
                                                peer=req["peer"], decision="reject", reason="the helper is busy",
                                                outcome=HELPER_UNAVAILABLE)
                    self.reply(req["id"], {"ok": False, "error": ToolError(HELPER_UNAVAILABLE, "the helper is busy", reason="busy").to_dict()})
                    continue
                if cls == "call":  # on this thread: no hand-over on the privileged route's critical path
                    self._run(kind, req, slot)
                else:
                    pool.submit(self._run, kind, req, slot)
        except Refused as exc:
            self.state.audit.record("alert", peer=self.peer, reason=str(exc)[:200])
        except (frames.FrameError, RecursionError) as exc:
            self.state.audit.record("alert", peer=self.peer, reason=f"malformed frame: {str(exc)[:200]}")
        except OSError:
            pass
        finally:
            self.sock.close()


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the peer from ``SO_PEERCRED`` (the kernel's word, not the peer's)."""
    pid, uid, gid = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return pid, uid, gid


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
    (the principal still there, bound to the same account, with that token unexpired), or as a
    live login token whose account may still use it (``usable``: root's answer per account, asked
    once per sweep)."""
    users, (name, os_user) = state.users.current, w.owner
    if not w.login:
        p = users.get(name)
        now = datetime.datetime.now(datetime.timezone.utc)
        return p is not None and p.os_user == os_user and any(
            t.id == w.token_id and (not t.expires or now < identity.parse_time(t.expires)) for t in p.tokens)
    rec = state.issued.live(w.token_id)
    principal = None if rec is None or rec.os_user != os_user else identity.login_principal(users, os_user, rec.id)
    if principal is None or principal.name != name:
        return False
    if os_user not in usable:
        try:
            usable[os_user] = state.root.usable(os_user)
        except ToolError:  # root busy: judged again at the next sweep
            usable[os_user] = True
    return usable[os_user]


def end_revoked(state: State) -> None:
    """End the workers whose principal was removed or rebound, whose token was removed, rotated
    or expired, or whose login's account was locked or expired (SPEC §5.3: within seconds). The
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


def serve(state: State, sock: socket.socket, service_uid: int, stop: Callable[[], bool],
          tick: Callable[[], None]) -> None:
    """Accept front connections from ``service_uid`` only (``SO_PEERCRED``) until ``stop()``;
    call ``tick()`` about twice a second (reloads, reaping)."""
    pools = {k: (concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix=k), threading.Semaphore(4 * n))
             for k, n in CLASSES.items()}
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
    checked = 0.0
    while not stop():
        tick()
        reap(state)
        untaken(state)  # (closes the kept control sockets released since)
        state.opened.sweep()
        if time.monotonic() - checked >= REVOKE_SECONDS:
            checked = time.monotonic()
            try:
                end_revoked(state)
            except Exception:  # (no thread to spare, say): never the accept loop's end; again in a second
                log.exception("checking the workers' tokens failed")
        try:
            if not select.select([sock], [], [], 0.5)[0]:
                continue
            conn, _ = sock.accept()
        except (InterruptedError, OSError):
            continue
        pid, uid, _ = peer_credentials(conn)
        if uid != service_uid or not slots.acquire(blocking=False):
            why = "too many helper connections" if uid == service_uid else "connection from a uid other than the service user"
            state.audit.record("alert", peer=f"pid={pid} uid={uid}", reason=why)
            conn.close()
            continue

        def run(c: Connection = Connection(state, conn, f"pid={pid} uid={uid}", pools)) -> None:
            try:
                c.serve()
            finally:
                slots.release()

        try:
            threading.Thread(target=run, daemon=True).start()
        except RuntimeError:  # no thread to start (the unit's TasksMax): refuse this one, serve on
            slots.release()
            conn.close()
            state.audit.record("alert", peer=f"pid={pid} uid={uid}", reason="no thread for a new helper connection")
    for pool, _ in pools.values():
        pool.shutdown(wait=False, cancel_futures=True)
