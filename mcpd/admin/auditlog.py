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

from mcpd.common.audit import HEAD_FILE, LOST_TAIL, REFUSED_AT_OPEN, Head
from mcpd.common.audit import read_head as audit_read_head
from mcpd.common.folders import safe_folder
from mcpd.common.printable import printable

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
    chain breaks and why (``problem`` starts with truncated/edited/deleted/reordered),
    ``unchained`` records before the first chained one (written before the chain existed),
    ``losses``: the gaps the log's writer found and recorded (the chain was checked on past each,
    and ``ok`` is False), and whether the end was checked against the writer's head state."""

    ok: bool
    count: int
    first_seq: int | None = None
    last_seq: int | None = None
    where: str | None = None
    problem: str | None = None
    unchained: int = 0
    losses: tuple[str, ...] = ()  # "FILE:LINE: deleted: ..." for each gap its writer recorded
    head_checked: bool = False  # the log's end was compared with its writer's head state


def _later_seqs(rest: Iterator[Line], wanted: range) -> str | None:
    for line in rest:
        rec = line.chained()
        if rec is not None and rec["seq"] in wanted:
            return f"record {rec['seq']} is at {line.where}"
    return None


def _recorded_gap(rec: dict[str, Any], expected: int, seq: int) -> bool:
    """Whether ``rec`` is the alert its writer put where records ``expected..seq-1`` went missing."""
    return rec.get("event") == "alert" and rec.get("reason") == LOST_TAIL and rec.get("missing_to") == seq - 1


def _range(first: int, last: int) -> str:
    return f"{last - first + 1} record{'s' * (last > first)} (seq {first}{'' if last == first else f'..{last}'})"


def verify(lines: Iterable[Line], head: Head | None = None) -> Verdict:  # noqa: C901 - one rule per branch
    """Check the hash chain over ``lines`` (in file order); stop at the first broken line.

    Records without ``seq`` before the first chained one are accepted as ``unchained`` (a log
    begun before the chain existed), and the first chained record must then link to the last of
    them. The first chained record of the first file may start mid-chain (older files rotated
    away): its ``prev`` cannot be checked. A gap the writer found and recorded (its
    :data:`~mcpd.common.audit.LOST_TAIL` alert stands where the missing records were) is a loss:
    named in ``losses``, the check goes on past it, and the verdict is not ``ok``.

    ``head``: the writer's head state (:func:`read_head`), given when ``lines`` end with the live
    log: the record it names must be there, with that hash, or the end was cut (``truncated``,
    naming the records missing) or rewritten (``edited``).
    """
    it = iter(lines)
    prev: Line | None = None
    prev_seq: int | None = None
    first: int | None = None
    count = unchained = 0
    losses: list[str] = []
    at_head: Line | None = None  # the line whose seq the head names

    def broken(where: str, problem: str) -> Verdict:
        return Verdict(False, count, first, prev_seq, where, problem, unchained, tuple(losses), head is not None)

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
            if seq > expected and _recorded_gap(rec, expected, seq):
                losses.append(f"{line.where}: deleted: {_range(expected, seq - 1)} missing before this line, "
                              "cut off the log; its writer found them gone and recorded this alert")
            elif seq > expected:
                moved = _later_seqs(it, range(expected, seq))
                if moved:
                    return broken(line.where, f"reordered: seq {seq} where {expected} was due; {moved}")
                return broken(line.where, f"deleted: {_range(expected, seq - 1)} missing before this line")
            else:
                return broken(line.where, f"reordered: seq {seq} after seq {prev_seq}")
        elif seq != prev_seq + 1:
            return broken(line.where, f"edited: seq {seq} where {prev_seq + 1} was due, though the link holds")
        if head is not None and seq == head.seq:
            at_head = line
        prev, prev_seq, count = line, seq, count + 1
    if head is not None and head.seq:
        end = prev.where if prev is not None else "(the log)"
        if prev_seq is None or prev_seq < head.seq:
            start = 1 if prev_seq is None else prev_seq + 1
            return broken(end, f"truncated: {_range(start, head.seq)} missing from the end of the log: its writer's "
                               f"head state says it wrote seq {head.seq}")
        if at_head is not None and at_head.digest != head.hash:
            return broken(at_head.where, f"edited: record seq {head.seq} is not the one its writer wrote "
                                         "(its head state holds another hash)")
    return Verdict(not losses, count, first, prev_seq, None, None, unchained, tuple(losses), head is not None)


def read_head(state_dir: str, name: str = HEAD_FILE) -> Head | None:
    """The head state the audit log's writer keeps in its state folder ``state_dir`` (``None``
    when it keeps none there).

    Raises:
        OSError: the folder or file is unsafe (a level another account can change, a symlink,
            not the folder owner's 0600 file) or unreadable.
        ValueError: the file holds no head.
    """
    fd = safe_folder(state_dir, owner=os.stat(state_dir).st_uid, create=False)
    try:
        return audit_read_head(fd, name)
    finally:
        os.close(fd)


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


