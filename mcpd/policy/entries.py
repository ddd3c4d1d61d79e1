"""Component-wise grant entry matching (SPEC §4.3).

A path is judged as a tuple of components (:func:`mcpd.helper.wire.pathmatch.components`), never as a
string, so ``/srv/app`` can never match ``/srv/app-evil`` and no glob can match a ``/``:

* :func:`split_entry` checks a grant entry (absolute, already normalised, ``**`` only as a whole
  component) and returns its components.
* :func:`entry_covers` says whether an entry covers a path: the entry matches the path itself or
  one of its ancestors. ``*``, ``?`` and ``[...]`` match within one component
  (``fnmatch.fnmatchcase`` on single components only); ``**`` matches zero or more whole
  components.
"""

from __future__ import annotations

import fnmatch

from mcpd.helper.wire.pathmatch import PathError, clean_path, components

_GLOB_CHARS = frozenset("*?[")


def split_entry(entry: str) -> tuple[str, ...]:
    """Validate a grant entry and return its components.

    Raises:
        PathError: relative, not normalised (``..``, ``.``, ``//``, trailing ``/``), NUL byte, or
            ``**`` mixed with other characters inside one component.
    """
    if not entry.startswith("/") and "\0" not in entry:
        raise PathError(f"path {entry!r} must be absolute")
    cleaned = clean_path(entry)
    if cleaned != entry:
        raise PathError(f"path {entry!r} is not normalised (write {cleaned!r})")
    parts = components(entry)
    if any("**" in part and part != "**" for part in parts):
        raise PathError(f"path {entry!r}: '**' must be a whole component")
    return parts


def _component_matches(pattern: str, name: str) -> bool:
    return pattern == name if _GLOB_CHARS.isdisjoint(pattern) else fnmatch.fnmatchcase(name, pattern)


def entry_covers(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Whether an entry (components of :func:`split_entry`) covers a path (its components).

    The entry covers the path when it matches the path or any ancestor of it. ``reach`` holds
    the path positions where the pattern consumed so far may end; time O(len(pattern) x len(path)).
    """
    reach = {0}
    for part in pattern:
        if part == "**":
            reach = set(range(min(reach), len(path) + 1))
        else:
            reach = {j + 1 for j in reach if j < len(path) and _component_matches(part, path[j])}
        if not reach:
            return False
    return True


def entry_covers_root(pattern: tuple[str, ...]) -> bool:
    """Whether an entry covers ``/`` itself, hence every path (``/``, ``/**``)."""
    return entry_covers(pattern, ())
