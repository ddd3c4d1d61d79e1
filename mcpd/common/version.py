"""The installed package's version, read from its metadata; ``pyproject.toml`` is the one place it
is written. The root side never loads this module (it has no use for a version)."""

from __future__ import annotations

import functools
import importlib.metadata


@functools.cache
def version() -> str:
    """The ``mcpd`` distribution's version (``"0+unknown"`` when run from a tree that is not installed)."""
    try:
        return importlib.metadata.version("mcpd")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"
