"""Folders a privileged process keeps state in, opened so no other account can redirect them, and
the small files in them, replaced whole (:func:`write_file`) and read back checked (:func:`read_file`)."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def safe_folder(path: str, owner: int = 0, leaf_mask: int = 0o077, create: bool = True) -> int:
    """Open a state folder and return a descriptor (``O_RDONLY|O_DIRECTORY``: files are opened
    relative to it, it can be listed and locked), creating it 0700 for ``owner`` when missing and
    ``create`` (as root: ``fchown`` on the descriptor of the folder just made, never by path).

    Used for the policy process's state and audit folders (root prepares them, the policy opens
    them), and ``mcpd dev``'s state folder when run as root. Every folder above the leaf must be
    owned by root and not writable by group or others (a sticky folder such as ``/tmp``
    excepted), so no path inside can be changed by another account (docs/REFERENCE.md §4.5a). Each level is
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


def write_file(dirfd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """Replace ``name`` in the folder ``dirfd``: a fresh file (``O_EXCL``) of ``mode`` (0600
    unless told, whatever the umask) owned by the folder's owner, fsync, rename.

    Raises:
        OSError: the write failed (nothing replaced).
    """
    tmp, owner = f".{name}.{secrets.token_hex(4)}", os.fstat(dirfd).st_uid
    try:
        with os.fdopen(os.open(tmp, _NEW, 0o600, dir_fd=dirfd), "wb") as f:
            os.fchmod(f.fileno(), mode)
            if owner != os.geteuid():  # root (mcpd users unlock) writing the policy's folder: its file
                os.fchown(f.fileno(), owner, -1)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dirfd)


def read_file(dirfd: int, name: str) -> bytes | None:
    """The content of ``name`` in ``dirfd`` (at most 1 MiB), ``None`` when missing.

    Raises:
        OSError: a symlink, or not a regular file of the folder's owner with mode 0600.
    """
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.fstat(dirfd).st_uid or st.st_mode & 0o077:
            raise OSError(f"{name}: must be a regular file of the folder's owner with mode 0600")
        return f.read(1 << 20)
