"""What the attack 14 reproducers share: the source tree to run (``argv[1]``, default this one;
e.g. a tree with the unfixed code), put on the path before ``tests.conftest`` is imported, and a
session-era ``/mcp`` client's ``initialize``, ``ping`` and headers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

TREE = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, TREE)
os.environ["PYTHONPATH"] = TREE  # (the daemon subprocess runs that tree's mcpd)

INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "a14", "version": "1"}}}
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}


def headers(token: str, sid: str | None = None) -> dict[str, str]:
    """A ``/mcp`` POST's headers for bearer ``token`` and session ``sid`` (none: initialize)."""
    h = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
         "MCP-Protocol-Version": "2025-06-18"}
    if sid:
        h["Mcp-Session-Id"] = sid
    return h
