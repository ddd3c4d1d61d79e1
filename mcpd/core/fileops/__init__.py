"""Directory and metadata operations: ``files/list``, ``files/find``, ``files/filetype``.

The walking of ``files/list`` and ``files/find`` is :mod:`mcpd.core.walk` (the one walker, also
run by the privileged walker ``mcpd-walk``, CAP_DAC_READ_SEARCH only); it returns raw results (names and ``lstat``
numbers). This package turns them into the tools' results: :func:`format_list` and
:func:`format_find` (owner and group names, ``"0640"``/``"-rw-r-----"`` modes, ISO 8601 times,
notes), run in the worker for the unprivileged route and in the front for the raw results the
policy process sends back from the walker. ``files/filetype`` (:mod:`.filetype`) reads content and therefore never
runs as root.

Privileged filtering rule (docs/REFERENCE.md §4): every entry an op would show is passed to ``ctx.allow``
first; an entry it refuses is not shown at all, not even its name. ``files/find`` descends into a
directory only when ``ctx.allow`` covers that directory (the starting directory is always
scanned, its entries filtered), so a grant such as ``/etc/nginx/*.conf`` can be searched from
``/etc/nginx`` but a search from ``/`` does not reach a grant on ``/var/log``.
"""

from __future__ import annotations

import grp
import pwd
import stat
from collections.abc import Callable
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Protocol

from mcpd.common.config import SAMPLE_BYTES
from mcpd.common.typenames import TYPE_NAMES, type_name
from mcpd.core.walk import LIST_MAX, clean, no_grant

__all__ = [
    "SAMPLE_BYTES", "TYPE_NAMES", "Context", "allowed", "clean", "describe", "format_find", "format_list",
    "group_name", "iso_utc", "no_grant", "progress_of", "type_name", "user_name",
]

ProgressFn = Callable[[int, "int | None", str], None]

class Context(Protocol):
    """The part of ``mcpd.core.ops.OpContext`` these ops use (structural, see docs/INTERNALS.md)."""

    @property
    def open_file(self) -> Callable[[str], int]: ...

    @property
    def open_dir(self) -> Callable[[str], int]: ...

    @property
    def allow(self) -> Callable[[str], bool] | None: ...


def progress_of(ctx: object) -> ProgressFn | None:
    """The context's optional progress callback ``(done, total | None, message)``, or None."""
    fn = getattr(ctx, "progress", None)
    return fn if callable(fn) else None


def allowed(ctx: Context, path: str) -> bool:
    """True when the route has no filter (unprivileged) or ``ctx.allow(path)`` covers ``path``."""
    return ctx.allow is None or bool(ctx.allow(path))


@lru_cache(maxsize=1024)
def user_name(uid: int) -> str:
    """The account name of ``uid``, or the number as text when it has no name."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@lru_cache(maxsize=1024)
def group_name(gid: int) -> str:
    """The group name of ``gid``, or the number as text when it has no name."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def iso_utc(seconds: float) -> str:
    """A POSIX timestamp (seconds) as ISO 8601 UTC, e.g. ``2026-05-09T07:35:25Z`` (a time no
    calendar date can hold, such as 2**62, is given as the number of seconds)."""
    try:
        return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):
        return str(seconds)


def describe(raw: dict[str, Any]) -> dict[str, Any]:
    """One listing entry from a raw entry of :func:`mcpd.core.walk.raw_entry`.

    Returns ``{"name", "type", "size" (bytes), "mode" ("0640"), "permissions" ("-rw-r-----"),
    "owner", "group", "mtime" (ISO 8601 UTC, whole seconds)}`` plus ``"target"`` for a symlink.
    """
    mode = raw["mode"]
    entry: dict[str, Any] = {
        "name": raw["name"],
        "type": type_name(mode),
        "size": raw["size"],
        "mode": format(stat.S_IMODE(mode), "04o"),
        "permissions": stat.filemode(mode),
        "owner": user_name(raw["uid"]),
        "group": group_name(raw["gid"]),
        "mtime": iso_utc(raw["mtime_ns"] // 1_000_000_000),
    }
    if "target" in raw:
        entry["target"] = raw["target"]
    return entry


def format_list(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``files/list`` result from :func:`mcpd.core.walk.walk_list`'s raw result.

    Returns:
        ``{"path", "kind": "directory" | "entry", "entries": [describe(...)], "total": int,
        "truncated": bool, "note": str | None}``; the note says how many entries were left out,
        or, for a symlink listed alone, that its target must be listed to see inside it.
    """
    path, total, limit = raw["path"], raw["total"], raw["limit"]
    entries = [describe(e) for e in raw["entries"]]
    truncated = raw["kind"] == "directory" and total > limit
    note = None
    if truncated:
        note = (
            f"showing the first {limit} of {total} entries (sorted by name); "
            f"{total - limit} were left out: call again with a larger limit (max {LIST_MAX}) "
            "or use files/find with a name pattern"
        )
    elif raw["kind"] == "entry" and entries and entries[0].get("target"):
        note = f"{path} is a symlink to {entries[0]['target']}; list the target to see its entries"
    return {"path": path, "kind": raw["kind"], "entries": entries, "total": total, "truncated": truncated, "note": note}


def format_find(raw: dict[str, Any]) -> dict[str, Any]:
    """The ``files/find`` result from :func:`mcpd.core.walk.walk_find`'s raw result.

    Returns:
        ``{"root", "matches": [{"path", "type"}], "truncated": bool, "stopped": None |
        "max_results" | "time_budget", "scanned": int, "errors": [{"path", "reason"}],
        "error_count": int}``.
    """
    return {
        "root": raw["root"],
        "matches": raw["matches"],
        "truncated": raw["stopped"] is not None,
        "stopped": raw["stopped"],
        "scanned": raw["scanned"],
        "errors": raw["errors"],
        "error_count": raw["error_count"],
    }
