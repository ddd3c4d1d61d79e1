"""Password logins and their tokens, in the policy process (docs/REFERENCE.md §5.2, §5.3).

:class:`Login` answers one ``pam_login`` request in this order:

1. **Refusals before PAM.** Root, unknown and unenrolled accounts (not bound to a principal in
   ``users.yaml``) never reach PAM. They count as failures like a wrong password.
2. **The slot first.** Under one lock, the attempt is counted as a failure (persisted) *before*
   PAM runs. It is refused at once, and counted all the same, when the account is locked out, when
   another attempt for the same account is in flight, or when its address already has
   ``in_flight_per_address`` attempts in flight. A success takes the count back.
3. **PAM** (service ``login.pam_service``: auth and account stacks, so locked and expired accounts
   fail), run by the root helper on the policy's request, waited for in a pool of :data:`PAM_WORKERS` threads. After :data:`PAM_TIMEOUT_SECONDS` the
   attempt fails, its queued PAM call is cancelled and its slot released.
4. **One answer time.** Every answer, token or refusal, whatever the cause, leaves after
   ``login.answer_seconds`` (measured from the start; above PAM's randomised failure delay), plus
   the address's growing delay, so timing tells nothing. The client only learns ``authentication
   failed``; the audit record keeps the reason (and ``pam_code`` when PAM ran).

Lockout (file ``lockout.json`` in the policy process's state folder, so it survives a restart): per
account, ``max_failures`` failures lock it for ``lockout_seconds``; per address, after
``4 * free_failures`` failures each answer is delayed ``base_delay_seconds``, doubling up to
``max_delay_seconds``; an address is never locked, so one NAT cannot shut out everyone behind it.
Entries are forgotten ``lockout_seconds`` after their last failure (or when their lock ends). Only
real OS accounts get an account entry, and at most :data:`MAX_ADDRESSES` addresses are kept
(oldest first out), so the file stays small. The file is read, changed and replaced under an
``flock`` on the state folder, so ``mcpd users unlock`` (:func:`unlock`) never loses a change.

Tokens (:class:`Store`): one 0600 file per token, ``token.<id>``, in the same folder, holding
salt and digest of the secret (never the token), the OS account, login time and expiry (UNIX
seconds) and address. Issuing evicts the account's oldest tokens beyond ``tokens_per_user``.
Revoking deletes the file; nothing the service user can write lives there, so nothing can bring a
token back. ``reauth_after: 0`` is one call per login by compare-and-set: the first call creates
``used.<id>`` with ``O_EXCL``, every later one finds it there (:meth:`Store.claim`). Every file is
opened relative to the folder's descriptor with ``O_NOFOLLOW`` and written as a fresh
``O_EXCL`` file renamed into place.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hmac
import json
import os
import pwd
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from mcpd.common import identity
from mcpd.common.audit.writer import AuditLog
from mcpd.common.config import Login as LoginConfig
from mcpd.common.folders import read_file, write_file
from mcpd.common.inflight import InFlight
from mcpd.helper.wire.errors import ToolError

LOCKOUT_FILE = "lockout.json"
PAM_WORKERS = 8  # the login class's threads (requests.CLASSES): PAM never queues behind another login
PAM_TIMEOUT_SECONDS = 10.0
MAX_ADDRESSES = 1024
_ID = re.compile(r"[0-9a-f]{12}")
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def edit_lockout(dirfd: int) -> Iterator[dict[str, list[float]]]:
    """The lockout table ``{"user:NAME" | "peer:ADDRESS": [failures, last, locked_until]}`` (UNIX
    seconds), read under an ``flock`` on the folder and written back on a clean exit.

    Raises:
        OSError, ValueError: the file is unsafe or malformed (fail closed: no login).
    """
    fcntl.flock(dirfd, fcntl.LOCK_EX)
    try:
        table = json.loads(read_file(dirfd, LOCKOUT_FILE) or b"{}")
        yield table
        write_file(dirfd, LOCKOUT_FILE, json.dumps(table).encode())
    finally:
        fcntl.flock(dirfd, fcntl.LOCK_UN)


def unlock(dirfd: int, user: str) -> bool:
    """Clear ``user``'s lockout and failures (``mcpd users unlock``); ``True`` if it had any."""
    with edit_lockout(dirfd) as table:
        return table.pop("user:" + user, None) is not None


@dataclass(frozen=True)
class Issued:
    """One login token's record (digest only): ``id`` (12 hex), ``salt``/``sha256`` (hex),
    ``os_user``, ``login_time``/``expires`` (UNIX seconds), ``peer`` (client address)."""

    id: str
    salt: str
    sha256: str
    os_user: str
    login_time: float
    expires: float
    peer: str = ""


