"""Lexical path cleaning and component-wise grant matching (SPEC §4.3).

A path is judged as a tuple of components, never as a string, so ``/srv/app`` can never match
``/srv/app-evil`` and no glob can match a ``/``:

* :func:`clean_path` cleans a request path lexically (``/var/log/../../etc/shadow`` →
  ``/etc/shadow``) and refuses relative paths and NUL bytes.
* :func:`split_entry` checks a grant entry (absolute, already normalised, ``**`` only as a whole
  component) and returns its components.
* :func:`entry_covers` says whether an entry covers a path: the entry matches the path itself or
  one of its ancestors. ``*``, ``?`` and ``[...]`` match within one component
  (``fnmatch.fnmatchcase`` on single components only); ``**`` matches zero or more whole
  components.
"""

from __future__ import annotations

import fnmatch, posixpath  # noqa: E401 (root side's line budget)

_GLOB_CHARS = frozenset("*?[")


class PathError(ValueError):
    """A request path or grant entry that cannot be judged (message says why)."""


def clean_path(path: str) -> str:
    """Clean an absolute request path lexically (SPEC §4.3).

    Args:
        path: the path as the client sent it.

    Returns:
        The normalised absolute path (``posixpath.normpath`` with a leading ``//`` collapsed).

    Raises:
        PathError: not a string, empty, relative, or containing a NUL byte.
    """
    if not isinstance(path, str) or not path:
        raise PathError("path must be a non-empty string")
    if "\0" in path:
        raise PathError("path contains a NUL byte")
    if not path.startswith("/"):
        raise PathError("path must be absolute")
    return "/" + posixpath.normpath(path).lstrip("/")


def components(clean: str) -> tuple[str, ...]:
    """The components of an already cleaned absolute path (``/`` → ``()``)."""
    return tuple(part for part in clean.split("/") if part)


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
