"""Privileged calls (docs/REFERENCE.md §4.1): :class:`PolicyBackend` forwards each, with the
caller's token, to the policy process, which authenticates and checks the grant. A walk
(``files/list``, ``files/find``) comes back as the walker's raw metadata, formatted here; a read
or a filetype runs in a worker of the caller's that the pool lends (:meth:`WorkerPool.lease
<mcpd.front.workers.pool.WorkerPool.lease>`): the policy process has root open the granted file
and hand it to that worker, whose reply is then read through the lease.

A call that waits for a person (a step-up sign-in, an approval: docs/REFERENCE.md §4.7) holds
neither a call connection nor a worker while it waits: the policy process answers it at once with
the record it waits on (``details.waiting``), and the call waits here, looking at the record over
the shared connections, at most :data:`WAITS_PER_PRINCIPAL` of one principal and
:data:`WAITS_TOTAL` in all at once (``RATE_LIMITED`` beyond), then is asked once more, naming the
record, and judged with no further wait.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mcpd.common.deadline import DEADLINE_MARGIN, deadline_seconds
from mcpd.common.identity import Principal
from mcpd.common.inflight import PER_KEY, InFlight
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

#: calls of one principal, and of all, that may wait for a person at once (they hold no call connection)
WAITS_PER_PRINCIPAL, WAITS_TOTAL = 4, 32
#: how often a waiting call looks at its record: first after this many seconds, doubling up to the last
LOOK_FIRST, LOOK_EVERY = 0.1, 0.5

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
        self._waits = InFlight(WAITS_PER_PRINCIPAL, WAITS_TOTAL)  # calls waiting for a person, holding no connection

    async def call(
        self, token: str, principal: Principal, session_id: str, peer: str, op: str, args: dict[str, Any],
        trace: dict[str, str] | None = None, **hitl: Any,
    ) -> dict[str, Any]:
        """Run one privileged call; return the op's result dict.

        Raises:
            ToolError: the policy process's refusal or failure; ``HELPER_UNAVAILABLE`` when it is down;
                ``RATE_LIMITED`` when the principal already has ``per_principal`` calls in flight
                or holds :data:`CALL_SHARE` call connections, or when the call would wait for a
                person past :data:`WAITS_PER_PRINCIPAL` / :data:`WAITS_TOTAL`; ``TIMEOUT`` when
                no call connection came free within the call's time (the policy process never
                received it).
        """
        in_flight = self._in_flight
        if in_flight.take(principal.name) is not None:
            metrics.limit_hit("privileged_per_principal")
            cap = in_flight.per_key
            raise ToolError(RATE_LIMITED, f"{cap} privileged calls of this principal are in flight; "
                            "retry when one ends", limit=cap)
        try:
            end = asyncio.get_running_loop().time() + deadline_seconds(args, self._timeout, op)
            asked = dict(hitl, defer=True)  # the policy process answers a wait at once: it is waited for here
            while True:
                try:
                    return await self._call(token, principal, session_id, peer, op, args, trace, asked)
                except ToolError as exc:
                    cid = exc.details.get("waiting")
                    if not isinstance(cid, str) or asked.get("waited"):
                        raise
                await self._wait_on(principal.name, cid, end)
                asked = dict(asked, confirm=cid, waited=True)
        finally:
            in_flight.release(principal.name)

    async def _wait_on(self, owner: str, cid: str, end: float) -> None:
        """Wait, holding no call connection, until confirmation record ``cid`` no longer waits for
        its person (decided, used or gone) or the loop's time reaches ``end``; one of ``owner``'s
        waits (:data:`WAITS_PER_PRINCIPAL`, :data:`WAITS_TOTAL`) meanwhile.

        Raises:
            ToolError: ``RATE_LIMITED`` (details ``limit``) past a cap; ``HELPER_UNAVAILABLE``
                when the policy process does not answer.
        """
        waits = self._waits
        if (over := waits.take(owner)) is not None:
            metrics.limit_hit("approval_waits")
            cap, whose = (waits.per_key, "of this principal ") if over == PER_KEY else (waits.cap, "")
            raise ToolError(RATE_LIMITED, f"{cap} privileged calls {whose}are already waiting for a sign-in or an "
                            "approval; retry when one is decided", limit=cap)
        loop, pause = asyncio.get_running_loop(), LOOK_FIRST
        try:
            while (left := end - loop.time()) > 0:
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, LOOK_EVERY)
                try:
                    reply, fds = await self._channel.request({"type": "confirm_view", "cid": cid},
                                                             max(end - loop.time(), 0.0) + DEADLINE_MARGIN)
                except (PolicyUnavailable, TimeoutError):
                    raise ToolError(HELPER_UNAVAILABLE, UNAVAILABLE) from None
                for s in fds:
                    s.close()
                if not reply.get("ok"):
                    return
        finally:
            waits.release(owner)

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
