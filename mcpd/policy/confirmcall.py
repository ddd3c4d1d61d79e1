"""Where a privileged call meets a person: the gate :func:`gate` of ``privileged_call`` and the
handlers of the confirmation page's requests (``confirm_view``, ``confirm_answer``,
``confirm_decide``). The records themselves are :mod:`mcpd.policy.confirm`'s.

A call the grants refuse only for ``reauth_after``, or allow under an ``approve`` block, passes
the gate as follows (docs/REFERENCE.md §4.7):

- the front says the client can open a URL (``interactive``): a new record is opened and the call
  answers ``PERMISSION_DENIED`` with ``details.confirm`` (the record's id and kind), which the
  front turns into the revision's input-required answer pointing to the page; the client's retry
  names the record (``confirm``). A sign-in retry is judged as if its login were the sign-in; an
  approval retry waits, at most the call's deadline, for the decision.
- otherwise a sign-in is refused as before (with where to log in), and an approval is opened and
  waited for within the call's deadline (an approver runs ``linuxctl approve ID``).

A call the front can wait for elsewhere (``defer``) never waits here: while its record waits for
its person the call answers at once ``PERMISSION_DENIED`` with ``details.waiting`` (the record's
id, reason :data:`WAITING`); the front gives back its call connection, waits on the record
(``confirm_view`` until it is no longer pending, within the call's deadline) and retries the
call naming the record with ``waited`` set, which is then judged with no wait at all.

An approval is bound to what the path resolves to when it is asked (a
:class:`~mcpd.policy.confirm.Resolution`, shown to the approver): a retry, a call under a ``for``
approval, or a waiting call whose path resolves to another object by the time it is approved is
asked again (interactive) or refused with :data:`RESOLVES_ELSEWHERE`; the caller checks the
descriptor it then opens against the same resolution.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from mcpd.common import grantmatch
from mcpd.common.identity import Principal
from mcpd.helper.wire.errors import PERMISSION_DENIED, ToolError
from mcpd.policy.confirm import APPROVE, APPROVED, DENIED, PENDING, SIGNED_IN, SIGNIN, Pending, Resolution
from mcpd.policy.grants import os_groups
from mcpd.policy.state import State, principal_of

APPROVAL_DENIED = "the approver denied this call"
APPROVAL_TIMED_OUT = "no approver decided in time"
SIGNIN_DECLINED = "the sign-in was declined"
WAITING = "waiting for a person"
RESOLVES_ELSEWHERE = "the path resolves to another file than the one approved"


def _ask(p: Pending, path: str) -> ToolError:
    """The refusal that carries record ``p`` to the front (which asks the client to open the page)."""
    what = "sign in again" if p.kind == SIGNIN else "an approver must approve this call"
    return ToolError(PERMISSION_DENIED, f"permission denied: {path}: {what}; open the confirmation page",
                     path=path, reason=grantmatch.REAUTH if p.kind == SIGNIN else "approval required",
                     confirm={"id": p.id, "kind": p.kind, "expires_in": p.view()["expires_in"]})


def _elsewhere(path: str) -> ToolError:
    """The refusal of a call whose path resolves to another object than the one approved."""
    return ToolError(PERMISSION_DENIED, f"permission denied: {path}: {RESOLVES_ELSEWHERE}; ask again",
                     path=path, reason=RESOLVES_ELSEWHERE)


def gate(state: State, req: dict[str, Any], principal: Principal, op: str, requested: str,
         decision: grantmatch.Decision, redecide: Callable[[datetime.datetime], grantmatch.Decision],
         wait_seconds: float, resolve: Callable[[], Resolution]) -> tuple[grantmatch.Decision, float, Resolution | None]:
    """The decision a call goes on with once a person has had their say (see the module docstring),
    the time (UNIX seconds) of the step-up sign-in it was judged with (``0.0``: none), by
    which a walker judges each entry's ``reauth_after`` too, and the resolution an approval was
    given for (None: no approval), which the object the call then opens must still be.

    Args:
        req: the ``privileged_call`` request (``interactive``, ``confirm``, ``why``: optional).
        decision: the grants' decision for this call.
        redecide: the decision again for a login at the given (aware) time, not yet used.
        wait_seconds: how long an approval may be waited for in this call.
        resolve: what the requested path resolves to now (asked only for a call under ``approve``).

    Raises:
        ToolError: ``PERMISSION_DENIED`` with ``details.confirm`` (ask the client to open the page),
            with ``details.waiting`` (``defer``: wait on that record, then retry), or with reason :data:`APPROVAL_DENIED` / :data:`APPROVAL_TIMED_OUT` /
            :data:`RESOLVES_ELSEWHERE`.
    """
    box, interactive, cid = state.confirms, bool(req.get("interactive")), req.get("confirm")
    mine = None if not isinstance(cid, str) else box.for_retry(cid, principal.name, principal.token_id, op, requested)
    carried = 0.0  # the sign-in an approval that follows it carries (a rule with both)
    if not decision.allowed and decision.reason == grantmatch.REAUTH:
        login_at = 0.0
        if mine is not None and mine.kind == SIGNIN:
            if mine.state == PENDING:  # the retry waits, up to its deadline, for the sign-in
                _wait(state, req, mine, wait_seconds)
            if mine.state == SIGNED_IN:
                login_at = mine.at
            elif mine.state == PENDING and interactive:
                raise _ask(mine, requested)
        elif mine is not None and mine.kind == APPROVE:
            login_at = mine.login_at
        if login_at:
            again = redecide(datetime.datetime.fromtimestamp(login_at, datetime.UTC))
            if again.allowed and (mine is not None and (mine.kind == APPROVE or box.use(mine))):
                decision = again
                if mine.kind == SIGNIN:  # signed in: an approval the rule asks for comes next
                    mine = None
                carried = login_at
        if not decision.allowed and interactive:
            raise _ask(box.open(SIGNIN, principal.name, principal.os_user, principal.token_id, op, requested), requested)
    if not decision.allowed or decision.approve is None:
        return decision, carried, None
    now = resolve()
    # a record opened under another approve block (a reload changed it since) is judged as a first call
    p = mine if mine is not None and mine.kind == APPROVE and mine.approve == decision.approve else None
    if p is not None and p.resolved != now:  # re-pointed since it was asked: that approval ends, ask again
        box.moved(p, now)
        if not interactive:
            raise _elsewhere(requested)
        p = None
    if p is None and box.approved(principal.name, op, requested, decision.approve, now) is not None:
        return decision, carried, now  # an approval with `for` still covers this principal, tool and object
    if p is None:
        stated = req.get("why")
        why = stated if isinstance(stated, str) else ""
        p = box.open(APPROVE, principal.name, principal.os_user, principal.token_id, op, requested, why,
                     decision.approve, carried, now)
        if interactive:
            raise _ask(p, requested)
    waited = p.state == PENDING
    outcome = _wait(state, req, p, wait_seconds)
    if outcome == APPROVED and waited and (after := resolve()) != p.resolved:  # re-pointed while it waited
        box.moved(p, after)
        if interactive:
            raise _ask(box.open(APPROVE, principal.name, principal.os_user, principal.token_id, op, requested,
                                p.why, decision.approve, carried, after), requested)
        raise _elsewhere(requested)
    if outcome == APPROVED and box.use(p):
        return decision, carried, p.resolved
    if outcome == DENIED:
        raise ToolError(PERMISSION_DENIED, f"permission denied: {requested}: {APPROVAL_DENIED} ({p.by})",
                        path=requested, reason=APPROVAL_DENIED)
    if outcome == PENDING and interactive:
        raise _ask(p, requested)
    raise ToolError(PERMISSION_DENIED, f"permission denied: {requested}: {APPROVAL_TIMED_OUT} "
                    f"(approval {p.id} {'still waits' if outcome == PENDING else 'expired'})",
                    path=requested, reason=APPROVAL_TIMED_OUT, confirm={"id": p.id, "kind": p.kind})


def _wait(state: State, req: dict[str, Any], p: Pending, seconds: float) -> str:
    """Record ``p``'s state after waiting for its person: at most ``seconds`` here, none for a
    retry the front already ``waited`` for; a call the front can wait for (``defer``) that would
    wait is answered at once with where to wait (``details.waiting``, reason :data:`WAITING`)."""
    if req.get("waited"):
        return state.confirms.wait(p, 0.0)
    if req.get("defer") and p.state == PENDING:
        raise ToolError(PERMISSION_DENIED, f"permission denied: {p.path}: {WAITING}", path=p.path, reason=WAITING,
                        waiting=p.id)
    return state.confirms.wait(p, seconds)


# ---------------------------------------------------------------- the page's requests


def handle_view(state: State, req: dict[str, Any]) -> dict[str, Any]:
    """``confirm_view {cid}`` → ``{view}`` (:meth:`mcpd.policy.confirm.Pending.view`) while the
    record lives and waits, else ``ok: false`` (unknown, forged, used or expired alike)."""
    p = state.confirms.get(req["cid"])
    if p is None or p.state != PENDING:
        return {"ok": False}
    return {"ok": True, "view": p.view()}


def _live(state: State, req: dict[str, Any]) -> tuple[Pending | None, str | None]:
    p = state.confirms.get(req["cid"])
    if p is None or p.state != PENDING:
        return None, "this link is unknown, used or expired"
    return p, None


def handle_answer(state: State, req: dict[str, Any]) -> dict[str, Any]:
    """``confirm_answer {cid, csrf, user, password, decision, peer}``: the page's form. The CSRF
    token first (a POST without the page's token changes nothing and runs no PAM), then the
    password (root's PAM through :meth:`mcpd.policy.login.Login.login`, lockout and answer time
    included, no token issued), then the sign-in or the approver's ``decision`` (``approve`` or
    ``deny``). → ``{ok, message}``; ``ok: false`` with the refusal's ``message``."""
    p, why = _live(state, req)
    if p is None:
        return {"ok": False, "message": why}
    if not state.confirms.check_csrf(p, req["csrf"], req["peer"]):
        return {"ok": False, "message": "the form's token is missing or wrong: reload the page"}
    if req["decision"] not in ("signin", "approve", "deny"):
        return {"ok": False, "message": "unknown decision"}
    if state.login.login(req["user"], req["password"], req["peer"], issue=False) is None:
        return {"ok": False, "message": "authentication failed"}
    if p.kind == SIGNIN:
        refused = state.confirms.signed_in(p, req["user"], req["peer"])
        return {"ok": refused is None, "message": refused or "signed in: the waiting call may go on"}
    principal = state.login.principal_of(req["user"])
    if principal is None:
        return {"ok": False, "message": "this account is not bound to any principal"}
    return _decided(state, p, principal, req["user"], req["decision"] == "approve", req["peer"])


def _decided(state: State, p: Pending, approver: str, account: str, approve: bool, peer: str) -> dict[str, Any]:
    refused = state.confirms.decide(p, approver, account, set(os_groups(account)), approve, peer)
    if refused is not None:
        return {"ok": False, "message": refused}
    return {"ok": True, "message": "approved: the waiting call may go on" if approve else "denied"}


def handle_decide(state: State, req: dict[str, Any]) -> dict[str, Any]:
    """``confirm_decide {token, cid, decision, peer}``: an approver decides with their bearer
    token (``linuxctl approve ID``, ``--deny``) instead of the page's password. → ``{ok,
    message, view}``; an invalid token is ``PERMISSION_DENIED`` (:func:`principal_of`)."""
    approver, _ = principal_of(state, req)
    p, why = _live(state, req)
    if p is None:
        return {"ok": False, "message": why}
    if req["decision"] not in ("approve", "deny"):
        return {"ok": False, "message": "decision must be approve or deny"}
    view = {k: v for k, v in p.view().items() if k != "csrf"}
    return dict(_decided(state, p, approver.name, approver.os_user, req["decision"] == "approve", req["peer"]),
                view=view)
