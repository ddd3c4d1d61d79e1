"""The front's side of privileged calls (SPEC §4.1).

The front never decides a privileged call: it forwards the caller's token, principal, session
and peer with the operation to a :class:`PrivilegedBackend` (the root helper client,
``mcpd/helper/client.py``), which authenticates and checks the grant itself. When no helper is
configured or reachable, :class:`Unavailable` answers every call with ``HELPER_UNAVAILABLE``;
``privileged: true`` is never downgraded to an unprivileged read.
"""

from __future__ import annotations

from typing import Any, Protocol

from mcpd.helper.wire.errors import HELPER_UNAVAILABLE, ToolError
from mcpd.common.identity import Principal


class PrivilegedBackend(Protocol):
    """Runs one privileged operation on behalf of an authenticated caller (SPEC §4)."""

    async def call(
        self, token: str, principal: Principal, session_id: str, peer: str, op: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        """Run ``op`` (e.g. ``"files/read"``) with parsed ``args``; return the op's result dict.

        Raises:
            ToolError: refused (``PERMISSION_DENIED``), failed, or ``HELPER_UNAVAILABLE``.
        """
        ...


class Unavailable:
    """A backend for a front without a root helper: every call is ``HELPER_UNAVAILABLE``."""

    async def call(
        self, token: str, principal: Principal, session_id: str, peer: str, op: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        """Always raises ``ToolError(HELPER_UNAVAILABLE)`` (SPEC §2.5)."""
        raise ToolError(HELPER_UNAVAILABLE, "privileged reads are unavailable: the root helper is not running")
