"""Reading the audit logs: the hash chain check, filters and the human form (SPEC §7).

The root helper writes the chained audit log and the front its access log, both with
:mod:`mcpd.common.audit`; this module only reads them, as ``mcpd audit verify``, ``tail`` and
``replay`` do, so none of it runs inside the daemon.

The chain (see :mod:`mcpd.common.audit`): record ``n`` carries ``seq`` and ``prev``, the SHA-256 of
record ``n-1``'s exact bytes (newline included). :func:`verify` walks files in the order given
(oldest first) and stops at the first line that breaks it, saying what is wrong:

* ``truncated``: the last line has no newline (the file was cut short);
* ``edited``: a line is not a valid record, its ``seq`` is not the next one although its link
  holds, or the hash of a line does not match the ``prev`` of the next one. The line named is the
  one whose bytes changed: when the links on both sides of a line fail, that line; when only the
  link into it fails, the line before it (or its own ``prev`` was forged and the writer went on
  from it: the message says both);
* ``deleted``: ``seq`` jumps forward and the missing records appear nowhere later;
* ``reordered``: ``seq`` jumps forward and a missing record appears later, or goes backwards.

Limits, as for any hash chain without an outside anchor: records cut off the end at a line
boundary, or an edit of the very last record (which no later record hashes), are invisible here;
the journal copy of each record is that anchor.
"""

from __future__ import annotations

import collections
import datetime
import fnmatch
import gzip
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_ROTATED = re.compile(r"^\.(\d+)(\.gz)?$")


