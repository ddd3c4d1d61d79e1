"""What root's opener refuses about the inode a granted path resolves to, as a pure judgement.

Root's opener (:mod:`mcpd.helper.wire.opener`) applies :func:`refusal` to the descriptor it resolved;
``mcpd grants test`` applies it to what ``lstat`` finds on the host, so its prediction and the
opener cannot drift apart. The reasons are the ``reason`` of the opener's ``PERMISSION_DENIED``
(:data:`SYMLINK`, :data:`HARD_LINKS`, :data:`CHANGED`) or the message of its
``NOT_A_REGULAR_FILE`` (:data:`NOT_DIR`, :data:`NOT_REGULAR`).
"""

import stat

SYMLINK = "symlink in path"
HARD_LINKS = "file has several hard links"
CHANGED = "path changed while opening"
NOT_DIR = "not a directory"
NOT_REGULAR = "not a regular file"


def refusal(mode: int, nlink: int, want: str) -> str | None:
    """Why the opener refuses an inode of ``st_mode`` ``mode`` with ``nlink`` links, or ``None``.

    ``want``: ``"dir"`` (a directory is needed), ``"file"`` (a regular file with exactly one
    link: a second link could be outside the grant; none means it was removed meanwhile) or
    ``"any"`` (a regular file as for ``"file"``; any other kind is described, never opened).
    """
    if want == "dir":
        return None if stat.S_ISDIR(mode) else NOT_DIR
    if not stat.S_ISREG(mode):
        return None if want == "any" else NOT_REGULAR
    return None if nlink == 1 else CHANGED if nlink == 0 else HARD_LINKS
