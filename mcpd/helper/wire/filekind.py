"""The one file-type table (root, worker and front alike): an ``st_mode`` to its names.

Two spellings of the same seven types: the short one of ``files/list``, ``files/find`` and
``files/filetype`` (:mod:`mcpd.common.typenames`, which only the unprivileged readers use) and the
docs/REFERENCE.md §2.5 ``details.type`` of ``NOT_A_REGULAR_FILE`` (:func:`kind`: ``regular file``,
``char device`` ...), which root's opener gives.
"""

from __future__ import annotations

import stat

#: (test, short name, docs/REFERENCE.md §2.5 name); the tests exclude each other (one ``S_IFMT`` value each).
TABLE = (
    (stat.S_ISREG, "file", "regular file"),
    (stat.S_ISDIR, "dir", "directory"),
    (stat.S_ISLNK, "symlink", "symlink"),
    (stat.S_ISFIFO, "fifo", "fifo"),
    (stat.S_ISSOCK, "socket", "socket"),
    (stat.S_ISCHR, "char", "char device"),
    (stat.S_ISBLK, "block", "block device"),
)


def kind(mode: int) -> str:
    """The docs/REFERENCE.md §2.5 ``details.type`` of an ``st_mode``: ``regular file``, ``directory``, ``fifo``,
    ``socket``, ``char device``, ``block device``, ``symlink``; ``unknown`` for anything else."""
    return next((long for test, _, long in TABLE if test(mode)), "unknown")