@dataclass(frozen=True)
class Line:
    """One raw line of a log: ``where`` is ``FILE:LINE`` (1-based), ``raw`` its bytes (newline kept)."""

    where: str
    raw: bytes

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of the exact bytes, the ``prev`` of the record after it."""
        return hashlib.sha256(self.raw).hexdigest()

    def record(self) -> dict[str, Any] | None:
        """The JSON object of this line, or ``None`` when it is not one."""
        try:
            obj = json.loads(self.raw)
        except ValueError:
            return None
        return obj if isinstance(obj, dict) else None

    def chained(self) -> dict[str, Any] | None:
        """The record when it carries a valid ``seq`` (int ≥ 1) and ``prev`` (64 hex), else ``None``."""
        rec = self.record()
        if rec is None:
            return None
        seq, prev = rec.get("seq"), rec.get("prev")
        ok = isinstance(seq, int) and not isinstance(seq, bool) and seq >= 1
        return rec if ok and isinstance(prev, str) and _HEX64.match(prev) else None


def _open(path: str) -> IO[bytes]:
    return gzip.GzipFile(path, "rb") if path.endswith(".gz") else open(path, "rb")  # type: ignore[return-value]


def read_lines(paths: Iterable[str]) -> Iterator[Line]:
    """Every line of ``paths`` in order (``.gz`` files decompressed).

    Raises:
        OSError: a file cannot be opened or read.
    """
    for path in paths:
        with _open(path) as f:
            for number, raw in enumerate(f, 1):
                yield Line(f"{path}:{number}", raw)


def rotated_set(path: str) -> list[str]:
    """``path``'s rotated files (``path.N``, ``path.N.gz``), oldest first, then ``path`` itself
    when it exists: the default file list of ``mcpd audit verify``."""
    folder, base = os.path.split(os.path.abspath(path))
    found = []
    for name in (os.listdir(folder) if os.path.isdir(folder) else []):
        m = _ROTATED.match(name[len(base):]) if name.startswith(base) else None
        if m:
            found.append((int(m.group(1)), os.path.join(folder, name)))
    files = [p for _, p in sorted(found, reverse=True)]
    return files + ([path] if os.path.exists(path) else [])


@dataclass(frozen=True)
class Verdict:
    """The answer of :func:`verify`: ``ok``, records checked, first/last ``seq`` seen, where the
    chain breaks and why (``problem`` starts with truncated/edited/deleted/reordered), and
    ``unchained`` records before the first chained one (written before the chain existed)."""

    ok: bool
    count: int
    first_seq: int | None = None
    last_seq: int | None = None
    where: str | None = None
    problem: str | None = None
    unchained: int = 0


def _later_seqs(rest: Iterator[Line], wanted: range) -> str | None:
    for line in rest:
        rec = line.chained()
        if rec is not None and rec["seq"] in wanted:
            return f"record {rec['seq']} is at {line.where}"
    return None


def verify(lines: Iterable[Line]) -> Verdict:  # noqa: C901 - one rule per branch
    """Check the hash chain over ``lines`` (in file order); stop at the first broken line.

    Records without ``seq`` before the first chained one are accepted as ``unchained`` (a log
    begun before the chain existed), and the first chained record must then link to the last of
    them. The first chained record of the first file may start mid-chain (older files rotated
    away): its ``prev`` cannot be checked.
    """
    it = iter(lines)
    prev: Line | None = None
    prev_seq: int | None = None
    first: int | None = None
    count = unchained = 0

    def broken(where: str, problem: str) -> Verdict:
        return Verdict(False, count, first, prev_seq, where, problem, unchained)

    for line in it:
        if not line.raw.endswith(b"\n"):
            return broken(line.where, "truncated: the last record is cut short (no end of line)")
        rec = line.chained()
        if rec is None:
            plain = line.record()
            if prev_seq is None and plain is not None and "seq" not in plain and "prev" not in plain:
                unchained, prev = unchained + 1, line
                continue
            return broken(line.where, "edited: not a valid chained record (seq and prev)")
        seq, link = rec["seq"], prev is None or rec["prev"] == prev.digest
        if prev_seq is None:
            if not link:
                return broken(line.where, "edited: the first chained record does not link to the line before it")
            first = seq
        elif not link:
            expected = prev_seq + 1
            assert prev is not None
            if seq == expected:
                nxt = next(it, None)
                nrec = None if nxt is None else nxt.chained()
                if nrec is not None and nrec["prev"] != line.digest:
                    return broken(line.where, "edited: this record's bytes changed (neither link around it holds)")
                return broken(prev.where, f"edited: this line's hash does not match the prev of {line.where} "
                                          "(this line changed, or that prev was written by hand)")
            if seq > expected:
                moved = _later_seqs(it, range(expected, seq))
                if moved:
                    return broken(line.where, f"reordered: seq {seq} where {expected} was due; {moved}")
                n = seq - expected
                return broken(line.where, f"deleted: {n} record{'s' * (n > 1)} (seq {expected}"
                                          f"{'' if n == 1 else f'..{seq - 1}'}) missing before this line")
            return broken(line.where, f"reordered: seq {seq} after seq {prev_seq}")
        elif seq != prev_seq + 1:
            return broken(line.where, f"edited: seq {seq} where {prev_seq + 1} was due, though the link holds")
        prev, prev_seq, count = line, seq, count + 1
    return Verdict(True, count, first, prev_seq, None, None, unchained)


# ---------------------------------------------------------------- reading records


def parse_time(text: str) -> datetime.datetime:
    """An ISO 8601 time (``2026-12-01``, ``2026-12-01T06:00``, ``...Z``; no offset means UTC), or
    a span back from now: ``90s``, ``15m``, ``2h``, ``3d``.

    Raises:
        ValueError: neither form.
    """
    m = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if m:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=int(m.group(1)) * unit)
    when = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)


def record_time(rec: dict[str, Any]) -> datetime.datetime | None:
    """The ``time`` of a record as an aware datetime, or ``None`` when missing or malformed."""
    try:
        return parse_time(str(rec["time"])) if "time" in rec else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Filter:
    """Which records to show: ``user`` (principal or OS account), ``decision``, ``path`` (a glob
    over the requested and resolved path), ``since``/``until`` (aware datetimes, inclusive)."""

    user: str | None = None
    decision: str | None = None
    path: str | None = None
    since: datetime.datetime | None = None
    until: datetime.datetime | None = None

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.user, self.decision, self.path, self.since, self.until))

    def match(self, rec: dict[str, Any]) -> bool:
        """Whether ``rec`` passes every filter given."""
        if self.user is not None and self.user not in (rec.get("user"), rec.get("os_user")):
            return False
        if self.decision is not None and rec.get("decision") != self.decision:
            return False
        if self.path is not None and not any(
                isinstance(p, str) and fnmatch.fnmatchcase(p, self.path)
                for p in (rec.get("requested_path"), rec.get("resolved_path"))):
            return False
        if self.since is not None or self.until is not None:
            when = record_time(rec)
            if when is None or (self.since and when < self.since) or (self.until and when > self.until):
                return False
        return True


def records(lines: Iterable[Line]) -> Iterator[tuple[Line, dict[str, Any]]]:
    """Each line of ``lines`` that is a JSON record, with that record (others are skipped)."""
    for line in lines:
        rec = line.record()
        if rec is not None:
            yield line, rec


def last_matching(lines: Iterable[Line], flt: Filter, count: int) -> list[tuple[Line, dict[str, Any]]]:
    """The last ``count`` records of ``lines`` that pass ``flt``, with their lines (memory ~ ``count``)."""
    return list(collections.deque((r for r in records(lines) if flt.match(r[1])), maxlen=count))


def tail_lines(path: str, count: int, block: int = 65536, end: int | None = None) -> list[bytes]:
    """The last ``count`` non-empty lines of ``path`` (without newline), read backwards in
    ``block``-byte steps (memory ~ answer). ``end`` (bytes) stops at that offset instead of the
    current size, so a follower can go on from exactly there.

    Raises:
        OSError: cannot open the file.
    """
    if count <= 0:
        return []
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        size = os.fstat(fd).st_size
        end = size if end is None else min(end, size)
        found: collections.deque[bytes] = collections.deque()
        rest = b""
        pos = end
        while pos > 0 and len(found) <= count:
            step = min(block, pos)
            pos -= step
            pieces = (os.pread(fd, step, pos) + rest).split(b"\n")
            rest = pieces[0]
            found.extendleft(reversed(pieces[1:]))
        if pos == 0:
            found.appendleft(rest)
    finally:
        os.close(fd)
    return [line for line in found if line][-count:]


COLUMNS = ("time", "user", "route", "tool", "path", "decision", "reason", "bytes")


def human(rec: dict[str, Any]) -> str:
    """One record as a readable line: time, user (``principal(account)``), route, tool, path,
    decision, reason, bytes; other events show their event name and the fields that say what."""
    when = str(rec.get("time", "?"))[:19].replace("T", " ")
    user, account = rec.get("user"), rec.get("os_user")
    who = f"{user}({account})" if user and account and user != account else str(user or account or "-")
    path = rec.get("resolved_path") or rec.get("requested_path") or "-"
    if rec.get("requested_path") and rec.get("resolved_path") and rec["requested_path"] != rec["resolved_path"]:
        path = f"{rec['requested_path']} -> {rec['resolved_path']}"
    route = rec.get("route") or ("privileged" if rec.get("event") in ("accept", "reject") else rec.get("event", "-"))
    reason = str(rec.get("reason") or "-")
    if rec.get("outcome"):
        reason += f" [{rec['outcome']}]"
    if rec.get("suppressed"):
        reason += f" (+{rec['suppressed']} like it suppressed)"
    extra = f" pid={rec['pid']}" if "pid" in rec else ""
    size = rec.get("bytes")
    return (f"{when}  {who:<14} {route:<12} {rec.get('tool') or '-':<14} {path}{extra}  "
            f"{rec.get('decision') or '-'}  {reason}  {'-' if size is None else size}")


def format_json(rec: dict[str, Any]) -> str:
    """``rec`` as one compact JSON line."""
    return json.dumps(rec, separators=(",", ":"))
