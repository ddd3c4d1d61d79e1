"""A cheap "has this file changed?" check for files re-read on change (users, grants, tokens)."""

from __future__ import annotations

import os
from collections.abc import Callable

Signature = tuple[int, int, int, int]


def stat_signature(path: str) -> Signature:
    """``(st_dev, st_ino, st_size, st_mtime_ns)`` of ``path`` from one ``stat``.

    Raises:
        OSError: ``FileNotFoundError`` for a missing file, any other failure (e.g. ``EACCES``).
    """
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


#: How :func:`signature` looks at a file: :func:`stat_signature`, except in the policy process (not
#: root), which asks the root helper about the files only root may see (:mod:`mcpd.policy.main`).
signature_of: Callable[[str], Signature] = stat_signature


def signature(path: str) -> Signature | None:
    """The file's :func:`stat_signature`, or ``None`` when it does not exist. A different value
    means the file was replaced or rewritten.

    Raises:
        OSError: any failure other than a missing file (e.g. ``EACCES``).
    """
    try:
        return signature_of(path)
    except FileNotFoundError:
        return None
