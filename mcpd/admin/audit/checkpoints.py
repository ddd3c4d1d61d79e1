"""Checkpoints a collector kept, read back and compared with the local log (docs/REFERENCE.md §7.3).

:func:`read_checkpoints` reads a file of them, one a line, in any of three forms: a journal
entry as ``journalctl -o json`` prints it (the ``MCPD_LOG``/``MCPD_CHECKPOINT_*`` fields, or a
``MESSAGE`` holding the checkpoint: the syslog copy journald took in), a syslog line as a
collector stores it (the ``mcpd checkpoint log=L seq=N hash=H`` part, wherever it stands), or
``{"log": L, "seq": N, "hash": H}``. The file is untrusted: a line that is none of these is a
:class:`CheckpointFileError` naming it. :class:`Lookup` watches the log's lines as ``verify``
reads them; :func:`compare` says which checkpoint the log does not match, and how.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from mcpd.admin.audit.logfiles import Line, LogFileError, bounded_lines, open_regular
from mcpd.common.audit.chain import record_seq
from mcpd.common.audit.checkpoint import Checkpoint, parse_message
from mcpd.common.printable import field, printable

MAX_LINE = 65536  # bytes of one line of a checkpoints file
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}", re.ASCII)
_HASH = re.compile(r"[0-9a-f]{64}", re.ASCII)
_SEQ = re.compile(r"[0-9]{1,19}", re.ASCII)


class CheckpointFileError(ValueError):
    """A line of a checkpoints file is no checkpoint: the message names the file, the line
    (1-based) and what is wrong, every part of the file escaped."""


@dataclasses.dataclass(frozen=True)
class Claim:
    """A checkpoint, and where the file first states it (``FILE:LINE``)."""

    point: Checkpoint
    where: str


def read_checkpoints(path: str) -> list[Claim]:
    """The distinct checkpoints of the file ``path``, in file order (blank lines skipped).

    Raises:
        OSError: it cannot be read.
        CheckpointFileError: a line that is none of the three forms, or over :data:`MAX_LINE`
            bytes (none is read further), or the file is no regular file (a FIFO: never waited on).
    """
    seen: dict[Checkpoint, Claim] = {}
    try:
        f = io.BufferedReader(open_regular(path))
    except LogFileError:
        raise CheckpointFileError(f"{printable(path)}: not a regular file") from None
    with f:
        for number, raw in _bounded(f, path):
            where = f"{printable(path)}:{number}"
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise CheckpointFileError(f"{where}: not UTF-8 text") from None
            if not text:
                continue
            try:
                point = parse_line(text)
            except ValueError as exc:
                raise CheckpointFileError(f"{where}: {exc}") from None
            seen.setdefault(point, Claim(point, where))
    return list(seen.values())


def _bounded(f: Any, path: str) -> Iterator[tuple[int, bytes]]:
    """:func:`~mcpd.admin.audit.logfiles.bounded_lines` of ``f``, a line over :data:`MAX_LINE`
    bytes a :class:`CheckpointFileError` naming it."""
    try:
        yield from bounded_lines(f, path, MAX_LINE)
    except LogFileError as exc:
        raise CheckpointFileError(f"{printable(path)}:{exc.line}: a line over {MAX_LINE} bytes is no "
                                  "checkpoint") from None


def parse_line(text: str) -> Checkpoint:
    """One line of a checkpoints file (stripped, not empty) as a checkpoint.

    Raises:
        ValueError: it is none of the three forms (the message quotes nothing unescaped).
    """
    if not text.startswith("{"):
        point = parse_message(text)
        if point is None:
            raise ValueError(f"not a checkpoint: no 'mcpd checkpoint log=... seq=... hash=...' in {field(text, 80)}")
        return _checked(point.log, str(point.seq), point.hash)
    try:
        obj = json.loads(text)  # (an object: the text begins with "{")
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({printable(str(exc))})") from None
    except RecursionError:
        raise ValueError("not a checkpoint: JSON nested too deeply") from None
    if "MCPD_CHECKPOINT_SEQ" in obj:
        return _checked(_journal(obj, "MCPD_LOG"), _journal(obj, "MCPD_CHECKPOINT_SEQ"),
                        _journal(obj, "MCPD_CHECKPOINT_HASH"))
    if "MESSAGE" in obj:
        point = parse_message(_journal(obj, "MESSAGE"))
        if point is None:
            raise ValueError("a journal entry that is no checkpoint (export only SYSLOG_IDENTIFIER=mcpd-checkpoint)")
        return _checked(point.log, str(point.seq), point.hash)
    if not {"log", "seq", "hash"} <= obj.keys():
        raise ValueError('a JSON object that is neither a journal entry nor {"log": ..., "seq": ..., "hash": ...}')
    seq = obj["seq"]
    if type(seq) is not int or not isinstance(obj["log"], str) or not isinstance(obj["hash"], str):
        raise ValueError('"log" and "hash" must be strings, "seq" an integer')
    return _checked(obj["log"], str(seq), obj["hash"].lower())


def _journal(obj: dict[str, Any], key: str) -> str:
    """A journal field as ``journalctl -o json`` prints it: a string, or its bytes as a list of
    numbers (a value that is not UTF-8 or holds control characters)."""
    value = obj.get(key)
    if isinstance(value, list) and all(type(b) is int and 0 <= b < 256 for b in value):
        value = bytes(value).decode("utf-8", "replace")
    if not isinstance(value, str):
        raise ValueError(f"journal field {key} missing, repeated or not text")
    return value


def _checked(log: str, seq: str, digest: str) -> Checkpoint:
    if not _NAME.fullmatch(log):
        raise ValueError(f"log {field(log, 80)} is no log name (letters, digits, '.', '_', '-')")
    if not _SEQ.fullmatch(seq) or int(seq) < 1:
        raise ValueError(f"seq {field(seq, 80)} is no record number (1 or more)")
    if not _HASH.fullmatch(digest):
        raise ValueError(f"hash {field(digest, 80)} is no SHA-256 (64 hex digits)")
    return Checkpoint(log, int(seq), digest)


class Lookup:
    """What :func:`compare` needs of a log, gathered while ``verify`` reads it: the hash and
    place of each record a checkpoint names (every distinct record with that seq, in file
    order: a log may hold two), the highest seq and where it is."""

    def __init__(self, seqs: Iterable[int]) -> None:
        self.wanted = set(seqs)
        self.found: dict[int, list[tuple[str, str]]] = {}  # seq -> [(hash, FILE:LINE)], distinct hashes
        self.last_seq, self.last_where = 0, "(the log)"

    def watch(self, lines: Iterable[Line]) -> Iterator[Line]:
        """``lines``, unchanged, noting what :func:`compare` needs as they pass."""
        for line in lines:
            rec = line.record() if line.raw.endswith(b"\n") else None
            seq = record_seq(rec)
            if seq is not None:
                if seq in self.wanted:
                    hits = self.found.setdefault(seq, [])
                    if len(hits) < 8 and all(h != line.digest for h, _ in hits):  # (bounded: 8 tell enough)
                        hits.append((line.digest, line.where))
                if seq > self.last_seq:
                    self.last_seq, self.last_where = seq, line.where
            yield line


@dataclasses.dataclass(frozen=True)
class Outcome:
    """:func:`compare`'s verdict: ``failures`` (one line each, lowest seq first), ``checked``
    (checkpoints that match), ``last`` (the highest seq they cover; 0: none), ``skipped`` (of
    other logs), ``older`` (before the history kept)."""

    failures: tuple[str, ...]
    checked: int
    last: int
    skipped: int
    older: int


def compare(claims: list[Claim], log: str, lookup: Lookup, history_from: int = 1) -> Outcome:
    """Each checkpoint of ``log`` in ``claims`` against the records ``lookup`` saw: the record it
    names must be there (``truncated``: past the log's end; ``missing``: not in the files read)
    with its hash (``rewritten``), and be the only record with that seq (two: ``rewritten``, the
    checkpoint proves neither). Checkpoints giving one seq different hashes are ``conflicting``
    (one was forged, or the log rewritten and checkpointed again): none of them counts as a match.
    Checkpoints of records before ``history_from`` are not checked.
    Every failure is one line, escaped (:func:`mcpd.common.printable.printable`)."""
    mine = sorted((c for c in claims if c.point.log == log), key=lambda c: c.point.seq)
    failures: list[str] = []
    checked = last = older = 0
    good = 0  # the highest seq a checkpoint matched so far
    by_seq: dict[int, list[Claim]] = {}
    for claim in mine:
        by_seq.setdefault(claim.point.seq, []).append(claim)
    for claim in mine:
        seq, said = claim.point.seq, f"the checkpoint at {claim.where}"
        if seq < history_from:
            older += 1
            continue
        hits = lookup.found.get(seq, [])
        hit = hits[0] if hits else None
        rivals = by_seq[seq]
        if len(rivals) > 1:  # two hashes for one record: one is forged, and which cannot be told here
            if claim is rivals[0]:
                told = ", ".join(f"{c.point.hash} at {c.where}" for c in rivals)
                failures.append(f"(the checkpoints): conflicting: {len(rivals)} checkpoints give record seq {seq} "
                                f"different hashes ({told}): one was forged, or the log was rewritten and "
                                "checkpointed again; none of them proves the log")
        elif len(hits) > 1:
            places = ", ".join(f"{h} at {w}" for h, w in hits)
            failures.append(f"{printable(hits[-1][1])}: rewritten: the log holds {len(hits)} different records "
                            f"numbered seq {seq} ({places}); {said} names one of them, which proves neither")
        elif hit is None and seq > lookup.last_seq:
            failures.append(f"{printable(lookup.last_where)}: truncated: record seq {seq} is missing: the log ends "
                            f"at seq {lookup.last_seq}, but {said} says it was written (the end was cut off, or the "
                            "log replaced)")
        elif hit is None:
            failures.append(f"(the log): missing: record seq {seq} is in none of the files read, but {said} says it "
                            "was written (deleted, or its file was not read)")
        elif hit[0] != claim.point.hash:
            span = f"seq {good + 1}..{seq} (the checkpoint of seq {good} matches)" if good else \
                f"seq {history_from}..{seq} (no earlier checkpoint matches)"
            failures.append(f"{printable(hit[1])}: rewritten: record seq {seq} hashes to {hit[0]}, not "
                            f"{claim.point.hash} as {said} says; the first record changed is one of {span}")
        else:
            checked, last, good = checked + 1, seq, seq
    return Outcome(tuple(failures), checked, last, len(claims) - len(mine), older)
