"""Fixtures of the unit tests: ``state``, a private state folder for the audit log tests, open
as a descriptor (folder, fd)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture()
def state(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    yield folder, fd
    os.close(fd)
