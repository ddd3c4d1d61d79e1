"""Close sessions whose token stopped being valid (docs/REFERENCE.md §1.4, §5).

Rotating or removing a principal's token (``mcpd users rotate|remove``), a login token's
revocation (``linuxctl logout``, ``mcpd users sessions --revoke``) or its expiry must end the
sessions it opened at once, not only refuse its next POST. The front cannot be told by the files
it may not read, so it asks: every :data:`INTERVAL` seconds, each distinct token of the open
sessions is authenticated again with the front's :class:`~mcpd.front.auth.Authenticator` (the policy
process, or ``users.yaml`` in development mode); a session whose token now fails, or belongs to
another token id or principal, is closed, which ends its stream and cancels its requests.

While the policy process restarts, :class:`~mcpd.front.policy_client.authenticator.PolicyAuthenticator`
answers from its short cache, so a restart alone closes nothing; while it is busy, it decides
nothing (:class:`~mcpd.front.auth.TokenUndecided`), and no session is closed for that. A policy
process down for longer than the cache's window (:class:`~mcpd.front.auth.CheckerDown`) closes the
sessions whose token it can no longer check, without taking the token for revoked (its workers are
not retired as a revoked token's are: they ended with it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from mcpd.front.auth import Authenticator, CheckerDown, TokenUndecided
from mcpd.front.sessions.session import Session
from mcpd.front.sessions.table import SessionManager

log = logging.getLogger(__name__)

INTERVAL = 1.0
CHECK_TIMEOUT = 15.0


async def revalidate_once(manager: SessionManager, authenticator: Authenticator,
                          on_revoked: Callable[[str, str], object] | None = None,
                          working: Callable[[], Iterable[tuple[str, str, str]]] | None = None) -> int:
    """Check every open session's token once; return how many sessions were closed.
    ``on_revoked(principal_name, token)`` is called once per token (and principal) whose
    sessions were closed (the front retires the workers that token started with them, and
    stops its tasks' work). ``working()`` gives ``(token, principal_name, token_id)`` of work
    that no session holds (tasks, which outlive the session or stateless request that made
    them): a token of those that now fails or names another principal or token id is passed to
    ``on_revoked`` too; one that cannot be checked stops nothing."""
    by_token: dict[str, list[Session]] = {}
    for session in manager.sessions():
        by_token.setdefault(session.token, []).append(session)
    closed = 0
    revoked: set[tuple[str, str]] = set()
    for token, sessions in by_token.items():
        try:
            async with asyncio.timeout(CHECK_TIMEOUT):
                principal = await authenticator.authenticate(token, fresh=True) if token else None
        except CheckerDown:  # the policy process has been down longer than the short window: close, not revoked
            for session in sessions:
                log.info("session %s closed: its token cannot be checked (the policy process is not reachable)",
                         session.id)
                manager.close(session)
                closed += 1
            continue
        except (TimeoutError, TokenUndecided):
            continue  # undecided (the policy process is busy or slow): check again next round
        for session in sessions:
            p = session.principal
            if principal is None or (principal.name, principal.token_id) != (p.name, p.token_id):
                log.info("session %s closed: its token is no longer valid", session.id)
                manager.close(session)
                revoked.add((p.name, token))
                closed += 1
    for token, name, token_id in set(working() if working is not None else ()):
        if token in by_token or not token:
            continue  # (checked with its sessions above)
        try:
            async with asyncio.timeout(CHECK_TIMEOUT):
                principal = await authenticator.authenticate(token, fresh=True)
        except (TimeoutError, TokenUndecided):  # (CheckerDown too: unknown is not revoked)
            continue
        if principal is None or (principal.name, principal.token_id) != (name, token_id):
            revoked.add((name, token))
    if on_revoked is not None:
        for name, token in revoked:
            on_revoked(name, token)
    return closed


async def revalidate_forever(manager: SessionManager, authenticator: Authenticator,
                             interval: float = INTERVAL, idle_seconds: float | None = None,
                             on_revoked: Callable[[str, str], object] | None = None,
                             working: Callable[[], Iterable[tuple[str, str, str]]] | None = None) -> None:
    """Run :func:`revalidate_once` every ``interval`` seconds until cancelled; with
    ``idle_seconds``, also expire idle Streamable HTTP sessions (:meth:`SessionManager.expire_idle`);
    after many sessions closed, give their memory back (:meth:`SessionManager.give_back_memory`)."""
    while True:
        await asyncio.sleep(interval)
        try:
            if idle_seconds is not None:
                manager.expire_idle(idle_seconds)
            await revalidate_once(manager, authenticator, on_revoked, working)
            manager.give_back_memory()
        except Exception:
            log.exception("session revalidation failed; retrying")
