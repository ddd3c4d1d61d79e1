"""Password logins through PAM, in the root helper only (SPEC §5.2; issue 5).

:class:`PamLogin` answers one ``pam_login`` request: lockout check (:mod:`mcpd.helper.lockout`),
the growing delay (slept in the calling connection thread, holding no lock), then PAM service
``mcpd`` (``etc/pam.d/mcpd``: auth and account stacks, so locked and expired accounts fail) in a
bounded thread pool, off the helper's main loop. A success issues a login token
(:mod:`mcpd.helper.issued`).

The client only ever learns ``authentication failed``; the PAM code and reason go to the audit
record. The password is never logged, stored, or kept past the PAM call.
"""

from __future__ import annotations

import concurrent.futures
import pwd
import time
from collections.abc import Callable
from dataclasses import dataclass

import pam

from mcpd.common.audit import AuditLog
from mcpd.helper.issued import IssuedStore, StoreError
from mcpd.helper.lockout import Lockout

GENERIC = "authentication failed"
PAM_WORKERS = 4
PAM_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class LoginOutcome:
    """What the front may learn: ``token`` and ``expires`` (UNIX seconds) on success, else ``None``."""

    token: str | None
    expires: float | None
    os_user: str | None


def pam_check(service: str, user: str, password: str) -> tuple[bool, int, str]:
    """Run PAM authentication and account management for ``user``; ``(ok, code, reason)``.

    A fresh ``PamAuthenticator`` per call, so concurrent calls from several threads are safe.
    """
    auth = pam.PamAuthenticator()
    try:
        ok = auth.authenticate(user, password, service=service, resetcreds=False)
    except ValueError:  # a NUL byte in the user or password
        return False, 4, "malformed credentials"
    reason = auth.reason if isinstance(auth.reason, str) else str(auth.reason)
    return bool(ok), int(auth.code), reason


class PamLogin:
    """Login service of the helper.

    Args:
        service: the PAM service name (``mcpd``; tests install a uniquely named copy).
        store: where issued tokens go.
        lockout: per-user failure tracking (keys ``user:NAME``).
        peers: per-address failure tracking (keys ``peer:ADDRESS``); give it higher thresholds
            than ``lockout``, so one account's guesser locks out that account long before its
            address, and other operators behind the same address go on working.
        audit: one record per attempt: ``login`` (accept) or ``reject`` with ``pam_code``.
        ttl_seconds: lifetime of an issued token.
        enrolled: returns the OS accounts allowed to log in (those bound to a principal in
            ``users.yaml``): an operator is enrolled with ``mcpd users add``.
    """

    def __init__(self, service: str, store: IssuedStore, lockout: Lockout, audit: AuditLog,
                 ttl_seconds: float, enrolled: Callable[[], set[str]], peers: Lockout | None = None) -> None:
        self.service = service
        self.store = store
        self.lockout = lockout
        self.peers = peers if peers is not None else Lockout(lockout.policy)
        self.audit = audit
        self.ttl_seconds = ttl_seconds
        self.enrolled = enrolled
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=PAM_WORKERS, thread_name_prefix="pam")

    def _reject(self, user: str, peer: str, reason: str, code: int | None = None) -> LoginOutcome:
        fields: dict[str, str | int] = {"os_user": user[:64], "peer": peer, "decision": "reject", "reason": reason}
        if code is not None:
            fields["pam_code"] = code
        self.audit.record("reject", tool="login", **fields)
        return LoginOutcome(None, None, None)

    def login(self, user: str, password: str, peer: str) -> LoginOutcome:
        """Check ``user``'s ``password`` and issue a token; blocks the calling thread only.

        Returns:
            :class:`LoginOutcome`; ``token is None`` for every kind of failure (bad password,
            locked or expired account, unknown or unenrolled account, lockout, root).
        """
        ukeys, pkeys = [f"user:{user}"], [f"peer:{peer}"]
        wait = max(self.lockout.locked(ukeys), self.peers.locked(pkeys))
        if wait > 0:
            return self._reject(user, peer, f"locked out for {int(wait) + 1} s after repeated failures")
        delay = max(self.lockout.delay_for(ukeys), self.peers.delay_for(pkeys))
        if delay > 0:
            time.sleep(delay)  # this connection's thread only; no lock held
        try:
            uid = pwd.getpwnam(user).pw_uid
        except KeyError:
            uid = -1
        future = self._pool.submit(pam_check, self.service, user, password)
        try:
            ok, code, reason = future.result(timeout=PAM_TIMEOUT_SECONDS)
        except concurrent.futures.TimeoutError:
            ok, code, reason = False, -1, "PAM did not answer in time"
        if not ok:
            self.lockout.failure(ukeys)
            self.peers.failure(pkeys)
            return self._reject(user, peer, f"pam: {reason}", code)
        if uid == 0:
            return self._reject(user, peer, "root may not log in; use grants", code)
        if user not in self.enrolled():
            return self._reject(user, peer, "account not bound to any principal in users.yaml", code)
        try:
            token, rec = self.store.issue(user, self.ttl_seconds, peer)
        except (StoreError, OSError) as exc:
            return self._reject(user, peer, f"token store: {exc}")
        self.lockout.success(ukeys)
        self.audit.record("login", tool="login", os_user=user, peer=peer, decision="accept",
                          reason="pam: Success", token_id=rec.id, expires=int(rec.expires))
        return LoginOutcome(token, rec.expires, user)

    def close(self) -> None:
        """Stop the PAM pool (waits for calls in flight)."""
        self._pool.shutdown(wait=True)

