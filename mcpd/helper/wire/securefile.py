"""Opening a root-owned configuration file once and checking the descriptor, as ``visudo -c`` does.

:func:`read_secure_file` opens the file once (no symlink followed at the leaf, never blocking) and
checks the *open descriptor* with ``fstat`` (:func:`check_secure_stat`): a regular file, owned by
root (or the owner given), neither group- nor world-writable, and at most ``max_bytes`` long. Root
reads ``mcpd.yaml`` this way; the other processes read every configuration file this way before
:mod:`mcpd.common.strictyaml` parses it (docs/REFERENCE.md §4.5).

Errors are :class:`ConfigFileError` whose ``errors`` are ``file:line: message`` strings. Messages
name keys and line numbers only; they never quote the file's text.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

MAX_CONFIG_BYTES = 1024 * 1024  # a grants or users file over 1 MiB is refused


class ConfigFileError(Exception):
    """A configuration file is unsafe, unreadable, not YAML or breaks its schema.

    Attributes:
        errors: one ``file:line: message`` string per problem (``file: message`` without a line).
    """

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = list(errors)


def check_secure_stat(st: os.stat_result, source: str, owner_uid: int = 0) -> None:
    """Refuse a file that root would be unwise to trust (docs/REFERENCE.md §4.5), from its ``fstat`` result.

    Args:
        st: ``os.fstat`` of the open descriptor.
        source: the file name for the messages.
        owner_uid: the required owner (0, root; development mode may pass its own uid).

    Raises:
        ConfigFileError: not a regular file, wrong owner, or group/world-writable.
    """
    if not stat.S_ISREG(st.st_mode):
        raise ConfigFileError([f"{source}: not a regular file"])
    if st.st_uid != owner_uid:
        who = "root" if owner_uid == 0 else f"uid {owner_uid}"
        raise ConfigFileError([f"{source}: not owned by {who} (owner uid {st.st_uid})"])
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        mode = stat.S_IMODE(st.st_mode)
        raise ConfigFileError([f"{source}: group- or world-writable (mode {mode:04o})"])


#: How :func:`read_secure_file` opens a file: ``os.open``, except in the policy process (not root),
#: which asks the root helper for the files only root may open (:mod:`mcpd.policy.main`).
open_file: Callable[[str, int], int] = os.open


def read_secure_file(path: str, owner_uid: int = 0, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """Open ``path`` once, check the descriptor (:func:`check_secure_stat`) and read it as UTF-8.

    Args:
        path: the file (a symlink as the last component is refused).
        owner_uid: the required owner uid.
        max_bytes: the largest accepted size, in bytes.

    Raises:
        ConfigFileError: cannot open, unsafe, too large, or not UTF-8.
    """
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = open_file(path, flags)
    except OSError as exc:
        raise ConfigFileError([f"{path}: cannot open: {exc.strerror}"]) from None
    try:
        check_secure_stat(os.fstat(fd), path, owner_uid)
        chunks: list[bytes] = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
            if sum(map(len, chunks)) > max_bytes:
                raise ConfigFileError([f"{path}: larger than {max_bytes} bytes"])
    except OSError as exc:
        raise ConfigFileError([f"{path}: cannot read: {exc.strerror}"]) from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigFileError([f"{path}: not UTF-8 (byte offset {exc.start})"]) from None