class Store:
    """Login tokens in the policy process's state folder (see the module docstring); thread-safe.

    Args:
        dirfd: the folder, opened ``O_RDONLY|O_DIRECTORY`` (``main.root_folder``).
        cap: live tokens per OS account (``login.tokens_per_user``).
    """

    def __init__(self, dirfd: int, cap: int = 10) -> None:
        self.dirfd, self.cap = dirfd, cap
        self._lock = threading.Lock()  # os.listdir on one descriptor is not safe from two threads

    def _read(self, token_id: str) -> Issued | None:
        try:
            raw = read_file(self.dirfd, "token." + token_id)
            return None if raw is None else Issued(id=token_id, **json.loads(raw))
        except (OSError, ValueError, TypeError):
            return None  # fail closed: an unsafe or malformed record authenticates nobody

    def records(self) -> list[Issued]:
        """Every live record, oldest login first; expired ones are deleted on the way."""
        with self._lock:
            ids = [n[6:] for n in os.listdir(self.dirfd) if n.startswith("token.")]
        found = [r for r in map(self._read, ids) if r is not None]
        for rec in found:
            if rec.expires <= time.time():
                self.revoke(rec.id)
        return sorted((r for r in found if r.expires > time.time()), key=lambda r: r.login_time)

    def issue(self, os_user: str, ttl_seconds: float, peer: str) -> tuple[str, Issued, int]:
        """A new token for ``os_user``, valid ``ttl_seconds``: ``(plain token, record, how many of
        the account's oldest tokens were evicted to stay within the cap)``.

        Raises:
            OSError: the record could not be written.
        """
        mine = [r for r in self.records() if r.os_user == os_user]
        evicted = mine[:max(0, len(mine) + 1 - self.cap)]
        for old in evicted:
            self.revoke(old.id)
        token, rec = identity.new_token()
        now = time.time()
        issued = Issued(rec.id, rec.salt, rec.sha256, os_user, now, now + ttl_seconds, peer[:100])
        body = {k: v for k, v in asdict(issued).items() if k != "id"}
        write_file(self.dirfd, "token." + issued.id, json.dumps(body).encode())
        return token, issued, len(evicted)

    def verify(self, token: str) -> Issued | None:
        """The live record of a plain ``token`` (constant-time digest compare), or ``None``."""
        m = identity.TOKEN_RE.match(token)
        rec = self._read(m.group(1)) if m else None
        if m is None or rec is None or not hmac.compare_digest(identity._digest(rec.salt, m.group(2)), rec.sha256):
            return None
        return rec if time.time() < rec.expires else None

    def live(self, token_id: str) -> Issued | None:
        """The record of login token ``token_id`` while it is not revoked or expired, else None."""
        rec = self._read(token_id) if _ID.fullmatch(token_id) else None
        return rec if rec is not None and time.time() < rec.expires else None

    def used(self, token_id: str) -> bool:
        """Whether this login already had its one ``reauth_after: 0`` call."""
        with contextlib.suppress(FileNotFoundError):
            return bool(os.stat("used." + token_id, dir_fd=self.dirfd, follow_symlinks=False))
        return False

    def claim(self, token_id: str) -> bool:
        """Compare-and-set before a ``reauth_after: 0`` call: ``True`` for exactly one caller per
        login (it creates ``used.<id>`` with ``O_EXCL``), ``False`` for every other."""
        try:
            os.close(os.open("used." + token_id, _NEW, 0o600, dir_fd=self.dirfd))
        except FileExistsError:
            return False
        return True

    def revoke(self, token_id: str) -> bool:
        """Delete the token ``token_id`` (12 hex digits); ``True`` if it existed."""
        if not _ID.fullmatch(token_id):
            return False
        try:
            os.unlink("token." + token_id, dir_fd=self.dirfd)
        except FileNotFoundError:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink("used." + token_id, dir_fd=self.dirfd)
        return True

    def revoke_user(self, os_user: str) -> int:
        """Delete every token of ``os_user``; return how many."""
        return sum(self.revoke(r.id) for r in self.records() if r.os_user == os_user)


