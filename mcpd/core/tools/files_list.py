"""The ``files/list`` tool: a directory's entries with their metadata (issue 4).

Front side only: schema, argument checks and the formatting of the op's result
(:func:`mcpd.core.fileops.listing.op_list` runs in the worker or the privileged child).
"""

from __future__ import annotations

from typing import Any

from mcpd.common.validate import check_bool, check_int, check_object, check_path
from mcpd.core.tools._schemas import PATH_SCHEMA, PRIVILEGED_SCHEMA

NAME = "files/list"
DEFAULT_LIMIT = 1000  # entries
MAX_LIMIT = 10000  # entries
DESCRIPTION = (
    "List a directory on the server: every entry, hidden ones included, sorted by name, each with "
    "its type (file, dir, symlink with its target, fifo, socket, char or block device), size in "
    "bytes, mode (octal and -rw-r----- form), owner and group names (numeric when unnamed) and "
    "mtime (ISO 8601 UTC). Symlinks are shown, never followed. A path that is not a directory is "
    f"described alone. At most `limit` entries (default {DEFAULT_LIMIT}, max {MAX_LIMIT}); a note "
    "says how many were left out. `privileged: true` lists through the root helper, showing only "
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
_KNOWN = frozenset(INPUT_SCHEMA["properties"])


def parse_args(args: Any) -> dict[str, Any]:
    """Validate ``files/list`` arguments.

    Args:
        args: the raw ``arguments`` object of ``tools/call``.

    Returns:
        ``{"path": str, "limit": int, "privileged": bool}``.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` (SPEC §2.5) for a missing/relative path, a NUL byte,
            an unknown key, or a limit outside 1..10000.
    """
    args = check_object(args, _KNOWN)
    return {
        "path": check_path(args, "path"),
        "limit": check_int(args, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT),
        "privileged": check_bool(args, "privileged"),
    }


def _line(entry: dict[str, Any]) -> str:
    name = str(entry["name"])
    if "target" in entry:
        name += f" -> {entry['target']}"
    return (
        f"{entry['permissions']} {entry['owner']:<8} {entry['group']:<8} {entry['size']:>12} "
        f"{entry['mtime']} {name}"
    )


def format_result(result: dict[str, Any]) -> dict[str, Any]:
    """The MCP ``CallToolResult``: an ``ls -l``-like text listing; ``structuredContent`` is the op result.

    Args:
        result: :func:`mcpd.core.fileops.listing.list_path`'s dict.
    """
    entries = result.get("entries", [])
    if result.get("kind") == "directory":
        total = result["total"]
        head = f"{result['path']}: {total} {'entry' if total == 1 else 'entries'}"
        if result.get("truncated"):
            head += f", {len(entries)} shown"
    else:
        head = f"{result['path']}:"
    lines = [head, *(_line(e) for e in entries)]
    if result.get("note"):
        lines.append(f"[NOTE: {result['note']}]")
    return {"content": [{"type": "text", "text": "\n".join(lines)}], "structuredContent": result}
