"""The tool registry (docs/REFERENCE.md §2.4): tool name → the module that defines it.

Each tool module defines ``NAME``, ``DESCRIPTION``, ``INPUT_SCHEMA``, ``OUTPUT_SCHEMA``, ``parse_args(args)`` and
``format_result(result)`` (see docs/INTERNALS.md). The front lists and dispatches exactly the
tools in :data:`TOOLS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from mcpd.core.tools import files_filetype, files_find, files_grep, files_list, files_read


class ToolModule(Protocol):
    """The shape every ``mcpd/core/tools/<tool>.py`` module has."""

    NAME: str
    DESCRIPTION: str
    INPUT_SCHEMA: dict[str, Any]
    OUTPUT_SCHEMA: dict[str, Any] | None

    def parse_args(self, args: Any) -> dict[str, Any]:
        """Validate raw arguments; return them normalised (incl. ``privileged``) or raise ToolError."""
        ...

    def format_result(self, result: dict[str, Any]) -> dict[str, Any]:
        """Turn an op result dict into an MCP ``CallToolResult``."""
        ...


def _registry(*modules: Any) -> dict[str, ToolModule]:
    return {m.NAME: m for m in modules}


TOOLS: Mapping[str, ToolModule] = _registry(files_read, files_list, files_find, files_filetype, files_grep)


def portable_name(name: str) -> str:
    """The spelling of tool ``name`` every LLM API accepts (``^[a-zA-Z0-9_-]{1,64}$``):
    ``files/read`` → ``files_read`` (docs/REFERENCE.md §2.4, ``tool_names: portable``)."""
    return name.replace("/", "_")


def by_any_name(tools: Mapping[str, ToolModule]) -> dict[str, ToolModule]:
    """``tools`` reachable by both spellings of each name (``tools/call`` accepts either, whatever
    ``tools/list`` shows)."""
    return {**{portable_name(n): t for n, t in tools.items()}, **tools}


