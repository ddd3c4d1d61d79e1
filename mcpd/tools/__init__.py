"""The tool registry (SPEC §2.4): tool name → the module that defines it.

Each tool module defines ``NAME``, ``DESCRIPTION``, ``INPUT_SCHEMA``, ``parse_args(args)`` and
``format_result(result)`` (see docs/INTERNALS.md). The front lists and dispatches exactly the
tools in :data:`TOOLS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from mcpd.tools import files_filetype, files_find, files_list, files_read


class ToolModule(Protocol):
    """The shape every ``mcpd/tools/<tool>.py`` module has."""

    NAME: str
    DESCRIPTION: str
    INPUT_SCHEMA: dict[str, Any]

    def parse_args(self, args: Any) -> dict[str, Any]:
        """Validate raw arguments; return them normalised (incl. ``privileged``) or raise ToolError."""
        ...

    def format_result(self, result: dict[str, Any]) -> dict[str, Any]:
        """Turn an op result dict into an MCP ``CallToolResult``."""
        ...


def _registry(*modules: Any) -> dict[str, ToolModule]:
    return {m.NAME: m for m in modules}


TOOLS: Mapping[str, ToolModule] = _registry(files_read, files_list, files_find, files_filetype)
