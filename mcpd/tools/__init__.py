"""The tool registry (SPEC §2.4): tool name → the module that defines it.

Each tool module defines ``NAME``, ``DESCRIPTION``, ``INPUT_SCHEMA``, ``parse_args(args)`` and
``format_result(result)`` (see docs/INTERNALS.md). The front lists and dispatches exactly the
tools in :data:`TOOLS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Protocol


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


_MODULES: tuple[str, ...] = ("files_read",)


def _load() -> dict[str, ToolModule]:
    tools: dict[str, ToolModule] = {}
    for name in _MODULES:
        try:
            mod: Any = importlib.import_module(f"mcpd.tools.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"mcpd.tools.{name}":
                raise
            continue  # not written yet
        tools[mod.NAME] = mod
    return tools


TOOLS: Mapping[str, ToolModule] = _load()
