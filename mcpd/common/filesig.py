"""A cheap "has this file changed?" check for files re-read on change (users, grants, tokens)."""

from __future__ import annotations

import os

Signature = tuple[int, int, int, int]


def signature(path: str) -> Signature | None:
    """``(st_dev, st_ino, st_size, st_mtime_ns)`` of ``path`` (one ``stat``), or ``None`` when it
    does not exist. A different value means the file was replaced or rewritten.

    Raises:
        OSError: any failure other than a missing file (e.g. ``EACCES``).
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
