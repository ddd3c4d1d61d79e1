"""The readers' ``OSError`` mapping: what opening or reading a file meets, as a docs/REFERENCE.md §2.5 code.

The workers, the walker's metadata walk and the policy process open with ``O_NOFOLLOW`` and
``O_NONBLOCK`` (or list and ``stat``), so besides what root's opener meets
(:func:`mcpd.helper.wire.errors.from_oserror`) they meet a symlink at the leaf, a directory and a
FIFO or socket that cannot be opened without blocking. Root's opener resolves to ``O_PATH``
descriptors and meets none of these, so this mapping is not root's.
"""

from __future__ import annotations

import errno

from mcpd.helper.wire.errors import NOT_A_REGULAR_FILE, ToolError, denied, from_oserror
from mcpd.helper.wire.openrules import SYMLINK


def reader_error(exc: OSError, path: str) -> ToolError:
    """Map an ``OSError`` from opening or reading ``path`` to the docs/REFERENCE.md §2.5 code.

    ``ELOOP`` → ``PERMISSION_DENIED`` (reason ``symlink in path``); ``EISDIR`` →
    ``NOT_A_REGULAR_FILE``; ``ENXIO`` (a FIFO or socket that cannot be opened without blocking) →
    ``NOT_A_REGULAR_FILE``; anything else as :func:`~mcpd.helper.wire.errors.from_oserror` maps it
    (``FILE_NOT_FOUND``, ``PERMISSION_DENIED``, else ``INTERNAL_ERROR`` with the errno name only).
    """
    err = exc.errno
    if err == errno.ELOOP:
        return denied(path, SYMLINK)
    if err == errno.EISDIR:
        return ToolError(NOT_A_REGULAR_FILE, f"not a regular file: {path}", path=path, type="directory")
    if err == errno.ENXIO:
        return ToolError(NOT_A_REGULAR_FILE, f"not a regular file: {path}", path=path, type="fifo or socket")
    return from_oserror(exc, path)
