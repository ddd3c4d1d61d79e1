"""JSON Schema fragments shared by the tools' ``INPUT_SCHEMA`` (docs/REFERENCE.md §2.4).

The checks themselves are :mod:`mcpd.common.validate` (one validator set for every tool).
"""

from __future__ import annotations

from typing import Any

from mcpd.common.validate import PATH_MAX

PATH_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": PATH_MAX}
PRIVILEGED_SCHEMA: dict[str, Any] = {
    "type": "boolean",
    "default": False,
    "description": "Run with root's read rights under an mcp-sudo.yaml grant (never silently downgraded).",
}
