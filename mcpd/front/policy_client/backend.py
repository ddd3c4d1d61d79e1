"""Privileged calls (docs/REFERENCE.md §4.1): :class:`PolicyBackend` forwards each, with the
caller's token, to the policy process, which authenticates and checks the grant. A walk
(``files/list``, ``files/find``) comes back as the walker's raw metadata, formatted here; a read
or a filetype runs in a worker of the caller's that the pool lends (:meth:`WorkerPool.lease
<mcpd.front.workers.pool.WorkerPool.lease>`): the policy process has root open the granted file
and hand it to that worker, whose reply is then read through the lease.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mcpd.common.deadline import DEADLINE_MARGIN, deadline_seconds
from mcpd.common.identity import Principal
from mcpd.common.inflight import InFlight
from mcpd.core import fileops
from mcpd.front import metrics
from mcpd.front.access import policy_received
from mcpd.front.limits import CAP_KEY
from mcpd.front.policy_client.channel import (
    CALL_CONNECTIONS,
    CALL_SHARE,
    UNAVAILABLE,
    NoConnection,
    OverShare,
    PolicyChannel,
    PolicyUnavailable,
)
from mcpd.front.workers.channel import reply_result
from mcpd.front.workers.pool import WorkerPool
from mcpd.helper.wire.errors import HELPER_UNAVAILABLE, PERMISSION_DENIED, RATE_LIMITED, TIMEOUT, ToolError

#: refusals the policy process decided before root handed the worker a file: the worker stays in the pool
DECIDED = frozenset({PERMISSION_DENIED, "NOT_A_REGULAR_FILE", "FILE_NOT_FOUND", "INVALID_ARGUMENT"})


class PolicyBackend:
    """The :class:`mcpd.front.privileged.PrivilegedBackend` that forwards to the policy process.

    Args:
        channel: the channel to the policy process.
        pool: the worker pool; a content call runs in a worker of the caller's, lent by the pool.
        timeout: a call's default deadline (``workers.timeout_seconds``); the front waits for the
            policy process's answer one margin past the call's deadline by the one rule.
        per_principal: privileged calls one principal may have in flight at once (docs/REFERENCE.md §1.7),
            so no principal takes the policy process's capacity from the others; beyond it ``RATE_LIMITED``.
    """

    def __init__(self, channel: PolicyChannel, pool: WorkerPool, timeout: float, per_principal: int = 32) -> None:
        self._channel, self._pool, self._timeout = channel, pool, timeout
        self._in_flight = InFlight(per_principal)  # privileged calls per principal

    async def call(
        self, token: str, principal: Principal, session_id: str, peer: str, op: str, args: dict[str, Any],
        trace: dict[str, str] | None = None, **hitl: Any,
    ) -> dict[str, Any]:
        """Run one privileged call; return the op's result dict.

        Raises:
            ToolError: the policy process's refusal or failure; ``HELPER_UNAVAILABLE`` when it is down;
                ``RATE_LIMITED`` when the principal already has ``per_principal`` calls in flight
                or holds :data:`CALL_SHARE` call connections; ``TIMEOUT`` when no call connection
                came free within the call's time (the policy process never received it).
        """
        in_flight = self._in_flight
        if in_flight.take(principal.name) is not None:
            metrics.limit_hit("privileged_per_principal")
            cap = in_flight.per_key
            raise ToolError(RATE_LIMITED, f"{cap} privileged calls of this principal are in flight; "
                            "retry when one ends", limit=cap)
        try:
            return await self._call(token, principal, session_id, peer, op, args, trace, hitl)
        finally:
            in_flight.release(principal.name)

    async def _call(
        self, token: str, principal: Principal, session_id: str, peer: str, op: str, args: dict[str, Any],
        trace: dict[str, str] | None = None, hitl: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        args = dict(args)
        cap = args.pop(CAP_KEY, None)  # the principal's max_file_bytes (mcpd/front/limits.py)
        req: dict[str, Any] = {"type": "privileged_call", "token": token, "session": session_id, "peer": peer[:100],
                               "op": op, "args": args, **(trace or {}), **(hitl or {})}
        if cap is not None:
            req["cap"] = cap
        # the policy process's deadline for the call, by the one rule, plus a margin: its TIMEOUT comes first
        timeout = deadline_seconds(args, self._timeout, op) + DEADLINE_MARGIN
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        walk = op in ("files/list", "files/find")
        try:  # a walk may hang for a minute: one past the share is refused, not queued behind the hung ones
            async with self._channel.lease(principal.name, timeout, queue=not walk) as lease:
                left = max(end - loop.time(), 0.001)  # the wait for a connection is part of the call's time
                if walk:
                    raw = (await self._channel.ask(req, left, lease, policy_received))["result"]
                    return fileops.format_list(raw) if op == "files/list" else fileops.format_find(raw)

                job = dict(args, **({CAP_KEY: cap} if cap else {}))
                async with self._pool.lease(principal.os_user, op, job, token=token, owner=principal.name,
                                            timeout=left, decided=DECIDED) as worker:
                    await self._channel.ask(dict(req, worker=worker.pid, rid=worker.rid), left, lease, policy_received)
                    reply = await worker.reply()
                return reply_result(reply)
        except OverShare:
            metrics.limit_hit("privileged_per_principal")
            raise ToolError(RATE_LIMITED, f"{CALL_SHARE} privileged calls of this principal are holding connections "
                            f"to the policy process (its share of {CALL_CONNECTIONS}); retry when one ends",
                            limit=CALL_SHARE) from None
        except NoConnection as exc:
            metrics.limit_hit("helper_connections")  # the metric's label value: a public name
            held = f"this principal's privileged calls hold its share ({CALL_SHARE})" if exc.own else \
                f"privileged calls in flight hold all {CALL_CONNECTIONS}"
            raise ToolError(TIMEOUT, f"no connection to the policy process came free within {timeout:g} s: {held}",
                            seconds=timeout) from None
        except PolicyUnavailable:
            raise ToolError(HELPER_UNAVAILABLE, UNAVAILABLE) from None
