"""Rewriting a config file in place for the reload tests."""

from __future__ import annotations

import os
from pathlib import Path


def rewrite(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
