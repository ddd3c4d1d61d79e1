"""The policy process's handlers of everything but the privileged call.

``authenticate`` and ``revoke`` (tokens), ``spawn_worker`` and ``kill_worker`` (a principal's
workers, started and killed by root), ``pam_login`` (a password login, checked by root's PAM).
The privileged call is :mod:`mcpd.policy.calls`; the table that routes requests here is
:mod:`mcpd.policy.requests`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import time
from typing import Any

from mcpd.common.redaction import REDACT_KEY
from mcpd.helper.wire.errors import HELPER_UNAVAILABLE, INTERNAL_ERROR, PERMISSION_DENIED, RATE_LIMITED, ToolError
from mcpd.helper.wire.rootconf import WORKER_START_GID, plain_ids
from mcpd.policy.state import State, Worker, principal_of
from mcpd.policy.workers import bound_worker, kill_worker

#: workers one principal may have alive at once, in workers.per_account: the front's pool keeps at
#: most per_account per principal, plus the few it is replacing; a front asking for more is refused
#: (their processes share the helper unit's TasksMax, their descriptors the policy process's, with
#: every principal). Counted per principal, not per account: several principals bound to one
#: account each get their own pool in the front.
SPAWN_FACTOR = 4


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
    The worker is checked before its first privileged call (:func:`~mcpd.policy.workers.check_started`), not here: no
    thread waits here for a worker's start. Past the principal's :attr:`State.spawns`
    bucket: ``RATE_LIMITED`` (nothing started, nothing audited; a start root then failed gives its
    token back); past :data:`SPAWN_FACTOR` x
    ``per_account`` workers of the principal alive: ``HELPER_UNAVAILABLE``."""
    principal, login = principal_of(state, req)
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
        start: dict[str, Any] = dataclasses.asdict(state.cfg.read)
        if principal.redact:  # the principal's redaction, a floor no call can lower (docs/REFERENCE.md §3)
            start[REDACT_KEY] = list(principal.redact)
        pid, front, ctl, pidfd = state.root.spawn(pw.pw_name, json.dumps(start))
    except ToolError:  # root refused, was busy or did not answer: no worker of the principal's
        with state.lock:
            state.spawns.give_back(principal.name, time.monotonic())
        raise
    w = Worker(pid, pidfd, (principal.name, principal.os_user), ctl, principal.token_id, login is not None,
               oauth_expires=principal.expires if principal.scopes is not None else 0.0)
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


def handle_kill(state: State, req: dict[str, Any]) -> dict[str, Any]:
    """``kill_worker {token, pid}``: SIGKILL a worker bound to the token's principal (through its
    pidfd, so a reused pid is never hit); one of its workers that has ended on its own meanwhile
    is answered ``ok`` (nothing to kill); any other pid is refused and audited as an alert."""
    principal, _ = principal_of(state, req)
    with state.lock:
        gone = req["pid"] not in state.workers and state.exited.get(req["pid"]) == (principal.name, principal.os_user)
    if gone:  # it ended before the front noticed (its exit is recorded): nothing to kill
        return {"ok": True}
    kill_worker(state, bound_worker(state, principal, req["pid"]), "asked by the front", principal.token_id)
    return {"ok": True}



def handle_login(state: State, req: dict[str, Any]) -> dict[str, Any]:
    """``pam_login {user, password, peer}`` (docs/REFERENCE.md §5.2, §5.3) → ``{token, expires, os_user}`` once,
    or ``ok: false`` whatever went wrong (the reason is in the audit record only); every answer
    leaves after the same time (:mod:`mcpd.policy.login`)."""
    found = state.login.login(req["user"], req["password"], req["peer"])
    if found is None or found[1] is None:
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
