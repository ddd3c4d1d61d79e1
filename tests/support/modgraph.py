"""``scripts/modgraph.py`` (the module graph) loaded for the tests, and the repository it reads."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def modgraph() -> types.ModuleType:
    """``scripts/modgraph.py``, loaded from its file (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("modgraph", REPO / "scripts" / "modgraph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["modgraph"] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module
