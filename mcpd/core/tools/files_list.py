"""The ``files/list`` tool: a directory's entries with their metadata.

Schema, description and the text of the op's result. The argument checks are
:func:`mcpd.core.walk.parse_list_args`, which the privileged walker runs too; the walk is
:func:`mcpd.core.walk.walk_list` and the result :func:`mcpd.core.fileops.listing.format_list`'s.
"""

from __future__ import annotations

from typing import Any

from mcpd.common.listing import entry_line
from mcpd.core.tools._outputs import LIST, output_schema
from mcpd.core.tools._schemas import PATH_SCHEMA, PRIVILEGED_SCHEMA
from mcpd.core.walk import LIST_LIMIT as DEFAULT_LIMIT
from mcpd.core.walk import LIST_MAX as MAX_LIMIT
from mcpd.core.walk import parse_list_args as parse_args

NAME = "files/list"
DESCRIPTION = (
    "List a directory on the server: every entry, hidden ones included, sorted by name, each with "
    "its type (file, dir, symlink with its target, fifo, socket, char or block device), size in "
    "bytes, mode (octal and -rw-r----- form), owner and group names (numeric when unnamed) and "
    "mtime (ISO 8601 UTC). Symlinks are shown, never followed. A path that is not a directory is "
    f"described alone. At most `limit` entries (default {DEFAULT_LIMIT}, max {MAX_LIMIT}); a note "
    "says how many were left out. `privileged: true` lists with root's read rights, showing only "
    "entries an mcp-sudo.yaml grant covers."
)
INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {**PATH_SCHEMA, "description": "Absolute path of the directory (or entry) to list."},
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_LIMIT,
            "default": DEFAULT_LIMIT,
            "description": "Maximum number of entries returned.",
        },
        "privileged": PRIVILEGED_SCHEMA,
    },
    "required": ["path"],
    "additionalProperties": False,
}
#: the ``structuredContent`` it answers (listed to sessions of 2025-06-18 and later)
OUTPUT_SCHEMA: dict[str, Any] | None = output_schema(LIST)
__all__ = ["DEFAULT_LIMIT", "DESCRIPTION", "INPUT_SCHEMA", "OUTPUT_SCHEMA", "MAX_LIMIT", "NAME", "format_result", "parse_args"]


def format_result(result: dict[str, Any]) -> dict[str, Any]:
    """The MCP ``CallToolResult``: an ``ls -l``-like text listing; ``structuredContent`` is the op result.

    Args:
        result: :func:`mcpd.core.fileops.listing.format_list`'s dict.
    """
    entries = result.get("entries", [])
    if result.get("kind") == "directory":
        total = result["total"]
        head = f"{result['path']}: {total} {'entry' if total == 1 else 'entries'}"
        if result.get("truncated"):
            head += f", {len(entries)} shown"
    else:
        head = f"{result['path']}:"
    lines = [head, *(entry_line(e) for e in entries)]
    if result.get("note"):
        lines.append(f"[NOTE: {result['note']}]")
    return {"content": [{"type": "text", "text": "\n".join(lines)}], "structuredContent": result}
