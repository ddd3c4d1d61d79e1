"""The hash chain of an audit log, as its writer continues it and ``mcpd audit`` reads it back.

Every record starts with ``seq`` (1, 2, 3 ...) and ``prev``, the SHA-256 (hex) of the previous
record's exact bytes, its newline included (:data:`GENESIS` for the first record ever), across
rotation too (docs/REFERENCE.md §7.2). The first record of every new file is a :data:`ROTATE`
record numbering it (``file_number``), so the reader can tell how many older files there were. A
writer that finds records it wrote gone records a :data:`LOST_TAIL` alert. This module holds the
rules both sides share (the hash, the number, where a file's chain ends); the writer is
:mod:`mcpd.common.audit.writer`, the reader :mod:`mcpd.admin.audit.verify`.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

GENESIS = "0" * 64  # ``prev`` of the first record of a chain
#: the ``reason`` of the alert a writer records when its log no longer ends with the last record
#: it wrote (cut, emptied or replaced); ``missing_from``/``missing_to`` name the records gone
#: (``missing_from`` null when where the loss begins is not known), ``found_seq`` the last record
#: the log still held (0: none). The access log's writer says ``access log`` (:func:`lost_reason`).
LOST_TAIL = "the audit log lost records its writer had written"
#: the ``event`` of the first record of every new file of a log (a rotation by rename, or a file
#: created again after it was removed): ``file_number`` counts the log's files (1 is the file its
#: first record went to; null when the file before this one had no number: a log begun before
#: files were numbered), so ``mcpd audit verify`` can tell how many older files there were
ROTATE = "rotate"


def record_hash(data: bytes) -> str:
    """The link to a record: SHA-256 (hex) of its exact bytes ``data``, newline included; the
    ``prev`` of the record after it."""
    return hashlib.sha256(data).hexdigest()


def record_seq(rec: Any) -> int | None:
    """The ``seq`` of the parsed record ``rec`` when it is an integer (a boolean is not), else
    None (no object, no number)."""
    seq = rec.get("seq") if isinstance(rec, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def tail_of(fd: int, size: int, block: int = 65536) -> tuple[bytes, bytes]:
    """The end of the open file ``fd``'s first ``size`` bytes: ``(line, partial)``, its last whole
    line (newline included; ``b""`` when it has none) and the bytes after it that no newline ends
    (a torn record; ``b""`` as a rule)."""
    pos, found = size, b""
    while pos > 0:
        step = min(block, pos)
        pos -= step
        found = os.pread(fd, step, pos) + found
        end = found.rfind(b"\n")
        if end < 0:
            continue
        start = found.rfind(b"\n", 0, end)
        if start >= 0 or pos == 0:
            return found[start + 1:end + 1], found[end + 1:]
    return b"", found


def holds_record(fd: int, size: int, end: int, length: int, digest: str) -> bool:
    """Whether the open file ``fd`` (``size`` bytes long) still holds, byte for byte, the record
    of ``length`` bytes ending at offset ``end`` whose :func:`record_hash` is ``digest``."""
    return size >= end and record_hash(os.pread(fd, length, end - length)) == digest


def chain_after(line: bytes) -> tuple[int, str]:
    """``(seq, hash)`` a record written after ``line`` continues from: the line's ``seq`` (0 when
    it has none or is empty) and its :func:`record_hash` (:data:`GENESIS` for no line at all)."""
    if not line:
        return 0, GENESIS
    try:
        seq = record_seq(json.loads(line))
    except (ValueError, RecursionError):  # (nested too deeply: no record either)
        seq = None
    return (0 if seq is None else seq), record_hash(line)


def first_line(fd: int, block: int = 65536) -> bytes:
    """The first line (newline included) of the open file ``fd``, read from offset 0 (``b""``
    when empty; the whole first ``block`` bytes when no newline ends them)."""
    data = os.pread(fd, block, 0)
    end = data.find(b"\n")
    return data if end < 0 else data[:end + 1]


def file_number(first: bytes) -> int | None:
    """The number of the log file whose first line is ``first`` (:func:`file_number_of` of it
    parsed; None when it is no JSON)."""
    try:
        rec = json.loads(first)
    except (ValueError, RecursionError):
        return None
    return file_number_of(rec)


def file_number_of(rec: Any) -> int | None:
    """The number of the log file whose first record is ``rec`` (parsed; see :data:`ROTATE`): its
    ``file_number`` when it is a rotate record, 1 when it is the chain's first record (seq 1),
    else None (unknown, or no object)."""
    if not isinstance(rec, dict):
        return None
    number = rec.get("file_number") if rec.get("event") == ROTATE else 1 if rec.get("seq") == 1 else None
    return number if type(number) is int and number >= 1 else None


def lost_reason(ident: str) -> str:
    """The :data:`LOST_TAIL` reason as the writer named ``ident`` words it (``mcpd-access``: the
    access log; any other: the audit log)."""
    return LOST_TAIL.replace("audit log", "access log") if ident == "mcpd-access" else LOST_TAIL