class Login:
    """The policy process's login service (see the module docstring).

    Args:
        cfg: ``login`` of mcpd.yaml (PAM service, lockout numbers, answer time, in-flight limit).
        store: where tokens go; its folder also holds ``lockout.json``.
        audit: one ``login`` record per attempt, ``decision`` ``accept`` or ``reject`` (route
            ``login``; ``user`` the principal the account is bound to, when it is).
        enrolled: the OS accounts bound to a principal in ``users.yaml`` now.
        pam: ``(user, password) -> (ok, PAM code, reason)``: the root helper's PAM check
            (:meth:`mcpd.policy.rootclient.RootClient.pam`); PAM never runs in this process.
        principal_of: the name of the principal a login of this OS account acts as (None: no
            principal is bound to it), for the records; by default none is named.
    """

    def __init__(self, cfg: LoginConfig, store: Store, audit: AuditLog, enrolled: Callable[[], set[str]],
                 pam: Callable[[str, str], tuple[bool, int, str]],
                 principal_of: Callable[[str], str | None] | None = None) -> None:
        self.cfg, self.store, self.audit, self.enrolled = cfg, store, audit, enrolled
        self.principal_of = principal_of or (lambda account: None)
        self._pam = pam
        self._lock = threading.Lock()
        self._accounts = InFlight(1)  # attempts in flight per OS account: one
        self._peers = InFlight(cfg.in_flight_per_address)  # attempts in flight per address
        self._pool = concurrent.futures.ThreadPoolExecutor(PAM_WORKERS, thread_name_prefix="pam")

    def _take_slot(self, user: str, peer: str, known: bool) -> tuple[str | None, float]:
        """Count the attempt and take its slot: ``(refusal reason or None, the address's delay)``."""
        c, now = self.cfg, time.time()
        with self._lock, edit_lockout(self.store.dirfd) as table:
            for key, (_, last, until) in list(table.items()):
                if until <= now and (until or now - last >= c.lockout_seconds):
                    del table[key]
            peers = sorted((v[1], k) for k, v in table.items() if k.startswith("peer:"))
            for _, key in peers[:max(0, len(peers) + 1 - MAX_ADDRESSES)]:
                del table[key]
            u = table.setdefault("user:" + user, [0, now, 0]) if known else [0, now, 0]
            p = table.setdefault("peer:" + peer, [0, now, 0])
            steps = p[0] - 4 * c.free_failures
            delay = min(c.base_delay_seconds * 2 ** min(steps, 30), c.max_delay_seconds) if steps >= 0 else 0.0
            why = ("locked out after repeated failures" if u[2] > now else
                   "another attempt for this account is in flight" if self._accounts.over(user) is not None else
                   "too many attempts in flight from this address"
                   if self._peers.over(peer) is not None else None)
            u[0], p[0], u[1], p[1] = u[0] + 1, p[0] + 1, now, now
            if u[0] >= c.max_failures and u[2] <= now:
                u[2] = now + c.lockout_seconds
            if why is None:
                self._accounts.add(user)
                self._peers.add(peer)
        return why, delay

    def _release(self, user: str, peer: str, ok: bool) -> None:
        with self._lock:
            self._accounts.release(user)
            self._peers.release(peer)
            if ok:
                with edit_lockout(self.store.dirfd) as table:
                    table.pop("user:" + user, None)
                    if "peer:" + peer in table:
                        table["peer:" + peer][0] -= 1

    def _attempt(self, user: str, password: str, peer: str, fields: dict[str, Any],
                 issue: bool = True) -> tuple[str, Issued | None, int] | None:
        future = self._pool.submit(self._pam, user, password)
        try:
            ok, fields["pam_code"], reason = future.result(timeout=PAM_TIMEOUT_SECONDS)
        except concurrent.futures.TimeoutError:
            future.cancel()
            ok, fields["pam_code"], reason = False, -1, "PAM did not answer in time"
        except ToolError as exc:  # root refused to run PAM (an account in group 0 or the daemon's, busy):
            # a failure like any other, with its record and its answer time
            why = exc.details.get("reason") or exc.message
            ok, fields["pam_code"], reason = False, -1, f"refused by the root helper: {why}"
        fields["reason"] = f"pam: {reason}"
        if ok and not issue:
            return "", None, 0
        return self.store.issue(user, self.cfg.token_ttl_seconds, peer) if ok else None

    def login(self, user: str, password: str, peer: str, issue: bool = True) -> tuple[str, Issued | None] | None:
        """Check ``user``'s ``password`` from address ``peer``; blocks the calling thread for at
        least ``answer_seconds``. Returns ``(plain token, record)``, or ``None`` for every kind of
        refusal. Never raises for a refusal; raises ``OSError``/``ValueError`` only when the
        lockout file is unsafe (then nobody logs in). ``issue=False``: the same check (lockout,
        PAM, answer time, record with route ``confirm``) for a sign-in on the confirmation page
        (:mod:`mcpd.policy.confirm`), which issues no token: success is ``("", None)``."""
        start = time.monotonic()
        try:
            uid: int | None = pwd.getpwnam(user).pw_uid
        except (KeyError, ValueError):
            uid = None
        slot, delay = self._take_slot(user, peer, uid is not None)
        fields: dict[str, Any] = {"user": self.principal_of(user) if uid else None, "os_user": user[:64],
                                  "peer": peer, "route": "login" if issue else "confirm"}
        why = slot or ("unknown account" if uid is None else "root may not log in; use grants" if uid == 0 else
                       "account not bound to any principal in users.yaml" if user not in self.enrolled() else None)
        issued = None
        try:
            if why is None:
                issued = self._attempt(user, password, peer, fields, issue)
        except OSError as exc:
            fields["reason"] = f"token store: {exc.strerror}"
        finally:
            if slot is None:
                self._release(user, peer, issued is not None)
        if issued is None:
            self.audit.record("login", tool="login", decision="reject", **dict(fields, reason=why or fields["reason"]))
        elif issued[1] is None:
            self.audit.record("login", tool="login", decision="accept", **fields)
        else:
            self.audit.record("login", tool="login", decision="accept", token_id=issued[1].id, evicted=issued[2],
                              expires=int(issued[1].expires), **fields)
        time.sleep(max(0.0, start + self.cfg.answer_seconds + delay - time.monotonic()))
        return None if issued is None else issued[:2]

    def close(self) -> None:
        """Stop the PAM pool (calls in flight finish, queued ones are dropped)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
