"""The one file-type table (root, worker and front alike): an ``st_mode`` to its names.

Two spellings of the same seven types: the short one of ``files/list``, ``files/find`` and
``files/filetype`` (:func:`type_name`, :data:`TYPE_NAMES`) and the docs/REFERENCE.md §2.5 ``details.type`` of
``NOT_A_REGULAR_FILE`` (:func:`kind`: ``regular file``, ``char device`` ...).
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
TYPE_NAMES = tuple(short for _, short, _ in TABLE)  # file, dir, symlink, fifo, socket, char, block


def type_name(mode: int) -> str:
    """The short name (one of :data:`TYPE_NAMES`) of an ``st_mode``; ``unknown`` for anything else."""
    return next((short for test, short, _ in TABLE if test(mode)), "unknown")


def kind(mode: int) -> str:
    """The docs/REFERENCE.md §2.5 ``details.type`` of an ``st_mode``: ``regular file``, ``directory``, ``fifo``,
    ``socket``, ``char device``, ``block device``, ``symlink``; ``unknown`` for anything else."""
    return next((long for test, _, long in TABLE if test(mode)), "unknown")
