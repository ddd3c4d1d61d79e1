"""Folders a privileged process keeps state in, opened so no other account can redirect them."""

from __future__ import annotations

import os
import stat


def safe_folder(path: str, owner: int = 0, leaf_mask: int = 0o077, create: bool = True) -> int:
    """Open a state folder and return a descriptor (``O_RDONLY|O_DIRECTORY``: files are opened
    relative to it, it can be listed and locked), creating it 0700 for ``owner`` when missing and
    ``create`` (as root: ``fchown`` on the descriptor of the folder just made, never by path).

    Used for the policy process's state and audit folders (root prepares them, the policy opens
    them), and ``mcpd dev``'s state folder when run as root. Every folder above the leaf must be
    owned by root and not writable by group or others (a sticky folder such as ``/tmp``
    excepted), so no path inside can be changed by another account (SPEC §4.5a). Each level is
    opened with ``O_NOFOLLOW`` relative to the one above.

    Args:
        path: the folder.
        owner: the uid that must own the folder itself.
        leaf_mask: mode bits the folder itself must not have (default: it must be 0700).
        create: make the folder when it is missing.

    Raises:
        OSError: a level is a symlink, is not a folder, or fails the owner/mode check.
    """
    names = [p for p in os.path.abspath(path).split("/") if p]
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        for i, name in enumerate(names):
            flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
            try:
                nfd = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o700, dir_fd=fd)
                nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                if i == len(names) - 1 and owner != os.geteuid():
                    os.fchown(nfd, owner, -1)
            os.close(fd)
            fd, st = nfd, os.fstat(nfd)
            leaf = i == len(names) - 1
            if st.st_uid != (owner if leaf else 0) or not leaf and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
                raise OSError(f"{path}: {name} must be owned by uid {owner if leaf else 0} and not writable by others")
        if os.fstat(fd).st_mode & leaf_mask:
            raise OSError(f"{path}: must be mode 0700" if leaf_mask == 0o077 else
                          f"{path}: must not be writable by group or others")
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)
