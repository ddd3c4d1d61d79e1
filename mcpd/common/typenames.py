"""The short file-type names of ``files/list``, ``files/find`` and ``files/filetype``.

They are the second column of the one file-type table (:data:`mcpd.helper.wire.filekind.TABLE`),
whose third column root's opener uses for ``NOT_A_REGULAR_FILE``'s ``details.type``; only the
unprivileged readers (workers, the walker's metadata walk) name types this way.
"""

from __future__ import annotations

from mcpd.helper.wire.filekind import TABLE

TYPE_NAMES = tuple(short for _, short, _ in TABLE)  # file, dir, symlink, fifo, socket, char, block


def type_name(mode: int) -> str:
    """The short name (one of :data:`TYPE_NAMES`) of an ``st_mode``; ``unknown`` for anything else."""
    return next((short for test, short, _ in TABLE if test(mode)), "unknown")
