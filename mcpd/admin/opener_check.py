"""What root's opener would do with a granted path as the host is now, for ``mcpd grants test``:
the opener's own checks (no symlink in the path, one hard link, the kind the tool needs, the path
unchanged while opening, the fixed deny on a followed path), made with ``lstat`` and an ``O_PATH``
descriptor, so nothing is read and no driver runs.
"""

from __future__ import annotations

import os
import stat

from mcpd.common.grantmatch import SECRET, Policy, is_secret
from mcpd.helper.wire.filekind import kind as file_kind
from mcpd.helper.wire.openrules import CHANGED, NOT_DIR, NOT_REGULAR, SYMLINK, refusal
from mcpd.helper.wire.pathmatch import components

#: what root's opener needs of the inode, per tool: files/read a regular file, files/filetype any
#: kind (a regular file with one link), files/find a directory, files/list a directory or one
#: entry described alone, files/grep a directory (its walker's) or a regular file searched alone
OPEN_WANT = {"files/read": "file", "files/filetype": "any", "files/find": "dir", "files/list": "list",
             "files/grep": "grep"}


def predict_open(policy: Policy, path: str, tool: str, follow: bool) -> str | None:
    """Why root's opener would refuse the granted ``path`` for ``tool`` as the host is now, or
    ``None`` when it would open it; the same checks, made with ``lstat`` (so nothing is opened
    but an ``O_PATH`` descriptor, which runs no driver and reads nothing).

    Args:
        policy: the grants (for the fixed deny checked on a followed path's real path).
        path: the decided path (cleaned, absolute).
        tool: one of :data:`OPEN_WANT`.
        follow: the grant covers ``/`` (symlinks are followed; the real path is checked instead).
    Returns:
        the opener's reason (``symlink in path``, ``file has several hard links``, ``path changed
        while opening``, ``not a regular file (fifo)``, ``not a directory (regular file)``, the
        fixed deny's), or ``None``.
    Raises:
        FileNotFoundError, NotADirectoryError: nothing is there to judge.
        OSError: the path could not be looked at (``PermissionError`` when not run as root).
    """
    want = OPEN_WANT[tool]
    if follow:
        st = os.stat(path)
        if tool in ("files/read", "files/filetype", "files/grep") and is_secret(policy, os.path.realpath(path)):
            return SECRET
    else:
        prefix, st = "", os.lstat("/")
        for part in components(path):
            prefix += "/" + part
            st = os.lstat(prefix)
            if stat.S_ISLNK(st.st_mode):
                return SYMLINK
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            now, real = os.fstat(fd), os.readlink(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or real != path:
            return CHANGED
    if want == "grep":
        want = "dir" if stat.S_ISDIR(st.st_mode) else "file"
    why = refusal(st.st_mode, st.st_nlink, "dir" if want == "list" else want)
    if want == "list" and why == NOT_DIR:
        return None  # a path that is not a directory is described alone
    return f"{why} ({file_kind(st.st_mode)})" if why in (NOT_DIR, NOT_REGULAR) else why
