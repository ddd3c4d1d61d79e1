"""Real op contexts for the fileops tests (not a test module).

Uses the product's unprivileged openers (``mcpd.core.fileopen``) and ``mcpd.core.ops.OpContext`` when they
exist; until then, the same kernel calls (``os.open`` with ``O_NONBLOCK``, fstat checks) — real
openers, not mocks.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from mcpd.common.readerrors import reader_error
from mcpd.helper.wire.errors import NOT_A_REGULAR_FILE, ToolError


def _open_dir(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        raise reader_error(err, path) from None


def _open_file(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as err:
        raise reader_error(err, path) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ToolError(NOT_A_REGULAR_FILE, f"not a regular file: {path}", path=path, type="other")
    return fd


def openers() -> tuple[Callable[[str], int], Callable[[str], int]]:
    """``(open_file, open_dir)`` of the unprivileged route."""
    try:
        from mcpd import fileopen  # type: ignore[attr-defined]
    except ImportError:
        return _open_file, _open_dir
    return fileopen.open_regular, fileopen.open_directory


def make_ctx(
    allow: Callable[[str], bool] | None = None,
    progress: Callable[[int, int | None, str], None] | None = None,
    open_file: Callable[[str], int] | None = None,
) -> Any:
    """An op context on the unprivileged openers, with an optional allow filter and progress."""
    of, od = openers()
    fields: dict[str, Any] = {"open_file": open_file or of, "open_dir": od, "allow": allow}
    try:
        from mcpd.common.config import ReadLimits
        from mcpd.core.ops import OpContext  # type: ignore[attr-defined]
    except ImportError:
        return SimpleNamespace(progress=progress, **fields)
    if "progress" in OpContext.__dataclass_fields__:
        fields["progress"] = progress
    elif progress is not None:
        return SimpleNamespace(progress=progress, **fields)
    return OpContext(limits=ReadLimits(), **fields)
