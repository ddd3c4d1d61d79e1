"""The ``files/filetype`` tool: what a file is, from a small sample.

Front side only: schema, argument checks and formatting of
:func:`mcpd.core.fileops.filetype.op_filetype`'s result.
"""

from __future__ import annotations

from typing import Any

from mcpd.common.config import SAMPLE_BYTES
from mcpd.common.validate import check_bool, check_object, check_path
from mcpd.core.tools._outputs import FILETYPE, output_schema
from mcpd.core.tools._schemas import PATH_SCHEMA, PRIVILEGED_SCHEMA

NAME = "files/filetype"
DESCRIPTION = (
    "Identify a file on the server without reading it whole: its type (file, dir, symlink, fifo, "
    "socket, char or block device), a MIME type from libmagic (inode/symlink for a link, which is "
    "never followed; inode/fifo etc. for special files, which are never opened), and for a regular "
    "file whether it is text or binary, its encoding (from a BOM, UTF-8, or detected), and its line "
    f"endings (LF, CRLF, CR, mixed or none), judged from the first {SAMPLE_BYTES} bytes. "
    "`privileged: true` runs with root's read rights under an mcp-sudo.yaml grant."
)
INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {**PATH_SCHEMA, "description": "Absolute path of the file to identify."},
        "privileged": PRIVILEGED_SCHEMA,
    },
    "required": ["path"],
    "additionalProperties": False,
}
#: the ``structuredContent`` it answers (listed to sessions of 2025-06-18 and later)
OUTPUT_SCHEMA: dict[str, Any] | None = output_schema(FILETYPE)
_KNOWN = frozenset(INPUT_SCHEMA["properties"])


def parse_args(args: Any) -> dict[str, Any]:
    """Validate ``files/filetype`` arguments.

    Returns:
        ``{"path": str, "privileged": bool}``.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` (docs/REFERENCE.md §2.5) for a missing/relative path, a NUL byte or an
            unknown key.
    """
    args = check_object(args, _KNOWN)
    return {"path": check_path(args, "path"), "privileged": check_bool(args, "privileged")}


def format_result(result: dict[str, Any]) -> dict[str, Any]:
    """The MCP ``CallToolResult``: ``path: mime`` plus the findings; ``structuredContent`` is the op result.

    Args:
        result: :func:`mcpd.core.fileops.filetype.filetype`'s dict.
    """
    lines = [f"{result['path']}: {result['mime']}"]
    if "target" in result:
        lines.append(f"symlink to {result['target']}")
    if result.get("type") == "file":
        lines.append(f"description: {result.get('description')}")
        if result.get("text"):
            enc = result.get("encoding") or "none (empty file)"
            bom = " with BOM" if result.get("bom") else ""
            lines.append(f"text, encoding {enc}{bom}, line endings {result.get('line_endings')}")
        else:
            lines.append("binary")
        lines.append(f"size: {result['size']} bytes (judged from the first {result.get('sampled_bytes')})")
    else:
        lines.append(f"type: {result.get('type')} (not opened)")
    return {"content": [{"type": "text", "text": "\n".join(lines)}], "structuredContent": result}
