"""The ``files/find`` tool: search a tree by name glob, type and depth (issue 4).

Front side only: schema, argument checks and formatting of :func:`mcpd.core.fileops.find.op_find`'s
result.
"""

from __future__ import annotations

from typing import Any

from mcpd.common.errors import invalid_argument
from mcpd.common.validate import check_bool, check_choice, check_int, check_object, check_path
from mcpd.core.fileops import TYPE_NAMES
from mcpd.core.tools._schemas import PATH_SCHEMA, PRIVILEGED_SCHEMA

NAME = "files/find"
DEFAULT_MAX_RESULTS = 1000
MAX_RESULTS = 10000
DEFAULT_BUDGET = 10  # seconds
MAX_BUDGET = 60  # seconds
MAX_PATTERN = 1024  # characters

DESCRIPTION = (
    "Find entries below a directory on the server, like find(1): filter by `name` (a glob matched "
    "against each entry's own name, case-sensitive: * ? [...]), `type` (file, dir, symlink, fifo, "
    "socket, char, block) and `max_depth` (1 = the root's own entries). Symlinks are not followed "
    "unless `follow_symlinks: true` (loops are detected). Stops at `max_results` (default "
    f"{DEFAULT_MAX_RESULTS}, max {MAX_RESULTS}) or after `time_budget_seconds` (default "
    f"{DEFAULT_BUDGET}, max {MAX_BUDGET}) and says so. Directories that cannot be read are listed "
    "in `errors` and skipped. `privileged: true` searches through the root helper, showing only "
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
_KNOWN = frozenset(INPUT_SCHEMA["properties"])


def parse_args(args: Any) -> dict[str, Any]:
    """Validate ``files/find`` arguments.

    Returns:
        ``{"root": str, "name": str | None, "type": str | None, "max_depth": int | None,
        "max_results": int, "time_budget_seconds": float, "follow_symlinks": bool,
        "privileged": bool}``.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` (SPEC §2.5) for a bad root, pattern, type or number, an
            unknown key, or ``follow_symlinks`` with ``privileged`` (SPEC §4.4 follows no link).
    """
    args = check_object(args, _KNOWN)
    out: dict[str, Any] = {"root": check_path(args, "root")}
    name = args.get("name")
    if name is not None and (not isinstance(name, str) or not name or len(name) > MAX_PATTERN or "\0" in name):
        raise invalid_argument(f"name must be a glob of 1 to {MAX_PATTERN} characters", argument="name")
    out["name"] = name
    out["type"] = check_choice(args, "type", TYPE_NAMES, None)
    out["max_depth"] = check_int(args, "max_depth", None, 1, None)
    out["max_results"] = check_int(args, "max_results", DEFAULT_MAX_RESULTS, 1, MAX_RESULTS)
    budget = args.get("time_budget_seconds", DEFAULT_BUDGET)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= MAX_BUDGET:
        raise invalid_argument(
            f"time_budget_seconds must be a number above 0 and at most {MAX_BUDGET}", argument="time_budget_seconds"
        )
    out["time_budget_seconds"] = float(budget)
    out["follow_symlinks"] = check_bool(args, "follow_symlinks")
    out["privileged"] = check_bool(args, "privileged")
    if out["follow_symlinks"] and out["privileged"]:
        raise invalid_argument("follow_symlinks is not available with privileged", argument="follow_symlinks")
    return out


def format_result(result: dict[str, Any]) -> dict[str, Any]:
    """The MCP ``CallToolResult``: one match per line, then notes; ``structuredContent`` is the op result.

    Args:
        result: :func:`mcpd.core.fileops.find.find`'s dict.
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
