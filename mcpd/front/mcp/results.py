"""The one rendering of a tool failure as the result of a ``tools/call``.

Both the dispatcher (a call that failed) and the task store (a task's result replaced by an error)
answer a failure this way; it lives here so that neither imports the other for it.
"""

from __future__ import annotations

from typing import Any

from mcpd.helper.wire.errors import ToolError


def tool_error_result(exc: ToolError) -> dict[str, Any]:
    """The ``CallToolResult`` for a tool failure: ``isError`` with the code in ``structuredContent``."""
    return {
        "content": [{"type": "text", "text": exc.message}],
        "isError": True,
        "structuredContent": {"error": exc.to_dict()},
    }
