"""A person in the loop of a privileged call: step-up sign-ins and approvals, decided here.

Two kinds of confirmation, each one :class:`Pending` record held in this process's memory (never
in root, never on disk: a restart forgets them, and the call is asked again):

- **sign-in** (``kind == "signin"``): a call refused only because its grant's ``reauth_after`` has
  passed. The caller's OS account signs in with its password (root's PAM, through the same
  :class:`mcpd.policy.login.Login` as ``POST /login``, lockout included) on the front's page; the
  retry of that one call is then judged as if its login were that sign-in.
- **approval** (``kind == "approve"``): a call whose grant says ``approve: {by: [...], for: ...}``.
  An approver named in ``by`` (a principal, or a member of a ``%group``) approves or denies it on
  the page (signing in with their password) or with ``linuxctl approve ID`` (their bearer token).
  An approval of ``for`` seconds covers the same principal, tool and path for that long.

Every record is bound to one principal (name and token id), one tool and one requested path: a
retry by anyone else, or of another call, never matches it. An approval is also bound to what the
path resolved to when it was asked (:class:`Resolution`: root's real path and the object's device
and inode), shown to the approver; a retry, or a call under a ``for`` approval, whose path now
resolves to something else is asked again. Its id (:data:`ID_BYTES` random
bytes, URL-safe) is in the page's address, its CSRF token (another random value) in the page's
form only; both are compared in constant time. It lives :data:`TTL_SECONDS`, is used once (the
retry that consumed it, or the page's one successful answer) and at most :data:`MAX_PENDING`
are held (the oldest go first, as expired), at most :data:`MAX_PENDING_PER_PRINCIPAL` of
one principal (that principal's oldest first). Each request, sign-in, approval, denial, use and
expiry is one audit record (event ``confirm``) naming the requester and, once known, who acted.
"""

from __future__ import annotations

import dataclasses
import hmac
import secrets
import threading
import time
from typing import Any

from mcpd.common.audit.writer import AuditLog
from mcpd.common.grantmatch import Approve

TTL_SECONDS = 300.0
MAX_PENDING = 1000
#: records one principal may hold at once: beyond it that principal's own oldest goes first, so
#: one principal's flood never pushes out another's waiting record
MAX_PENDING_PER_PRINCIPAL = 64
ID_BYTES = 24
#: the front's page for one record: ``{base}/confirm/<id>``
PAGE_PREFIX = "/confirm/"
SIGNIN, APPROVE = "signin", "approve"
PENDING, SIGNED_IN, APPROVED, DENIED, USED, EXPIRED = "pending", "signed_in", "approved", "denied", "used", "expired"


@dataclasses.dataclass(frozen=True)
class Resolution:
    """What a requested path resolved to: ``real`` (the real path root saw, following symlinks
    only where the grant covers ``/``) and ``dev``/``ino`` of the object (``0, 0`` when root could
    not open it: the call is then refused at its open anyway). Two resolutions are the same object
    only when all three are equal."""

    real: str
    dev: int = 0
    ino: int = 0


@dataclasses.dataclass
class Pending:
    """One confirmation: who asked (``principal``, ``os_user``, ``token_id``) for what (``op``,
    ``path``, the agent's ``why``), its ``kind``, ``state``, times (UNIX seconds) and, once acted
    on, ``by`` (the principal or account that signed in, approved or denied) and ``at``."""

    id: str
    csrf: str = dataclasses.field(repr=False)
    kind: str
    principal: str
    os_user: str
    token_id: str
    op: str
    path: str
    why: str
    created: float
    expires: float
    approve: Approve | None = None
    login_at: float = 0.0  # an approval after a step-up sign-in: that sign-in's time (UNIX seconds)
    resolved: Resolution | None = None  # an approval: what the path resolved to when it was asked
    claim: str = dataclasses.field(default="", repr=False)  # the login id (reauth_after: 0) the waiting call claimed
    state: str = PENDING
    by: str = ""
    at: float = 0.0

    def view(self) -> dict[str, Any]:
        """What the page shows (and the CSRF token its form carries); never the id's owner's token."""
        return {"kind": self.kind, "principal": self.principal, "os_user": self.os_user, "op": self.op,
                "path": self.path, "resolves_to": None if self.resolved is None else self.resolved.real,
                "why": self.why, "state": self.state, "csrf": self.csrf,
                "expires_in": max(0, int(self.expires - time.time()))}


