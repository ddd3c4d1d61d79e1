"""``files/list``: a directory's entries, or one non-directory entry.

The walk is :func:`mcpd.core.walk.walk_list` (descriptor-relative, hidden names included, sorted
by name, symlinks shown as links with their target, never followed; on the privileged route every
entry filtered by ``ctx.allow`` before anything about it is kept); the formatting is
:func:`mcpd.core.fileops.format_list`.
"""

from __future__ import annotations

from typing import Any

from mcpd.core.fileops import Context, format_list
from mcpd.core.walk import LIST_LIMIT, parse_list_args, walk_list

__all__ = ["format_list", "list_path", "op_list"]


def list_path(path: str, ctx: Context, limit: int = LIST_LIMIT) -> dict[str, Any]:
    """List ``path``: a directory's entries, or the one entry ``path`` names.

    Args:
        path: absolute path of a directory (listed) or of any other entry (described alone;
            a symlink is described as a link, not followed).
        ctx: the op context (``open_dir``, optional ``allow`` filter).
        limit: at most this many entries are returned (1..10000).

    Returns:
        :func:`mcpd.core.fileops.format_list`'s dict (``path``, ``kind``, ``entries``, ``total``,
        ``truncated``, ``note``); ``total`` counts the visible entries.

    Raises:
        ToolError: ``FILE_NOT_FOUND``, ``PERMISSION_DENIED`` (kernel refusal, or on the
            privileged route an entry outside the grant), or the opener's own error.
    """
    return format_list(walk_list({"path": path, "limit": limit}, ctx.open_dir, ctx.allow))


def op_list(args: Any, ctx: Context) -> dict[str, Any]:
    """The ``files/list`` op handler: validates ``args`` again (the op trusts no caller).

    Raises:
        ToolError: ``INVALID_ARGUMENT`` from ``parse_list_args``, or :func:`list_path`'s.
    """
    return format_list(walk_list(parse_list_args(args), ctx.open_dir, ctx.allow))
