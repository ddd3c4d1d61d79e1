"""JSON Schema fragments shared by the tools' ``INPUT_SCHEMA`` (docs/REFERENCE.md §2.4).

The checks themselves are :mod:`mcpd.common.validate` (one validator set for every tool).
"""

from __future__ import annotations

from typing import Any

from mcpd.common.validate import PATH_MAX

#: Accepted values of ``files/read``'s ``encoding`` argument (:mod:`mcpd.core.textdecode` decodes) → the Python codec used without a BOM;
#: ``base64`` is no text encoding: the bytes themselves, base64-encoded (:mod:`mcpd.core.rawread`).
ENCODINGS: dict[str, str] = {
    "utf-8": "utf-8",
    "ascii": "ascii",
    "latin-1": "latin-1",
    "cp1252": "cp1252",
    "utf-16": "utf-16-le",
    "auto": "auto",
    "base64": "base64",
}

PATH_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": PATH_MAX}
PRIVILEGED_SCHEMA: dict[str, Any] = {
    "type": "boolean",
    "default": False,
    "description": "Run with root's read rights under an mcp-sudo.yaml grant (never silently downgraded).",
}