class Confirmations:
    """The pending confirmations of this process and the approvals in force; thread-safe.

    Args:
        audit: where every step is recorded (event ``confirm``).
        ttl: seconds a record lives (:data:`TTL_SECONDS`).
    """

    def __init__(self, audit: AuditLog, ttl: float = TTL_SECONDS) -> None:
        self.audit, self.ttl = audit, ttl
        self._items: dict[str, Pending] = {}
        # (principal, op, path) -> (until, by, the approve block it was given under, what path resolved to)
        self._approved: dict[tuple[str, str, str], tuple[float, str, Approve, Resolution | None]] = {}
        self._cond = threading.Condition()

    # -- records -------------------------------------------------------------------------------

    def _record(self, p: Pending, decision: str, **more: Any) -> None:
        """One ``confirm`` record of ``p``: ``decision``, the requester, the call, and ``more``."""
        self.audit.record("confirm", decision=decision, kind=p.kind, confirm_id=p.id, user=p.principal,
                          os_user=p.os_user, token_id=p.token_id, tool=p.op, requested_path=p.path,
                          **({"why": p.why} if p.why else {}), **more)

    def _sweep(self, now: float) -> None:
        """Expire what is past its time (the caller holds the lock); one ``expired`` record each."""
        for p in [p for p in self._items.values() if p.expires <= now]:
            del self._items[p.id]
            if p.state in (PENDING, SIGNED_IN, APPROVED):
                self._record(p, EXPIRED)
        for key in [k for k, (until, *_) in self._approved.items() if until <= now]:
            del self._approved[key]

    def sweep(self) -> None:
        """Expire what is past its time now (the policy process's loop calls it about twice a
        second), so each ``expired`` record is written when the record expires, not at the next
        look at the store."""
        with self._cond:
            self._sweep(time.time())

    def open(self, kind: str, principal: str, os_user: str, token_id: str, op: str, path: str, why: str = "",
             approve: Approve | None = None, login_at: float = 0.0, resolved: Resolution | None = None) -> Pending:
        """A new record for one call (``kind`` :data:`SIGNIN` or :data:`APPROVE`), recorded
        ``requested``; beyond :data:`MAX_PENDING_PER_PRINCIPAL` records of ``principal`` its
        oldest is expired first, beyond :data:`MAX_PENDING` in all the oldest. ``login_at``: an
        approval that follows a step-up sign-in of the same call keeps its time, so the call's
        retry is judged with it. ``resolved``: an approval's :class:`Resolution` (recorded as
        ``resolves_to``)."""
        now = time.time()
        p = Pending(secrets.token_urlsafe(ID_BYTES), secrets.token_urlsafe(ID_BYTES), kind, principal, os_user,
                    token_id, op, path, why[:500], now, now + self.ttl, approve, login_at, resolved=resolved)
        with self._cond:
            self._sweep(now)
            while len(own := [x for x in self._items.values() if x.principal == principal]) >= MAX_PENDING_PER_PRINCIPAL:
                min(own, key=lambda x: x.created).expires = now
                self._sweep(now)
            while len(self._items) >= MAX_PENDING:
                oldest = min(self._items.values(), key=lambda x: x.created)
                oldest.expires = now
                self._sweep(now)
            self._items[p.id] = p
            self._record(p, "requested", expires=int(p.expires),
                         **({"resolves_to": resolved.real} if resolved is not None else {}))
        return p

    def get(self, pid: str) -> Pending | None:
        """The live record ``pid`` (constant-time lookup over the ids held), or None."""
        with self._cond:
            self._sweep(time.time())
            return self._find(pid)

    def _find(self, pid: str) -> Pending | None:
        found = None
        for key, p in self._items.items():
            if hmac.compare_digest(key.encode(), pid.encode()):
                found = p
        return found

    def for_retry(self, pid: str, principal: str, token_id: str, op: str, path: str) -> Pending | None:
        """The record a retry names when it is this principal's (same name and token), for this
        tool and path, and not yet used; else None (another principal's, another call's, forged,
        used or expired: the retry is then judged as a first call)."""
        p = self.get(pid)
        if p is None or (p.principal, p.token_id, p.op, p.path) != (principal, token_id, op, path):
            return None
        return p if p.state != USED else None

    def moved(self, p: Pending, now: Resolution) -> None:
        """Approval record ``p``'s path resolves to ``now``, not to what was approved: ``p`` ends
        (never admits a call) with a ``refused`` record (reason ``the path resolves elsewhere now``)."""
        with self._cond:
            if self._items.get(p.id) is p:
                del self._items[p.id]
                p.state = EXPIRED
                self._record(p, "refused", by=p.by, reason="the path resolves elsewhere now",
                             resolves_to=now.real, approved_resolution=p.resolved.real if p.resolved else None)
                self._cond.notify_all()

    def hold_claim(self, pid: str, login_id: str) -> None:
        """The call waiting on record ``pid`` claimed the one call of login ``login_id``
        (``reauth_after: 0``): its retry (:meth:`holds_claim`) goes on with that claim."""
        with self._cond:
            if (p := self._find(pid)) is not None:
                p.claim = login_id

    def holds_claim(self, pid: object, login_id: str) -> bool:
        """Whether live record ``pid`` holds the claim of login ``login_id`` (:meth:`hold_claim`)."""
        p = self.get(pid) if isinstance(pid, str) else None
        return p is not None and bool(p.claim) and hmac.compare_digest(p.claim.encode(), login_id.encode())

    def use(self, p: Pending) -> bool:
        """Consume ``p`` once (compare-and-set): True for the one retry it admits, recorded ``used``."""
        with self._cond:
            if self._items.get(p.id) is not p or p.state not in (SIGNED_IN, APPROVED):
                return False
            p.state = USED
            del self._items[p.id]
            self._record(p, USED, by=p.by)
            return True

    def wait(self, p: Pending, seconds: float) -> str:
        """Wait at most ``seconds`` for ``p`` to be decided; its state then (:data:`EXPIRED` once gone)."""
        end = time.monotonic() + seconds
        with self._cond:
            while p.state == PENDING and self._items.get(p.id) is p:
                left = min(end - time.monotonic(), p.expires - time.time())
                if left <= 0:
                    break
                self._cond.wait(left)
            self._sweep(time.time())
            return p.state if self._items.get(p.id) is p or p.state == USED else EXPIRED

    # -- approvals in force --------------------------------------------------------------------

    def approved(self, principal: str, op: str, path: str, rule: Approve,
                 resolved: Resolution | None = None) -> str | None:
        """Who approved this principal's ``op`` on ``path`` for a while still running under the
        same ``approve`` block ``rule`` as the grant in force, the path still resolving to
        ``resolved`` as it did then, or None (a reload that changed the block, its approvers or
        its ``for``, ends the approvals given under the old one; a path re-pointed since is asked
        again)."""
        with self._cond:
            self._sweep(time.time())
            found = self._approved.get((principal, op, path))
            return None if found is None or found[2] != rule or found[3] != resolved else found[1]

    # -- the page's and the approvers' answers --------------------------------------------------

    def check_csrf(self, p: Pending, csrf: str, peer: str) -> bool:
        """Whether ``csrf`` is ``p``'s form token (constant time); a wrong or missing one is a
        ``refused`` record (reason ``csrf token missing or wrong``)."""
        if hmac.compare_digest(p.csrf.encode(), csrf.encode()):
            return True
        self._record(p, "refused", peer=peer, reason="csrf token missing or wrong")
        return False

    def signed_in(self, p: Pending, os_user: str, peer: str) -> str | None:
        """``os_user`` signed in with its password for sign-in record ``p``: the refusal, or None
        when ``p`` is now :data:`SIGNED_IN` (only ``p``'s own account may sign in for it)."""
        with self._cond:
            if self._items.get(p.id) is not p or p.kind != SIGNIN or p.state != PENDING:
                return "this confirmation is not waiting for a sign-in"
            if os_user != p.os_user:
                self._record(p, "refused", by=os_user, peer=peer, reason="signed in as another account")
                return f"only {p.os_user} can sign in for this call"
            p.state, p.by, p.at = SIGNED_IN, os_user, time.time()
            self._record(p, SIGNED_IN, by=os_user, peer=peer)
            self._cond.notify_all()
        return None

    def decide(self, p: Pending, approver: str, approver_account: str, groups: set[str], approve: bool,
               peer: str) -> str | None:
        """``approver`` (a principal; ``approver_account`` its OS account, ``groups`` its OS
        groups) approves or denies approval record ``p``: the refusal, or None when decided. Only
        an approver ``p``'s grant names may decide, and not on their own request unless it says
        ``self: true``. An approval with ``for`` covers the same principal, tool and path."""
        with self._cond:
            if self._items.get(p.id) is not p or p.kind != APPROVE or p.state != PENDING or p.approve is None:
                return "this confirmation is not waiting for an approval"
            rule = p.approve
            named = approver in rule.by or any(b.startswith("%") and b[1:] in groups for b in rule.by)
            if not named:
                self._record(p, "refused", by=approver, peer=peer, reason="not an approver of this grant")
                return "you are not an approver of this grant"
            if (approver == p.principal or approver_account == p.os_user) and not rule.self_ok:
                self._record(p, "refused", by=approver, peer=peer, reason="own request")
                return "you may not approve your own request"
            p.state, p.by, p.at = (APPROVED if approve else DENIED), approver, time.time()
            if approve and rule.seconds > 0:
                self._approved[(p.principal, p.op, p.path)] = (p.at + rule.seconds, approver, rule, p.resolved)
            self._record(p, p.state, by=approver, peer=peer,
                         **({"covers_seconds": int(rule.seconds)} if approve else {}))
            self._cond.notify_all()
        return None
