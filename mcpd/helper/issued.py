"""Tokens issued by password logins (SPEC §5.2; issue 5), kept by the root helper.

A login token has the same shape as a ``users.yaml`` token (``mcpd_<id>_<secret>``,
:mod:`mcpd.common.identity`) and is stored the same way: salt and ``sha256(salt || secret)``, never the
token. Each record is bound to one OS account and carries its login time and expiry (UNIX
seconds), so a grant's ``reauth_after`` can ask how fresh the password login is.

The store is one JSON file, ``<helper_state_dir>/issued-tokens.json``, mode 0600, owned by root,
replaced atomically (write + fsync + rename) on every change, so tokens survive a helper
restart. Expired records are dropped on the next write. ``mcpd users sessions`` reads and edits
the same file under the same ``flock`` (on ``<file>.lock``); the helper re-reads the file when its
``(inode, size, mtime)`` changes, so a revocation by the CLI takes effect on the next request.

Principal mapping (documented choice): the principal of a login token is named after the OS
account (``name == os_user``); sessions it opens belong to that name.
"""

from __future__ import annotations

import contextlib
import fcntl
import hmac
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from mcpd.common import identity
from mcpd.common.filesig import Signature, signature

FILE_NAME = "issued-tokens.json"
MAX_RECORDS = 10000


class StoreError(Exception):
    """The store file is unsafe (not root-owned 0600) or malformed."""


@dataclass(frozen=True)
class Issued:
    """One issued token record (digest only).

    Attributes:
        id: 12 hex digits, the token id.
        salt, sha256: hex salt and digest of the secret.
        os_user: the OS account that logged in.
        login_time, expires: UNIX seconds.
        peer: the client address of the login.
    """

    id: str
    salt: str
    sha256: str
    os_user: str
    login_time: float
    expires: float
    peer: str = ""
    reauth_used: bool = False


HELPER_SUBDIR = "helper"


def store_path(helper_state_dir: str) -> str:
    """The store file inside the helper's own root-owned 0700 state folder (``helper_state_dir``)."""
    return os.path.join(helper_state_dir, FILE_NAME)


@contextlib.contextmanager
def file_lock(path: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``path + '.lock'`` (created 0600) for read-modify-write cycles."""
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_records(path: str, owner_uid: int = 0) -> dict[str, Issued]:
    """Load the store; a missing file is empty.

    Raises:
        StoreError: not a regular file owned by ``owner_uid`` with mode 0600, or not valid JSON
            of the expected shape.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise StoreError(f"{path}: cannot open: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != owner_uid or st.st_mode & 0o077:
            raise StoreError(f"{path}: must be owned by uid {owner_uid} with mode 0600")
        raw = f.read(64 * 1024 * 1024)
    try:
        data = json.loads(raw)
        return {r["id"]: Issued(**r) for r in data["tokens"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{path}: malformed: {type(exc).__name__}") from None


def write_records(path: str, records: dict[str, Issued], now: float | None = None) -> None:
    """Atomically replace the store with ``records`` minus the expired ones (mode 0600)."""
    now = time.time() if now is None else now
    live = [asdict(r) for r in records.values() if r.expires > now]
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".issued.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)
            json.dump({"tokens": live}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class IssuedStore:
    """The helper's view of the store: issue, verify, revoke (thread-safe).

    Args:
        path: the store file (see :func:`store_path`).
        owner_uid: the owner the file must have (root in production; the test's uid otherwise).
    """

    def __init__(self, path: str, owner_uid: int = 0) -> None:
        self.path = path
        self.owner_uid = owner_uid
        self._mutex = threading.Lock()
        self._key: Signature | None = None
        self._records: dict[str, Issued] = {}
        self._load()

    def _load(self) -> None:
        key = signature(self.path)
        if key == self._key and key is not None:
            return
        self._records = read_records(self.path, self.owner_uid) if key is not None else {}
        self._key = key

    def _change(self, fn: Any) -> Any:
        with self._mutex, file_lock(self.path):
            self._key = None
            self._load()
            result = fn(self._records)
            write_records(self.path, self._records)
            self._key = None
            self._load()
            return result

    def issue(self, os_user: str, ttl_seconds: float, peer: str, now: float | None = None) -> tuple[str, Issued]:
        """Create a token for ``os_user`` valid ``ttl_seconds``; return ``(plain token, record)``.

        Raises:
            StoreError: the store is full of live tokens (``MAX_RECORDS``) or unsafe.
        """
        now = time.time() if now is None else now
        token, rec = identity.new_token()
        issued = Issued(rec.id, rec.salt, rec.sha256, os_user, now, now + ttl_seconds, peer[:100])

        def add(records: dict[str, Issued]) -> None:
            for key in [k for k, r in records.items() if r.expires <= now]:
                del records[key]
            if len(records) >= MAX_RECORDS:
                raise StoreError("too many live login tokens")
            records[issued.id] = issued

        self._change(add)
        return token, issued

    def verify(self, token: str, now: float | None = None) -> Issued | None:
        """The live record of a plain ``token`` (constant-time digest compare), or ``None``."""
        m = identity.TOKEN_RE.match(token)
        if not m:
            return None
        with self._mutex:
            try:
                self._load()
            except StoreError:
                return None  # fail closed: an unsafe store authenticates nobody
            rec = self._records.get(m.group(1))
        if rec is None:
            return None
        digest = identity._digest(rec.salt, m.group(2))
        if not hmac.compare_digest(digest, rec.sha256):
            return None
        return rec if (time.time() if now is None else now) < rec.expires else None

    def mark_reauth_used(self, token_id: str) -> None:
        """Record that this login already satisfied one ``reauth_after: 0`` call."""

        def mark(records: dict[str, Issued]) -> None:
            rec = records.get(token_id)
            if rec is not None:
                records[token_id] = Issued(**dict(asdict(rec), reauth_used=True))

        self._change(mark)

    def revoke(self, token_id: str) -> bool:
        """Delete the record ``token_id``; ``True`` if it existed."""
        return bool(self._change(lambda records: records.pop(token_id, None) is not None))

    def revoke_user(self, os_user: str) -> int:
        """Delete every token of ``os_user``; return how many."""

        def drop(records: dict[str, Issued]) -> int:
            ids = [k for k, r in records.items() if r.os_user == os_user]
            for k in ids:
                del records[k]
            return len(ids)

        return int(self._change(drop))

    def records(self) -> list[Issued]:
        """Every live record, oldest login first."""
        with self._mutex:
            self._load()
            now = time.time()
            return sorted((r for r in self._records.values() if r.expires > now), key=lambda r: r.login_time)
