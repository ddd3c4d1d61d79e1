"""The front's side of privileged calls (docs/REFERENCE.md §4.1).

The front never decides a privileged call: it forwards the caller's token, principal, session
and peer with the operation to a :class:`PrivilegedBackend` (the policy process's client,
:class:`mcpd.front.policy_client.backend.PolicyBackend`). The policy process checks the token and
the grant and records the call; root opens the granted file or starts the walker (the helper
unit, ``mcpd-helper.service``, runs both). When no helper unit is configured, :class:`Unavailable`
answers every call with ``HELPER_UNAVAILABLE`` (a public error code: it names the unit as a whole);
``privileged: true`` is never downgraded to an unprivileged read.
"""

from __future__ import annotations

from typing import Any, Protocol

from mcpd.common.identity import Principal
from mcpd.helper.wire.errors import HELPER_UNAVAILABLE, ToolError

#: the answer of every privileged call in a front without a helper unit (development mode)
NO_PRIVILEGED = "privileged reads are unavailable: this daemon runs without the helper unit (no policy process)"


class PrivilegedBackend(Protocol):
    """Runs one privileged operation on behalf of an authenticated caller (docs/REFERENCE.md §4)."""

    async def call(
        self, token: str, principal: Principal, session_id: str, peer: str, op: str, args: dict[str, Any],
        trace: dict[str, str] | None = None, **hitl: Any,
    ) -> dict[str, Any]:
        """Run ``op`` (e.g. ``"files/read"``) with parsed ``args``; return the op's result dict.
        ``hitl``: ``interactive``, ``confirm``, ``why`` for a person in the loop (mcpd.front.confirm).

        Raises:
            ToolError: refused (``PERMISSION_DENIED``), failed, or ``HELPER_UNAVAILABLE``.
        """
        ...


class Unavailable:
    """A backend for a front without a helper unit: every call is ``HELPER_UNAVAILABLE``."""

    async def call(
        self, token: str, principal: Principal, session_id: str, peer: str, op: str, args: dict[str, Any],
        trace: dict[str, str] | None = None, **hitl: Any,
    ) -> dict[str, Any]:
        """Always raises ``ToolError(HELPER_UNAVAILABLE)`` (docs/REFERENCE.md §2.5)."""
        raise ToolError(HELPER_UNAVAILABLE, NO_PRIVILEGED)
