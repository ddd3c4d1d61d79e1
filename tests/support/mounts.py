"""Mounts a test makes for a block and always removes, lazily if busy."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def mounted(target: Path, *how: str) -> Iterator[Path]:
    """``mount [how] target`` for the block (``--bind SOURCE`` or ``-t proc proc``), always
    unmounted after (lazily if busy), so no cleanup ever deletes through it."""
    if not target.exists():
        target.mkdir()
    subprocess.run(["mount", *how, str(target)], check=True, timeout=30)
    try:
        yield target
    finally:
        if subprocess.run(["umount", str(target)], timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(target)], check=True, timeout=30)
