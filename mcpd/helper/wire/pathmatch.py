"""Lexical path cleaning (docs/REFERENCE.md §4.3): a path is judged as a tuple of components, never as a
string. :func:`clean_path` cleans a request path lexically (``/var/log/../../etc/shadow`` →
``/etc/shadow``) and refuses relative paths and NUL bytes; grant entries are matched against the
path's components (:func:`mcpd.common.grantmatch.components`) by :mod:`mcpd.common.grantmatch`.
"""

from __future__ import annotations

import posixpath


class PathError(ValueError):
    """A request path or grant entry that cannot be judged (message says why)."""


def clean_path(path: str) -> str:
    """Clean an absolute request path lexically (docs/REFERENCE.md §4.3).

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

