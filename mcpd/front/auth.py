"""Bearer-token authentication for the front (SPEC §1.3, §5.1).

The front authenticates every HTTP request with :class:`FileAuthenticator`, which keeps the
parsed ``users.yaml`` in memory and re-reads it whenever its inode, size or mtime changes, so
``mcpd users add/revoke`` take effect on the next request without a restart. A users file that
cannot be read or parsed fails closed: no token is accepted until it is fixed.
"""

from __future__ import annotations

import logging
import re
from typing import Protocol

from mcpd.common import identity
from mcpd.common.filesig import Signature, signature
from mcpd.common.identity import Principal, UserRecord

log = logging.getLogger(__name__)

_BEARER_RE = re.compile(r"^bearer[ ]+([^ ]+)[ ]*$", re.IGNORECASE)


def parse_bearer(header: str | None) -> str | None:
    """Extract the token from an ``Authorization`` header value (SPEC §1.3).

    The scheme is matched case-insensitively (``Bearer``, ``bearer``, ``BEARER``); anything else
    (no header, another scheme, an empty or multi-part credential) gives ``None``.
    """
    if not header:
        return None
    m = _BEARER_RE.match(header)
    return m.group(1) if m else None


class Authenticator(Protocol):
    """Turns a plain bearer token into a :class:`Principal`, or ``None`` (answer 401)."""

    async def authenticate(self, token: str) -> Principal | None:
        """Return the token's principal, or ``None`` for an unknown, wrong or expired token."""
        ...


class FileAuthenticator:
    """Authenticate against ``users.yaml`` (SPEC §5.1), reloading it when it changes.

    Args:
        users_file: path of ``users.yaml``. A missing file means no users (everything is 401).

    The file is stat'ed on every call (a cheap syscall); when ``(device, inode, size,
    mtime_ns)`` differs from the loaded version it is parsed again. A parse error is logged
    (without contents) and leaves the authenticator with no users: fail closed.
    """

    def __init__(self, users_file: str) -> None:
        self._path = users_file
        self._key: Signature | None = None
        self._users: dict[str, UserRecord] = {}

    def _stat_key(self) -> Signature | None:
        return signature(self._path)

    def _refresh(self) -> None:
        try:
            key = self._stat_key()
        except OSError as exc:
            log.error("users file %s cannot be checked: %s; refusing all tokens", self._path, exc.strerror)
            self._key, self._users = None, {}
            return
        if key is not None and key == self._key:
            return
        if key is None:
            self._key, self._users = None, {}
            return
        try:
            self._users = identity.load_users(self._path)
        except identity.UsersFileError as exc:
            log.error("users file rejected, refusing all tokens until fixed: %s", exc)
            self._users = {}
        self._key = key

    async def authenticate(self, token: str) -> Principal | None:
        """Verify ``token`` (constant-time digest compare in :func:`identity.verify`)."""
        self._refresh()
        return identity.verify(self._users, token)