#: a decision filter and the decisions it lists: ``reject`` also lists the calls the grants allowed
#: but root's opener refused (``refused_at_open``: a symlink in the path, several hard links ...)
DECISIONS = {"reject": ("reject", REFUSED_AT_OPEN)}


@dataclass(frozen=True)
class Filter:
    """Which records to show: ``user`` (principal or OS account), ``decision`` (``reject`` lists
    every refusal, see :data:`DECISIONS`), ``path`` (a glob over the requested and resolved path),
    ``since``/``until`` (aware datetimes, inclusive), ``event`` (``alert``, ``reload`` ...)."""

    user: str | None = None
    decision: str | None = None
    path: str | None = None
    since: datetime.datetime | None = None
    until: datetime.datetime | None = None
    event: str | None = None

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.user, self.decision, self.path, self.since, self.until, self.event))

    def match(self, rec: dict[str, Any]) -> bool:
        """Whether ``rec`` passes every filter given."""
        if self.event is not None and rec.get("event") != self.event:
            return False
        if self.user is not None and self.user not in (rec.get("user"), rec.get("os_user")):
            return False
        if self.decision is not None and rec.get("decision") not in DECISIONS.get(self.decision, (self.decision,)):
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


@dataclass
class Load:
    """One load of the grants file as its records hold it (:func:`loads`): when (``time``, the
    first record's), where (``where`` ``FILE:LINE``, ``first``/``last`` seq), the file
    (``grants_file``), ``sha256`` as recorded, the file's ``text`` and the ``changes`` made, rebuilt
    from the parts; ``problem`` says why it is not whole (a part missing, parts not adjacent, the
    text not matching its digest, or records written before reloads were recorded whole)."""

    time: datetime.datetime | None
    where: str
    first: int | None
    last: int | None
    grants_file: str
    sha256: str
    text: str
    changes: list[str]
    problem: str | None = None


def loads(lines: Iterable[Line]) -> Iterator[Load]:
    """Every successful load of the grants file recorded in ``lines`` (``reload`` records, in
    order), rebuilt from its parts (see :func:`mcpd.policy.grants_reload.reload_records`)."""
    current: list[dict[str, Any]] = []
    where = ""

    def done() -> Load:
        one = current[0]
        parts = one.get("parts")
        seqs = [r.get("seq") for r in current]
        text = "".join(str(r.get("grants_text", "")) for r in current)
        changes = "".join(str(r.get("changes_text", "")) for r in current)
        load = Load(record_time(one), where, seqs[0], seqs[-1], str(one.get("grants_file", "?")),
                    str(one.get("sha256", "")), text, changes.split("\n") if changes else [])
        if parts is None:
            load.problem = "recorded before reloads were recorded whole: only its summary is in the log"
        elif not isinstance(parts, int) or [r.get("part") for r in current] != list(range(1, parts + 1)):
            load.problem = f"parts {[r.get('part') for r in current]} of {parts}: not whole"
        elif not all(isinstance(s, int) for s in seqs) or seqs != list(range(int(seqs[0] or 0), int(seqs[0] or 0) + len(seqs))):
            load.problem = "its parts are not adjacent records"
        elif any(r.get("sha256") != one.get("sha256") for r in current) or \
                hashlib.sha256(text.encode("utf-8")).hexdigest() != one.get("sha256"):
            load.problem = "its text does not match its recorded sha256"
        elif len(load.changes) != one.get("changes"):
            load.problem = f"{len(load.changes)} changes where {one.get('changes')} were recorded"
        return load

    for line, rec in records(lines):
        if rec.get("event") != "reload":
            continue
        part = rec.get("part")
        if current and (not isinstance(part, int) or part <= int(current[-1].get("part") or 0)
                        or rec.get("sha256") != current[0].get("sha256")):  # a new set (the last one not whole)
            yield done()
            current = []
        if not current:
            where = line.where
        current.append(rec)
        if part is None or part == rec.get("parts"):
            yield done()
            current = []
    if current:
        yield done()


def backwards(path: str, end: int | None = None, block: int = 65536) -> Iterator[bytes]:
    """The non-empty lines of ``path`` (without newline), last first: a plain file read backwards
    in ``block``-byte steps (memory ~ one line and a block), a ``.gz`` one decompressed whole.
    ``end`` (bytes, plain files) stops at that offset instead of the current size, so a follower
    can go on from exactly there.

    Raises:
        OSError: cannot open or read the file.
    """
    if path.endswith(".gz"):
        with _open(path) as f:
            yield from (line for line in reversed(f.read().split(b"\n")) if line)
        return
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        size = os.fstat(fd).st_size
        pos = size if end is None else min(end, size)
        rest = b""
        while pos > 0:
            step = min(block, pos)
            pos -= step
            pieces = (os.pread(fd, step, pos) + rest).split(b"\n")
            rest = pieces[0]
            yield from (line for line in reversed(pieces[1:]) if line)
        if rest:
            yield rest
    finally:
        os.close(fd)


