"""Workers for the token's principal, started by root as the principal's OS account
when the policy process asks it (:class:`PolicySpawner`, the pool's spawner in production); the
policy process binds each worker to the token's principal."""

from __future__ import annotations

import logging
import socket

from mcpd.common import frames
from mcpd.front.policy_client.channel import PolicyChannel, PolicyUnavailable
from mcpd.helper.wire.errors import HELPER_UNAVAILABLE, INTERNAL_ERROR, ToolError

log = logging.getLogger(__name__)


class PolicySpawner:
    """A :class:`~mcpd.front.workers.spawner.Spawner` whose workers root starts, asked by
    the policy process, for the principal of the token given, as that principal's OS account."""

    def __init__(self, channel: PolicyChannel) -> None:
        self._channel = channel
        self._tokens: dict[int, str] = {}  # pid -> the token that started it (needed to kill it)

    async def spawn(self, os_user: str, token: str = "") -> tuple[socket.socket, int]:
        """Start one worker for the principal of ``token`` (``os_user`` is only the pool's key).

        Raises:
            ToolError: ``HELPER_UNAVAILABLE`` when the policy process is down, or its refusal
                (``PERMISSION_DENIED`` for a bad token or a root account).
        """
        try:
            reply, socks = await self._channel.request({"type": "spawn_worker", "token": token}, timeout=30)
        except (PolicyUnavailable, TimeoutError):
            raise ToolError(HELPER_UNAVAILABLE, "cannot start a worker: the policy process is not reachable") from None
        pid = reply.get("pid")
        if not reply.get("ok") or len(socks) != 1 or not isinstance(pid, int):
            for s in socks:
                s.close()
            if reply.get("error"):
                raise frames.reply_error(reply["error"])
            raise ToolError(INTERNAL_ERROR, "internal error")
        self._tokens[pid] = token
        return socks[0], pid

    def generation(self) -> int:
        """:attr:`PolicyChannel.losses`: it changes when the connections to the policy process were lost, as
        when the policy process died (with root, or alone) (and every worker with it)."""
        return self._channel.losses

    async def alive(self) -> bool:
        """Whether the policy process answers now: one round trip (an empty token's check), so
        one that is dying this very moment counts as gone."""
        try:
            await self._channel.request({"type": "authenticate", "token": ""}, timeout=2)
        except (PolicyUnavailable, TimeoutError):
            return False
        return True

    async def kill(self, pid: int) -> None:
        """Ask the policy process to have worker ``pid`` SIGKILLed (with the token that started it); a refusal or a
        down policy process is logged: the worker still ends when its socket closes."""
        token = self._tokens.pop(pid, "")
        try:
            await self._channel.ask({"type": "kill_worker", "token": token, "pid": pid}, timeout=10)
        except ToolError as exc:
            log.warning("could not kill worker %d: %s", pid, exc.message)

    async def drop(self, pid: int) -> None:
        """Forget worker ``pid``, whose token no longer authenticates or which hung up: the policy
        process kills a revoked token's workers itself within about a second (and a worker exits
        at once on its closed socket) and reaps every worker that exits; a ``kill_worker`` with a
        token that no longer authenticates would only be refused and recorded as an invalid token."""
        self._tokens.pop(pid, None)


