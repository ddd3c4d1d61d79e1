"""The ``files/find`` tool: search a tree by name glob, type and depth.

Schema, description and the text of the op's result. The argument checks are
:func:`mcpd.core.walk.parse_find_args`, which the privileged walker runs too; the walk is
:func:`mcpd.core.walk.walk_find` and the result :func:`mcpd.core.fileops.find.format_find`'s.
"""

from __future__ import annotations

from typing import Any

from mcpd.common.typenames import TYPE_NAMES
from mcpd.core.tools._outputs import FIND, output_schema
from mcpd.core.tools._schemas import PATH_SCHEMA, PRIVILEGED_SCHEMA
from mcpd.core.walk import FIND_BUDGET as DEFAULT_BUDGET
from mcpd.core.walk import FIND_MAX as MAX_RESULTS
from mcpd.core.walk import FIND_MAX_BUDGET as MAX_BUDGET
from mcpd.core.walk import FIND_RESULTS as DEFAULT_MAX_RESULTS
from mcpd.core.walk import MAX_PATTERN
from mcpd.core.walk import parse_find_args as parse_args

NAME = "files/find"
DESCRIPTION = (
    "Find entries below a directory on the server, like find(1): filter by `name` (a glob matched "
    "against each entry's own name, case-sensitive: * ? [...]), `type` (file, dir, symlink, fifo, "
    "socket, char, block) and `max_depth` (1 = the root's own entries). Symlinks are not followed "
    "unless `follow_symlinks: true` (loops are detected). Stops at `max_results` (default "
    f"{DEFAULT_MAX_RESULTS}, max {MAX_RESULTS}) or after `time_budget_seconds` (default "
    f"{DEFAULT_BUDGET}, max {MAX_BUDGET}) and says so. Directories that cannot be read are listed "
    "in `errors` and skipped. `privileged: true` searches with root's read rights, showing only "
    "what an mcp-sudo.yaml grant covers."
)
INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "root": {**PATH_SCHEMA, "description": "Absolute path of the directory to search."},
        "name": {"type": "string", "minLength": 1, "maxLength": MAX_PATTERN, "description": "Glob on entry names."},
        "type": {"type": "string", "enum": list(TYPE_NAMES)},
        "max_depth": {"type": "integer", "minimum": 1},
        "max_results": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS, "default": DEFAULT_MAX_RESULTS},
        "time_budget_seconds": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_BUDGET,
            "default": DEFAULT_BUDGET,
        },
        "follow_symlinks": {"type": "boolean", "default": False},
        "privileged": PRIVILEGED_SCHEMA,
    },
    "required": ["root"],
    "additionalProperties": False,
}
#: the ``structuredContent`` it answers (listed to sessions of 2025-06-18 and later)
OUTPUT_SCHEMA: dict[str, Any] | None = output_schema(FIND)
__all__ = [
    "DEFAULT_BUDGET", "DEFAULT_MAX_RESULTS", "DESCRIPTION", "INPUT_SCHEMA", "OUTPUT_SCHEMA", "MAX_BUDGET", "MAX_PATTERN", "MAX_RESULTS",
    "NAME", "format_result", "parse_args",
]


def format_result(result: dict[str, Any]) -> dict[str, Any]:
    """The MCP ``CallToolResult``: one match per line, then notes; ``structuredContent`` is the op result.

    Args:
        result: :func:`mcpd.core.fileops.find.format_find`'s dict.
    """
    matches = result.get("matches", [])
    lines = [f"{m['path']}/" if m.get("type") == "dir" else m["path"] for m in matches]
    n, scanned = len(matches), result.get("scanned", 0)
    lines.append(
        f"[{n} {'match' if n == 1 else 'matches'}, {scanned} {'entry' if scanned == 1 else 'entries'} "
        f"scanned under {result['root']}]"
    )
    if result.get("stopped") == "max_results":
        lines.append("[NOTE: stopped at max_results; narrow the search or raise max_results]")
    elif result.get("stopped") == "time_budget":
        lines.append("[NOTE: stopped when the time budget ran out; results are incomplete]")
    for err in result.get("errors", []):
        lines.append(f"[ERROR: {err['path']}: {err['reason']}]")
    hidden = result.get("error_count", 0) - len(result.get("errors", []))
    if hidden > 0:
        lines.append(f"[{hidden} more errors not shown]")
    return {"content": [{"type": "text", "text": "\n".join(lines)}], "structuredContent": result}