def last_records(paths: list[str], flt: Filter, count: int, end: int | None = None) -> list[tuple[bytes, dict[str, Any]]]:
    """The last ``count`` records of the files ``paths`` (oldest first: :func:`rotated_set`) that
    pass ``flt``, oldest first, each with its raw line: read from the end of the newest file
    backwards, so ``-n 5`` reads little even across a year of rotated files. ``end``: where the
    newest file is taken to end (bytes). Lines that are no JSON record are skipped.

    Raises:
        OSError: a file cannot be read.
    """
    found: list[tuple[bytes, dict[str, Any]]] = []
    if count <= 0:
        return found
    for i, path in enumerate(reversed(paths)):
        for raw in backwards(path, end if i == 0 else None):
            rec = Line(path, raw).record()
            if rec is not None and flt.match(rec):
                found.append((raw, rec))
                if len(found) == count:
                    return found[::-1]
    return found[::-1]


def tail_lines(path: str, count: int, block: int = 65536, end: int | None = None) -> list[bytes]:
    """The last ``count`` non-empty lines of ``path`` (without newline), oldest first
    (:func:`backwards`; memory ~ answer).

    Raises:
        OSError: cannot open the file.
    """
    if count <= 0:
        return []
    out = []
    for line in backwards(path, end, block):
        out.append(line)
        if len(out) == count:
            break
    return out[::-1]


COLUMNS = ("time", "user", "route", "tool", "path", "decision", "reason", "bytes", "rule")


def _text(value: Any) -> str:
    """A field as shown on screen: :func:`~mcpd.common.printable.printable`, so nothing a client
    sent (a path with a newline, an ESC, a bidi override) forges or hides a line."""
    return printable(str(value))


def _reason(rec: dict[str, Any]) -> str:
    reason = str(rec.get("reason") or "-")
    if rec.get("outcome"):
        reason += f" [{rec['outcome']}]"
    if rec.get("reason_detail"):
        reason += f" ({rec['reason_detail']})"
    if "missing_to" in rec:
        reason += f": records seq {rec.get('missing_from') or '?'}..{rec['missing_to']}"
    if rec.get("parts"):
        reason += f" [part {rec.get('part')} of {rec['parts']}, sha256 {str(rec.get('sha256', '?'))[:12]}]"
    if rec.get("suppressed"):
        reason += f" (+{rec['suppressed']} like it suppressed)"
    return reason


def human(rec: dict[str, Any]) -> str:
    """One record as a readable line: time, user (``principal(account)``), route, tool, path,
    decision, reason, bytes, and the rule that decided (``grant``) when there is one; other events
    show their event name and the fields that say what.
    Every field is escaped (:func:`_text`): the line never spans two lines, and shows what a
    client sent as escapes."""
    when = str(rec.get("time", "?"))[:19].replace("T", " ")
    user, account = rec.get("user"), rec.get("os_user")
    who = f"{user}({account})" if user and account and user != account else str(user or account or "-")
    path = rec.get("resolved_path") or rec.get("requested_path") or rec.get("grants_file") or rec.get("log_file") or "-"
    if rec.get("requested_path") and rec.get("resolved_path") and rec["requested_path"] != rec["resolved_path"]:
        path = f"{_text(rec['requested_path'])} -> {_text(rec['resolved_path'])}"
    else:
        path = _text(path)
    route = rec.get("route") or ("privileged" if rec.get("event") in ("accept", "reject") else rec.get("event", "-"))
    extra = f" pid={_text(rec['pid'])}" if "pid" in rec else ""
    size = rec.get("bytes")
    rule = f"  rule: {_text(rec['grant'])}" if rec.get("grant") else ""
    return (f"{_text(when)}  {_text(who):<14} {_text(route):<12} {_text(rec.get('tool') or '-'):<14} {path}{extra}  "
            f"{_text(rec.get('decision') or '-')}  {_text(_reason(rec))}  {'-' if size is None else _text(size)}{rule}")


def as_json_line(raw: bytes, rec: dict[str, Any]) -> str:
    """A record's line as ``tail --json`` prints it: its own bytes when they are printable ASCII
    (what the writer writes: ``verify`` hashes exactly these), else ``rec`` encoded again as
    ASCII JSON (escapes, never a raw control character)."""
    text = raw.rstrip(b"\n")
    if text.isascii() and text.decode("ascii").isprintable():
        return text.decode("ascii")
    return json.dumps(rec, separators=(",", ":"), ensure_ascii=True)


def format_json(rec: dict[str, Any]) -> str:
    """``rec`` as one compact JSON line."""
    return json.dumps(rec, separators=(",", ":"))
