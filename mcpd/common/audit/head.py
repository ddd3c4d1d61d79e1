"""The chain's head: where a log ended when its writer last wrote, kept outside the log.

The writer (:class:`mcpd.common.audit.writer.AuditLog`, given ``head_dir``, the policy process's
0700 state folder) keeps in :data:`HEAD_FILE` the ``seq``, hash, file (device, inode) and place
(end offset, length) of the record it wrote last: made with the atomic write of
:func:`mcpd.common.folders.write_file` on start, then rewritten in place by one ``pwrite`` of a
fixed-width line after each record. On start the writer checks that record is still where it
was written, and ``mcpd audit verify`` fails when the log ends before it (docs/REFERENCE.md §7.2).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time

from mcpd.common.audit.chain import GENESIS
from mcpd.common.audit.records import string_json
from mcpd.common.folders import read_file, safe_folder

HEAD_FILE = "audit.head"  # the writer's head state, in its own state folder


@dataclasses.dataclass(frozen=True)
class Head:
    """Where a log ended when its writer last wrote (the chain's head, kept outside the log):
    ``seq`` and ``hash`` (SHA-256 hex of its bytes) of that record, ``log`` the log's path,
    ``dev``/``ino`` the file it is in, ``end`` the offset just past it and ``length`` its size in
    bytes (0: no record yet)."""

    log: str
    seq: int
    hash: str
    dev: int
    ino: int
    end: int
    length: int

    def encode(self) -> bytes:
        """One JSON line padded with spaces to a width fixed by ``log`` alone, so every update
        of one log's head is one ``pwrite`` of the same size at offset 0."""
        return head_line(self.log, self.seq, self.hash, self.dev, self.ino, self.end, self.length)

    @classmethod
    def decode(cls, data: bytes) -> Head:
        """The head :meth:`encode` wrote.

        Raises:
            ValueError: not such a line (torn, edited or empty).
        """
        try:
            obj = json.loads(data)
        except RecursionError:
            raise ValueError("not an audit head (JSON nested too deeply)") from None
        if not isinstance(obj, dict) or set(obj) != {f.name for f in dataclasses.fields(cls)}:
            raise ValueError("not an audit head")
        head = cls(**obj)
        if not isinstance(head.log, str) or not isinstance(head.hash, str) or not all(
                type(getattr(head, k)) is int and getattr(head, k) >= 0 for k in ("seq", "dev", "ino", "end", "length")):
            raise ValueError("not an audit head")
        return head


def head_line(log: str, seq: int, digest: str, dev: int, ino: int, end: int, length: int) -> bytes:
    """A head as :meth:`Head.encode` writes it (written for every record: formatted, not encoded)."""
    name, width = _head_log(log)
    line = f'{{"log":{name},"seq":{seq},"hash":"{digest}","dev":{dev},"ino":{ino},"end":{end},"length":{length}}}'
    return line.encode("ascii").ljust(width - 1) + b"\n"


@functools.lru_cache(maxsize=8)
def _head_log(log: str) -> tuple[str, int]:
    """``log`` as a JSON string, and the width of every head line of it (the widest numbers, a newline)."""
    name, big = string_json(log), 10 ** 19  # wider than any seq, device, inode or offset
    return name, len(f'{{"log":{name},"seq":{big},"hash":"{GENESIS}","dev":{big},"ino":{big},"end":{big},'
                     f'"length":{big}}}') + 1


def read_head(dirfd: int, name: str = HEAD_FILE) -> Head | None:
    """The head state in the folder ``dirfd`` (``None`` when there is none), read a few times
    over while its writer may be updating it.

    Raises:
        OSError: not a 0600 regular file of the folder's owner (:func:`mcpd.common.folders.read_file`).
        ValueError: it holds no head.
    """
    for attempt in range(3):
        data = read_file(dirfd, name)
        if data is None:
            return None
        try:
            return Head.decode(data)
        except ValueError:
            if attempt == 2:
                raise
            time.sleep(0.01)  # a pwrite under way (a read may see it half done)
    raise AssertionError("unreachable")


def read_head_at(state_dir: str, name: str = HEAD_FILE) -> Head | None:
    """The head state the audit log's writer keeps in its state folder ``state_dir`` (a path;
    ``None`` when it keeps none there), as ``mcpd audit verify`` reads it.

    Raises:
        OSError: the folder or file is unsafe (a level another account can change, a symlink,
            not the folder owner's 0600 file) or unreadable.
        ValueError: the file holds no head.
    """
    fd = safe_folder(state_dir, owner=os.stat(state_dir).st_uid, create=False)
    try:
        return read_head(fd, name)
    finally:
        os.close(fd)
