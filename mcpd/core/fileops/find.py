"""``files/find``: search a tree by name glob, type and depth.

The walk is :func:`mcpd.core.walk.walk_find` (depth first over directory descriptors,
subdirectories opened relative to their parent with ``O_NOFOLLOW`` unless ``follow_symlinks`` on
the unprivileged route, loops detected, unreadable directories reported in ``errors``, stopped at
``max_results`` or the time budget); the formatting is :func:`mcpd.core.fileops.format_find`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mcpd.core.fileops import Context, format_find, progress_of
from mcpd.core.walk import parse_find_args, walk_find

__all__ = ["FindQuery", "find", "format_find", "op_find"]


@dataclass
class FindQuery:
    """What to look for. ``max_depth``: levels below root (1 = root's entries);
    ``time_budget`` in seconds."""

    name: str | None = None
    type: str | None = None
    max_depth: int | None = None
    max_results: int = 1000
    time_budget: float = 10.0
    follow_symlinks: bool = False


def find(root: str, ctx: Context, query: FindQuery) -> dict[str, Any]:
    """Find entries below ``root`` matching ``query``.

    Args:
        root: absolute path of the directory to search (opened with ``ctx.open_dir``).
        ctx: the op context; ``ctx.allow`` (privileged route) filters every entry shown and
            every directory entered; ``progress`` (optional) is called every
            :data:`mcpd.core.walk.PROGRESS_EVERY` entries with ``(entries_seen, None, message)``.
        query: name glob (per name, ``fnmatch.fnmatchcase``), type, depth, caps.

    Returns:
        :func:`mcpd.core.fileops.format_find`'s dict; matches are sorted by path, component by
        component.

    Raises:
        ToolError: the root cannot be opened (the opener's error), or ``follow_symlinks`` was
            asked on the privileged route (``INVALID_ARGUMENT``; docs/REFERENCE.md §4.4 follows no symlink).
    """
    args = {
        "root": root,
        "name": query.name,
        "type": query.type,
        "max_depth": query.max_depth,
        "max_results": query.max_results,
        "time_budget_seconds": query.time_budget,
        "follow_symlinks": query.follow_symlinks,
    }
    return format_find(walk_find(args, ctx.open_dir, ctx.allow, progress_of(ctx)))


def op_find(args: Any, ctx: Context) -> dict[str, Any]:
    """The ``files/find`` op handler: validates ``args`` again (the op trusts no caller).

    Raises:
        ToolError: ``INVALID_ARGUMENT`` from ``parse_find_args``, or :func:`find`'s.
    """
    return format_find(walk_find(parse_find_args(args), ctx.open_dir, ctx.allow, progress_of(ctx)))
