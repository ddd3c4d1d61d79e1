"""Bearer-token authentication for the front (docs/REFERENCE.md §1.3, §5.1): the token parser,
the authenticators, and the authenticated caller a request carries (:class:`McpUser`).

The front authenticates every HTTP request with :class:`FileAuthenticator`, which keeps the
parsed ``users.yaml`` in memory and re-reads it whenever its inode, size or mtime changes, so
``mcpd users add/revoke`` take effect on the next request without a restart. A users file that
cannot be read or parsed fails closed: no token is accepted until it is fixed.
"""

from __future__ import annotations

import logging
import re
from typing import Protocol

from starlette.authentication import BaseUser

from mcpd.common import identity
from mcpd.common.identity import Principal, UserRecord
from mcpd.common.reload import Reloading

log = logging.getLogger(__name__)

_BEARER_RE = re.compile(r"^bearer[ ]+([^ ]+)[ ]*$", re.IGNORECASE)


def parse_bearer(header: str | None) -> str | None:
    """Extract the token from an ``Authorization`` header value (docs/REFERENCE.md §1.3).

    The scheme is matched case-insensitively (``Bearer``, ``bearer``, ``BEARER``); anything else
    (no header, another scheme, an empty or multi-part credential) gives ``None``.
    """
    if not header:
        return None
    m = _BEARER_RE.match(header)
    return m.group(1) if m else None


class TokenUndecided(Exception):
    """The token could be neither accepted nor refused now (the policy process is busy): the request
    is answered ``503`` (retry), and an open session's re-check waits for the next round."""


class CheckerDown(TokenUndecided):
    """The token could not be checked because the process that checks tokens (the policy
    process) is not reachable, and it was not verified within the short window the front may
    serve it from its cache: the request is answered ``503`` with ``Retry-After``, never ``401``
    (the token is not known to be bad: the client should retry, not ask for a new one), and an
    open session whose token it is is closed, since its token can no longer be re-checked."""


#: seconds a client is told to wait (``Retry-After``) when the policy process, which checks tokens
#: and passwords, is not reachable: about what a restart takes (systemd's RestartSec=)
CHECKER_DOWN_RETRY = 2


class Authenticator(Protocol):
    """Turns a plain bearer token into a :class:`Principal`, or ``None`` (answer 401)."""

    async def authenticate(self, token: str, fresh: bool = False) -> Principal | None:
        """Return the token's principal, or ``None`` for a malformed, unknown, wrong or expired token.

        ``fresh``: the answer must come from the token's owner of record (the policy process), not
        from a cache; used when a stream opens and by the once-a-second session re-check.

        Raises:
            TokenUndecided: no answer can be given now (only an authenticator that asks another
                process does this); :class:`CheckerDown` when that process is not running.
        """
        ...


class FileAuthenticator:
    """Authenticate against ``users.yaml`` (docs/REFERENCE.md §5.1), reloading it when it changes.

    Args:
        users_file: path of ``users.yaml``. A missing file means no users (everything is 401).

    The file is held by the one reload holder, :class:`mcpd.common.reload.Reloading`: stat'ed on
    every call (a cheap syscall) and parsed again when ``(device, inode, size, mtime_ns)``
    changes. A parse error is logged (without contents) and leaves the authenticator with no
    users until the file is fixed: fail closed (``fail_closed``), never the last good users, so a
    broken edit cannot keep a revoked token alive.
    """

    def __init__(self, users_file: str) -> None:
        self._users: Reloading[dict[str, UserRecord]] = Reloading(
            users_file, identity.load_users, empty={}, fail_closed=True)
        self._log_errors()

    def _log_errors(self) -> None:
        if self._users.last_errors:
            log.error("users file rejected, refusing all tokens until fixed: %s", "; ".join(self._users.last_errors))

    async def authenticate(self, token: str, fresh: bool = False) -> Principal | None:
        """Verify ``token`` (constant-time digest compare in :func:`identity.verify`); every
        answer is fresh (the file's signature is checked on each call)."""
        if self._users.refresh():
            self._log_errors()
        return identity.verify(self._users.current, token)


class McpUser(BaseUser):
    """The authenticated caller of one HTTP request (set by the auth middleware in ``app.py``)."""

    def __init__(self, principal: Principal, token: str) -> None:
        self.principal = principal
        self.token = token

    @property
    def is_authenticated(self) -> bool:
        """Always true: unauthenticated requests never get past the middleware."""
        return True

    @property
    def display_name(self) -> str:
        """The principal's name."""
        return self.principal.name
