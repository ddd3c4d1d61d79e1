"""The readable line of one ``files/list`` entry, like ``ls -l``: the tool's text content and
``linuxctl list files`` both write it with :func:`entry_line`, so the two never differ in layout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def entry_line(entry: dict[str, Any], show: Callable[[str], str] = str) -> str:
    """``permissions owner group size mtime name`` (``name -> target`` for a symlink).

    Args:
        entry: one entry of the ``files/list`` result (``permissions``, ``owner``, ``group``,
            ``size``, ``mtime``, ``name``, optional ``target``).
        show: how each field's text is rendered: :class:`str` as it is (the tool's text), or
            :func:`mcpd.common.printable.printable` for a terminal (a name may hold a newline).
    Raises:
        KeyError: a field is missing.
    """
    name = show(str(entry["name"]))
    if "target" in entry:
        name += f" -> {show(str(entry['target']))}"
    return (f"{show(str(entry['permissions']))} {show(str(entry['owner'])):<8} {show(str(entry['group'])):<8} "
            f"{show(str(entry['size'])):>12} {show(str(entry['mtime']))} {name}")
