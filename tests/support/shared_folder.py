"""A shared folder every test account may read."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A folder every account may read (the test accounts cannot enter pytest's tmp_path)."""
    folder = Path(tempfile.mkdtemp(prefix="mcpd-churn-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
