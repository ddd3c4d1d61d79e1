"""Directory and metadata operations: ``files/list``, ``files/find``, ``files/filetype``.

These ops run inside a worker (the caller's OS account, the kernel judges) or inside the root
helper's privileged child (the grant judges, through ``ctx.allow``). They never open a path a
client named except through the context's openers (``ctx.open_dir``, ``ctx.open_file``); below a
directory descriptor they work relative to it (``os.scandir(fd)``, ``os.stat(name, dir_fd=fd,
follow_symlinks=False)``, ``os.open(name, O_NOFOLLOW, dir_fd=fd)``), so no symlink is followed
unless the caller asked for it on the unprivileged route.

Privileged filtering rule (SPEC §4): every entry an op would show is passed to ``ctx.allow``
first; an entry it refuses is not shown at all, not even its name. ``files/find`` descends into a
directory only when ``ctx.allow`` covers that directory (the starting directory is always
scanned, its entries filtered), so a grant such as ``/etc/nginx/*.conf`` can be searched from
``/etc/nginx`` but a search from ``/`` does not reach a grant on ``/var/log``.
"""

from __future__ import annotations

import grp
import os
import posixpath
import pwd
import stat
from collections.abc import Callable
from datetime import datetime, timezone
from functools import lru_cache
from typing import Protocol

from mcpd.common.errors import PERMISSION_DENIED, ToolError, from_oserror

ProgressFn = Callable[[int, "int | None", str], None]

#: Entry type names shared by list, find and filetype (and the ``type`` argument of find).
TYPE_NAMES = ("file", "dir", "symlink", "fifo", "socket", "char", "block")

#: Bytes of a regular file that ``files/filetype`` reads and judges (64 KiB).
SAMPLE_BYTES = 64 * 1024


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


_TYPE_TESTS = (
    (stat.S_ISREG, "file"),
    (stat.S_ISDIR, "dir"),
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "char"),
    (stat.S_ISBLK, "block"),
)


def type_name(mode: int) -> str:
    """Map an ``st_mode`` to one of :data:`TYPE_NAMES` (``"unknown"`` for anything else)."""
    for test, name in _TYPE_TESTS:
        if test(mode):
            return name
    return "unknown"


def clean(path: str) -> str:
    """Drop trailing slashes (``/var/log/`` → ``/var/log``); ``/`` stays ``/``."""
    stripped = path.rstrip("/")
    return stripped or "/"


def join(directory: str, name: str) -> str:
    """Join a directory path and an entry name (``/`` + ``x`` → ``/x``)."""
    return posixpath.join(directory, name)


def allowed(ctx: Context, path: str) -> bool:
    """True when the route has no filter (unprivileged) or ``ctx.allow(path)`` covers ``path``."""
    return ctx.allow is None or bool(ctx.allow(path))


def no_grant(path: str) -> ToolError:
    """The SPEC §4.1 refusal for a path outside the grant."""
    return ToolError(
        PERMISSION_DENIED, f"permission denied: {path}", path=path, reason="no grant covers this path"
    )


def close_quietly(fd: int) -> None:
    """Close a descriptor, ignoring errors (cleanup paths only)."""
    try:
        os.close(fd)
    except OSError:
        pass


def lstat_path(ctx: Context, path: str) -> tuple[os.stat_result, str | None]:
    """``lstat`` of ``path``'s last component and its link target, without following it.

    Args:
        ctx: the op context; the parent directory is opened with ``ctx.open_dir``.
        path: an absolute path (trailing slashes ignored).

    Returns:
        ``(stat_result, target)`` where ``target`` is the symlink's target text or None.

    Raises:
        ToolError: the parent cannot be opened (its code), or the entry is missing
            (``FILE_NOT_FOUND``) or unreadable (``PERMISSION_DENIED``).

    On the unprivileged route, when the parent directory may be searched but not read
    (mode ``0711``), this falls back to ``os.lstat(path)``: the worker runs with the caller's
    own rights, so the kernel still decides.
    """
    path = clean(path)
    if path == "/":
        return os.lstat("/"), None
    parent, name = posixpath.split(path)
    try:
        dfd = ctx.open_dir(parent)
    except ToolError as exc:
        if ctx.allow is not None or exc.code != PERMISSION_DENIED:
            raise
        try:
            st = os.lstat(path)
            return st, (os.readlink(path) if stat.S_ISLNK(st.st_mode) else None)
        except OSError as err:
            raise from_oserror(err, path) from None
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        target = os.readlink(name, dir_fd=dfd) if stat.S_ISLNK(st.st_mode) else None
        return st, target
    except OSError as err:
        raise from_oserror(err, path) from None
    finally:
        os.close(dfd)


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
    """A POSIX timestamp (seconds) as ISO 8601 UTC, e.g. ``2026-05-09T07:35:25Z``."""
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def describe(name: str, st: os.stat_result, target: str | None) -> dict[str, object]:
    """One listing entry (SPEC-less issue 4 shape) from an ``lstat`` result.

    Returns ``{"name", "type", "size" (bytes), "mode" ("0640"), "permissions" ("-rw-r-----"),
    "owner", "group", "mtime" (ISO 8601 UTC)}`` plus ``"target"`` for a symlink.
    """
    entry: dict[str, object] = {
        "name": name,
        "type": type_name(st.st_mode),
        "size": st.st_size,
        "mode": format(stat.S_IMODE(st.st_mode), "04o"),
        "permissions": stat.filemode(st.st_mode),
        "owner": user_name(st.st_uid),
        "group": group_name(st.st_gid),
        "mtime": iso_utc(st.st_mtime),
    }
    if target is not None:
        entry["target"] = target
    return entry
