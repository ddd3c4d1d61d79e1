"""The privileged call (``privileged_call``): the grant decided here, the work done elsewhere.

The grant is decided for the token's principal from the grants in force. What needs root it
asks of the root helper (:mod:`mcpd.policy.rootclient`): for ``files/read``/``files/filetype``
root opens the granted file once (its checked opener); for ``files/read`` this process passes
the descriptor to the caller's own worker (uid of the account, CapEff 0, no_new_privs), which
runs the reading core and answers the front directly. For ``files/filetype`` the descriptor
stays here: the worker gets its ``fstat`` facts as data and, for a regular file, a sealed memfd
holding the first ``SAMPLE_BYTES`` (:func:`mcpd.policy.opened.described`). ``files/list`` and
``files/find`` run as a metadata walk in a walker (:mod:`mcpd.walker`): a killable child of
root's fork server holding CAP_DAC_READ_SEARCH only, which parses the call's arguments itself
and filters every entry by the grant. ``files/grep`` combines both (:mod:`mcpd.policy.grepcall`):
a walker plans, root opens each file judged granted here, the worker searches. One audit record
per call received.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import time
from typing import Any

from mcpd.common import frames, grantmatch, identity
from mcpd.common.audit.records import REFUSED_AT_OPEN, Prepared, find_fields
from mcpd.common.config import CAP_KEY
from mcpd.common.deadline import deadline_seconds
from mcpd.common.oauthconfig import SCOPE_PRIVILEGED
from mcpd.common.readerrors import reader_error
from mcpd.common.redaction import REDACT_KEY, counts_text, union, with_redaction
from mcpd.common.tracecontext import trace_fields
from mcpd.common.validate import check_path
from mcpd.helper.wire.errors import (
    HELPER_UNAVAILABLE,
    INTERNAL_ERROR,
    NOT_A_REGULAR_FILE,
    PERMISSION_DENIED,
    TIMEOUT,
    ToolError,
)
from mcpd.policy import confirmcall, grepcall
from mcpd.policy.confirm import Resolution
from mcpd.policy.grants import os_groups
from mcpd.policy.handover import await_report, check_worker, claim_worker, end_late, pass_call, walker_frame
from mcpd.policy.opened import described
from mcpd.policy.state import CONTENT_OPS, GREP_OP, WALK_OPS, Refused, State, principal_of
from mcpd.policy.workers import NOT_YOURS, UNTAKEN

log = logging.getLogger("mcpd.policy")


def handle_call(state: State, req: dict[str, Any]) -> dict[str, Any]:
    """``privileged_call {token, session, peer, op, args, cap?, worker?, rid?, traceparent?,
    tracestate?}`` (docs/REFERENCE.md §4.1-4.5a; the trace context checked again, and dropped when
    invalid, before it joins the record).

    Decides the grant for the token's principal, then: content ops open the file once and hand the
    descriptor to the principal's worker ``worker`` (its reply, id ``rid``, goes to the front);
    walk ops run in a killable child and return their raw result. One audit record per call
    received, whatever happens to it (the front records none of these: it records only the calls
    whose request never reached this process).
    """
    started = time.monotonic()
    principal, login = principal_of(state, req)
    op, who = req["op"], {"session": req["session"], "peer": req["peer"], "user": principal.name,
                          "os_user": principal.os_user, "token_id": principal.token_id, "tool": req["op"],
                          "route": "privileged", **find_fields(req["op"], req["args"]), **dict(principal.claims),
                          **trace_fields(req)}
    if principal.scopes is not None and SCOPE_PRIVILEGED not in principal.scopes:  # (the front answers 403 first)
        state.audit.record("reject", decision="reject", reason="insufficient scope", outcome=PERMISSION_DENIED, **who)
        raise ToolError(PERMISSION_DENIED, f"permission denied: the token lacks the scope {SCOPE_PRIVILEGED}",
                        reason="insufficient scope", scope=SCOPE_PRIVILEGED)
    key = WALK_OPS.get(op, "path")
    args = dict(req["args"])  # only the path here: the worker or walker parses the rest (tool's own parse_args)
    try:
        if op not in WALK_OPS and op not in CONTENT_OPS and op != GREP_OP:
            raise ToolError(PERMISSION_DENIED, "permission denied", reason="unknown tool")
        requested = check_path(args, key)
    except ToolError as exc:
        state.audit.record("reject", decision="reject", reason=exc.message, outcome=exc.code, **who)
        raise
    groups = os_groups(principal.os_user) | set(principal.groups)  # an OAuth token's groups: <issuer>:<group>
    policy = state.policy.policy
    login_time = None if login is None else datetime.datetime.fromtimestamp(login.login_time, datetime.UTC)
    # a retry of a call that waited at the front for its approval holds the login its first try claimed
    held = login is not None and req.get("waited") and state.confirms.holds_claim(req.get("confirm"), login.id)
    used = login is not None and not held and state.issued.used(login.id)  # before this call's claim: the walker decides alike
    decision = grantmatch.decide(policy, principal.os_user, groups, op, requested, grantmatch.utcnow(),
                             login_time=login_time, login_used=used)
    claims = decision.allowed and decision.reauth_after == 0 and login is not None
    if claims and login is not None and not held and not state.issued.claim(login.id):
        decision = dataclasses.replace(decision, allowed=False, reason=grantmatch.REAUTH)  # one login, one call
    try:  # a step-up sign-in or an approval by a person (mcpd.policy.confirmcall)
        decision, stepped, bound = confirmcall.gate(state, req, principal, op, requested, decision, lambda at: grantmatch.decide(
            policy, principal.os_user, groups, op, requested, grantmatch.utcnow(), login_time=at, login_used=False),
            deadline_seconds(args, state.cfg.workers.timeout_seconds, op),
            lambda: _resolution(state, decision.resolved_path or requested, decision.covers_root, principal.name))
    except ToolError as exc:
        if exc.details.get("reason") == confirmcall.WAITING:  # the front waits and retries: one record, the retry's
            if claims and login is not None:
                state.confirms.hold_claim(exc.details["waiting"], login.id)
            raise
        state.audit.record("reject", decision="reject", reason=exc.details.get("reason"), outcome=exc.code, bytes=0,
                           duration_ms=_ms(started), requested_path=requested, resolved_path=decision.resolved_path,
                           grant=decision.rule, **who)
        raise
    # the login a walker judges every entry's reauth_after with: a step-up sign-in's, else the token's
    fresh = (stepped, False) if stepped else None if login is None else (login.login_time, used)
    # the rule that decided; for a refusal because a rule expired, that rule and when (decide's note)
    record = dict(who, requested_path=requested, resolved_path=decision.resolved_path,
                  grant=decision.rule or (decision.note if not decision.allowed and decision.note else None))
    if not decision.allowed or decision.resolved_path is None:
        state.audit.record("reject", decision="reject", reason=decision.reason, outcome=PERMISSION_DENIED, bytes=0,
                           duration_ms=_ms(started), **record)
        hint = "; run: linuxctl login, then use the new token" if decision.reason == grantmatch.REAUTH else ""
        raise ToolError(PERMISSION_DENIED, f"permission denied: {requested}: {decision.reason}{hint}",
                        path=requested, reason=decision.reason)
    args[key] = decision.resolved_path
    # the redaction of this call: the principal's and the grant's, whatever the front sent (docs/REFERENCE.md §3)
    args = with_redaction(op, args, union(principal.redact, decision.redact))
    try:
        if op == GREP_OP:
            reply, outcome, size, prepared = grepcall.run(state, policy, args, principal, sorted(groups),
                                                          decision.covers_root, fresh, req, record)
            state.audit.finish(prepared, outcome=outcome, bytes=size, duration_ms=_ms(started))
            return reply
        if op not in WALK_OPS:
            reply, outcome, size, prepared, redacted = _content(state, op, args, principal, decision.covers_root, req,
                                                                record, bound)
            if outcome in (PERMISSION_DENIED, NOT_A_REGULAR_FILE):  # the worker's own check refused it
                state.audit.record("reject", decision=REFUSED_AT_OPEN, reason=f"refused by the worker ({outcome})",
                                   outcome=outcome, bytes=0, duration_ms=_ms(started), **record)
            else:
                state.audit.finish(prepared, outcome=outcome, bytes=size, duration_ms=_ms(started),
                                   **({"redacted": redacted} if redacted is not None else {}))
            return reply
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


def _resolution(state: State, path: str, follow: bool, who: str) -> Resolution:
    """What ``path`` resolves to now, as root's opener sees it (``follow``: the grant covers ``/``)
    for principal ``who``: root's real path and the object's device and inode, or the path alone
    (``0, 0``) when root refuses or cannot open it. One root ``open`` (want ``any``: a folder or
    special file is only an ``O_PATH`` descriptor), closed at once."""
    try:
        fd, real = state.root.open(path, follow, "any", who)
    except ToolError:
        return Resolution(path)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return Resolution(real, st.st_dev, st.st_ino)


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


def _content(state: State, op: str, args: dict[str, Any], principal: identity.Principal, follow: bool,
             req: dict[str, Any], record: dict[str, Any],
             bound: Resolution | None = None) -> tuple[dict[str, Any], str | None, int, Prepared, str | None]:
    """Hand the opened file to the principal's worker (``files/read``: root's descriptor;
    ``files/filetype``: only :func:`~mcpd.policy.opened.described`'s facts and sample memfd) and
    wait for its report; the accept record (``record``'s fields, and ``real_path``, the real path
    of what root opened when it is not the one judged) is encoded while the worker reads, and
    written by the caller. The last item: the worker's count of secrets redacted
    (:func:`mcpd.common.redaction.counts_text`), or None when the call was not redacted. ``bound``:
    the resolution a person approved (:func:`mcpd.policy.confirmcall.gate`); what root opened must
    be that object, else ``PERMISSION_DENIED`` (:data:`~mcpd.policy.confirmcall.RESOLVES_ELSEWHERE`)."""
    w = claim_worker(state, principal, req)
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
        if bound is not None and Resolution(real, (st := os.fstat(fd)).st_dev, st.st_ino) != bound:
            raise ToolError(PERMISSION_DENIED, f"permission denied: {args['path']}: {confirmcall.RESOLVES_ELSEWHERE}"
                            "; ask again", path=args["path"], reason=confirmcall.RESOLVES_ELSEWHERE)
        if grantmatch.is_secret(state.policy.policy, real):
            raise ToolError(PERMISSION_DENIED, f"permission denied: {args['path']}", path=args["path"],
                            reason=grantmatch.SECRET)
        if not w.busy.acquire(blocking=False):
            raise ToolError(HELPER_UNAVAILABLE, "that worker is busy", reason="busy")
        try:
            check_worker(state, w)
            if req.get("cap") is not None:
                args[CAP_KEY] = req["cap"]  # the principal's max_file_bytes: it can only narrow the cap
            frame: dict[str, Any] = {"id": req["rid"], "op": op, "args": args}
            if op == "files/filetype":  # root's descriptor stays here: facts as data, a sample memfd
                try:
                    frame["facts"], sample = described(fd)
                except OSError as err:
                    raise reader_error(err, args["path"]) from None
                os.close(fd)
                fd = -1 if sample is None else sample
            pass_call(state, w, frame, [fd] if fd >= 0 else [])
            if fd >= 0:
                os.close(fd)
            fd = -1
            prepared = state.audit.prepare("accept", decision="accept", reason="granted", **record)
            report = await_report(w, req["rid"], deadline_seconds(args, state.cfg.workers.timeout_seconds, op))
            if report is None:
                report = end_late(state, w, req["rid"])
        finally:
            w.busy.release()
    finally:
        if fd >= 0:
            os.close(fd)
    if report is None:
        raise ToolError(TIMEOUT, "the call did not finish in time")
    redacted = counts_text(report.get("redacted")) if REDACT_KEY in args else None
    return {"ok": True, "dispatched": True}, report.get("code"), int(report.get("bytes") or 0), prepared, redacted


def _walk(state: State, policy: grantmatch.Policy, op: str, args: dict[str, Any], os_user: str, groups: list[str],
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
    frame = walker_frame(policy, op, args, os_user, groups, follow, login)
    end = time.monotonic() + deadline_seconds(args, state.cfg.workers.timeout_seconds, op)
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
        raise frames.reply_error(reply.get("error"))
    return {"ok": True, "result": reply["result"]}

