"""A session table as the front builds it, with no pool behind it, for unit tests of sessions and their answers."""

from __future__ import annotations

from mcpd.common.config import Config
from mcpd.front.mcp.dispatcher import Dispatcher
from mcpd.front.sessions.table import SessionManager


def manager(**cfg: object) -> SessionManager:
    return SessionManager(Config(**cfg), Dispatcher(pool=None, privileged=None))  # type: ignore[arg-type]
