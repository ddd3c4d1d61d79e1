"""mcpd: a Linux daemon serving a server's files to MCP agents over TLS (see SPEC.md).

``mcpd.__version__`` is the installed package's version, read from its metadata
(``importlib.metadata``) on first use; ``pyproject.toml`` is the one place it is written.
"""

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


def __getattr__(name: str) -> str:
    """``__version__`` on demand (PEP 562), so the workers that import ``mcpd`` never read metadata."""
    if name == "__version__":
        return version()
    raise AttributeError(f"module 'mcpd' has no attribute {name!r}")
