"""The ``grep -rn`` lines of a ``files/grep`` result: the tool's text content and ``linuxctl grep``
both write them with :func:`grep_lines`, so the two never differ in layout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def grep_lines(matches: list[dict[str, Any]], show: Callable[[str], str] = str,
               show_text: Callable[[str], str] | None = None) -> list[str]:
    """``grep -rn`` lines of ``matches`` (``PATH:LINE:TEXT``; context lines ``PATH-LINE-TEXT``,
    each line once, ``--`` between groups that do not touch), in their order.

    Args:
        matches: the ``matches`` of a ``files/grep`` result (``path``, ``line``, ``text``, and
            ``before``/``after`` lists of texts).
        show: how each path and text is rendered: :class:`str` as it is (the tool's text), or
            :func:`mcpd.common.printable.printable` for a terminal.
        show_text: how each line's text is rendered, when not as ``show``.
    """
    shown = show if show_text is None else show_text
    lines: list[str] = []
    last: tuple[str, int] | None = None  # (path, line) printed last
    context = any("before" in m for m in matches)
    hits = {(m["path"], m["line"]) for m in matches}
    for m in matches:
        path, at = m["path"], m["line"]
        before = m.get("before", [])
        first = at - len(before)
        if context and last is not None and (last[0] != path or last[1] < first - 1):
            lines.append("--")
        for i, text in enumerate(before):
            n = first + i
            if last is None or last[0] != path or n > last[1]:
                mark = ":" if (path, n) in hits else "-"
                lines.append(f"{show(path)}{mark}{n}{mark}{shown(text)}")
                last = (path, n)
        if last is None or last[0] != path or at > last[1]:
            lines.append(f"{show(path)}:{at}:{shown(m['text'])}")
            last = (path, at)
        assert last is not None
        for i, text in enumerate(m.get("after", [])):
            n = at + 1 + i
            if last[0] != path or n > last[1]:
                mark = ":" if (path, n) in hits else "-"
                lines.append(f"{show(path)}{mark}{n}{mark}{shown(text)}")
                last = (path, n)
    return lines
