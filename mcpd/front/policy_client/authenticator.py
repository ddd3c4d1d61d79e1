"""Token checks by the policy process, which alone reads the tokens (docs/REFERENCE.md §5.1):
:class:`PolicyAuthenticator`, with a short cache so that a POST carrying its session's recently
verified token needs no round trip, and a bound on checks of tokens not seen lately."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from mcpd.common import identity
from mcpd.common.identity import Principal
from mcpd.front.auth import CheckerDown, TokenUndecided
from mcpd.front.policy_client.channel import PolicyChannel, PolicyUnavailable

#: token checks of tokens not verified lately (new or forged) in flight at once: fewer than the
#: policy process takes (its "auth" class: 8 threads, 32 in flight), so known tokens always find room
UNKNOWN_CHECKS = 16
UNKNOWN_WAIT = 5.0  # seconds such a check waits for its turn before it is undecided (503)


class PolicyAuthenticator:
    """An :class:`mcpd.front.auth.Authenticator` that asks the policy process (which alone reads the tokens).

    Args:
        channel: the channel to the policy process.
        cache_seconds: while the policy process is unreachable, a token it verified within this many
            seconds is still accepted (default 30). A refused token is dropped at once.
        fresh_seconds: a token verified within this many seconds is accepted without asking
            again (the session re-check keeps open sessions' tokens fresh every second).

    The cache key is a SHA-256 of the token; the token itself is never kept, and an OAuth access
    token's entry is dropped at its ``exp``. A token that is not even well-formed
    (``mcpd_<id>_<secret>``, or with ``oauth`` on a JWT's shape) is refused here, without asking. Tokens the policy
    process has not verified lately (unknown to the cache: a new token, or a forged one) are checked at
    most :data:`UNKNOWN_CHECKS` at a time, so a flood of forged tokens never takes the policy
    process's whole capacity for token checks: the re-checks of open sessions and known tokens always find
    room. A check the policy process could not make (it answered "busy", or no room came within
    :data:`UNKNOWN_WAIT` seconds) decides nothing: :class:`~mcpd.front.auth.TokenUndecided`,
    unless the token was verified within ``cache_seconds``; nor does one it could not make because
    it is not running (:class:`~mcpd.front.auth.CheckerDown`, answered 503, never 401).
    """

    def __init__(self, channel: PolicyChannel, cache_seconds: float = 30.0, fresh_seconds: float = 2.0,
                 oauth: bool = False) -> None:
        self._channel = channel
        self._oauth = oauth
        self._cache_seconds = cache_seconds
        self._fresh_seconds = fresh_seconds
        self._cache: dict[str, tuple[float, Principal]] = {}
        self._unknown = asyncio.Semaphore(UNKNOWN_CHECKS)

    async def authenticate(self, token: str, fresh: bool = False) -> Principal | None:
        """The token's principal, or ``None`` (the front answers 401) for a malformed token or one
        the policy process refused. ``fresh`` forces a round trip (stream opening, the
        once-a-second re-check).

        Raises:
            CheckerDown: the policy process is not running (its socket refuses, or it closed the
                connection without an answer) and the token was not verified within
                ``cache_seconds``: no token is called bad because its checker is down.
            TokenUndecided: the policy process is busy (or unknown tokens' checks are all taken) and the
                token was not verified within ``cache_seconds``.
        """
        if not identity.TOKEN_RE.match(token) and not (self._oauth and identity.looks_like_jwt(token)):
            return None  # the policy process would refuse it, and take a malformed request for an attack
        key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        cached = self._cache.get(key)
        if cached and cached[1].expires and cached[1].expires <= time.time():  # an OAuth token, expired: gone
            self._cache.pop(key, None)
            cached = None
        age = time.monotonic() - cached[0] if cached else None
        if cached and not fresh and age is not None and age <= self._fresh_seconds:
            return cached[1]
        recent = cached[1] if cached and age is not None and age <= self._cache_seconds else None
        gate = self._unknown if cached is None else None
        reply: dict[str, Any] | None = None
        try:
            if gate is not None:
                async with asyncio.timeout(UNKNOWN_WAIT):
                    await gate.acquire()
            try:
                reply, _ = await self._channel.request({"type": "authenticate", "token": token}, timeout=10)
            finally:
                if gate is not None:
                    gate.release()
        except PolicyUnavailable:
            if recent is None:  # the policy process is down: past the short window nothing is accepted (fail
                raise CheckerDown("the policy process is not reachable") from None  # closed), nor refused as bad
            return recent
        except TimeoutError:
            pass  # no answer in time: undecided, as below
        if reply is None or (not reply.get("ok") and reply.get("error")):  # not a refusal: busy or too slow
            if recent is None:
                raise TokenUndecided("the token could not be checked now")
            return recent
        p = reply.get("principal")
        if not reply.get("ok") or not isinstance(p, dict):
            self._cache.pop(key, None)
            return None
        try:
            principal = Principal.from_wire(p)
        except (KeyError, TypeError, ValueError):
            return None
        if len(self._cache) > 10000:
            self._cache.clear()
        self._cache[key] = (time.monotonic(), principal)
        return principal


