"""Reading the audit logs: the hash chain check, filters and the human form (SPEC §7).

The root helper writes the chained audit log and the front its access log, both with
:mod:`mcpd.common.audit`; this module only reads them, as ``mcpd audit verify``, ``tail`` and
``replay`` do, so none of it runs inside the daemon.

The chain (see :mod:`mcpd.common.audit`): record ``n`` carries ``seq`` and ``prev``, the SHA-256 of
record ``n-1``'s exact bytes (newline included). :func:`verify` walks files in the order given
(oldest first) and lists every break it finds (edited, deleted, reordered, repeated, truncated,
lost, missing: see there), not only the first, from seq 1 unless told where history may begin.

Limits, as for any hash chain without an outside anchor: a consistent rewrite by whoever can
write the log and its writer's head state is invisible here; the journal copy of each record is
that anchor.
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

from mcpd.common.audit.chain import GENESIS, file_number
from mcpd.common.audit.head import HEAD_FILE, Head
from mcpd.common.audit.records import REFUSED_AT_OPEN, REFUSED_BY_OS
from mcpd.common.audit.head import read_head as audit_read_head
from mcpd.common.folders import safe_folder
from mcpd.common.printable import field, printable

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
class Problem:
    """One break :func:`verify` found: ``where`` (``FILE:LINE``), ``kind`` (the first word of
    ``text``: ``truncated``, ``edited``, ``deleted``, ``reordered``, ``repeated``, ``lost``,
    ``missing``) and ``text``, the whole sentence."""

    where: str
    text: str

    @property
    def kind(self) -> str:
        return self.text.split(":", 1)[0]

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


@dataclass(frozen=True)
class Verdict:
    """The answer of :func:`verify`: ``ok`` (no problem at all), records checked (``count``),
    the first and the highest ``seq`` seen, every break found (``problems``, in file order),
    ``unchained`` records before the first chained one (written before the chain existed),
    ``first_where`` (the first chained record's line) and whether the end was checked against
    the writer's head state. ``where``/``problem`` are the first problem's, ``losses`` the
    problems that are losses its writer recorded (``lost``)."""

    ok: bool
    count: int
    first_seq: int | None = None
    last_seq: int | None = None
    problems: tuple[Problem, ...] = ()
    unchained: int = 0
    first_where: str | None = None
    head_checked: bool = False  # the log's end was compared with its writer's head state

    @property
    def where(self) -> str | None:
        return self.problems[0].where if self.problems else None

    @property
    def problem(self) -> str | None:
        return self.problems[0].text if self.problems else None

    @property
    def losses(self) -> tuple[str, ...]:
        return tuple(str(p) for p in self.problems if p.kind == "lost")


def _loss_alert(rec: dict[str, Any]) -> bool:
    """Whether ``rec`` is a writer's alert that records of its log were lost (``missing_to``)."""
    return rec.get("event") == "alert" and type(rec.get("missing_to")) is int


def _found_again(rec: dict[str, Any], last: tuple[str, str] | None, seq: int) -> bool:
    """Whether the records the loss alert ``rec`` (number ``seq``) names are in the files read
    after all, whole: the last of them was read (``last``: its hash and place) and the alert
    links to it, as after ``copytruncate`` when its copy is read too."""
    return last is not None and seq == rec["missing_to"] + 1 and rec.get("prev") == last[0]


def _range(first: int, last: int) -> str:
    return f"{last - first + 1} record{'s' * (last > first)} (seq {first}{'' if last == first else f'..{last}'})"


def loss_words(rec: dict[str, Any]) -> str:
    """What a writer's loss alert (:func:`_loss_alert`) says was lost, in words: the range when
    its start is known, else up to which record and why the start is not known."""
    upto, since, found = rec["missing_to"], rec.get("missing_from"), rec.get("found_seq")
    detail = f" ({rec['detail']})" if isinstance(rec.get("detail"), str) else ""
    if type(since) is int and since <= upto:
        if since == upto and found == upto:
            return f"the record seq {upto} it wrote last is not in the log any more: the log was rewritten{detail}"
        shown = _range(since, upto)
        if type(found) is int and found:
            shown += f"; the log ended at seq {found}"
        return shown + detail
    if found:
        return f"records up to seq {upto}; the log ended at seq {found}{detail}"
    return (f"records up to seq {upto}, the last its writer wrote; the log held none of its records, so where the "
            f"loss begins is not known{detail}")


#: how many of the latest records :func:`verify` remembers (seq, hash, place) to name reorders and
#: copies; older ones are named by number only
SEEN_KEPT = 65536
GAPS_KEPT = 4096  # open gaps remembered, to tell a deletion from a reordering


def verify(lines: Iterable[Line], head: Head | None = None,  # noqa: C901 - one rule per branch
           history_from: int | None = 1) -> Verdict:
    """Check the hash chain over ``lines`` (in file order) and report every break, not only the first.

    A record is whole when it is in place (its ``seq`` follows the record before it) and its
    ``prev`` is the hash of the record numbered one less. Each break found is one
    :class:`Problem`, in file order:

    * ``truncated``: a line without its newline (cut short), or records missing from the end
      (see ``head``);
    * ``edited``: a line that is no chained record; a ``seq`` that does not follow although the
      link holds; a hash that does not match the next ``prev``: the line named is the one whose
      bytes changed (both links around a line fail: that line; only the link into it: the line
      before it, or its own ``prev`` was forged and the writer went on from it, as the text says);
    * ``deleted``: records missing where the numbers jump, that appear nowhere later;
    * ``reordered``: records missing where the numbers jump that appear later, or a number
      lower than those before it seen for the first time;
    * ``repeated``: a record number seen before (an exact copy, or another record under a number
      already used: an old log copied over a newer one); a run of them is one problem;
    * ``lost``: a writer's alert that records were lost (it found its log cut, emptied or
      rewritten), wherever it stands: where the numbers jump it names the gap;
    * ``missing``: the first record read is not the chain's first (seq 1) and ``history_from``
      does not allow it: the records before it are not in the files read.

    Records without ``seq`` before the first chained one are accepted as ``unchained`` (a log
    begun before the chain existed). ``history_from``: the ``seq`` history may begin at (1: the
    whole chain; ``None``: anywhere). ``head``: the writer's head state (:func:`read_head`),
    given when ``lines`` end with the live log: the record it names must be there, with that
    hash, or the end was cut (``truncated``, naming the records missing and what else the head
    allows) or rewritten (``edited``).
    """
    problems: list[list[str]] = []  # [where, text], amended when a later line tells more
    seen: dict[int, tuple[str, str]] = {}  # seq -> (hash, where) of the latest SEEN_KEPT records
    gaps: list[list[Any]] = []  # open gaps: [first, last, index of their problem, filled]
    repeats: list[Any] = []  # the run of repeated records being reported: [index, first, last, where]
    prev: Line | None = None
    prev_seq: int | None = None
    max_seq = 0
    first: int | None = None
    first_where: str | None = None
    count = unchained = garbled = 0
    pending: tuple[int, Line, str] | None = None  # a link into record seq (its line) failed; where seq-1 is
    head_where: str | None = None  # the line whose bytes hash to the head's hash

    def add(where: str, text: str) -> int:
        problems.append([where, text])
        return len(problems) - 1

    def known(seq: int) -> tuple[str, str] | None:
        return seen.get(seq)

    def settle(nxt: tuple[int, Line, bool] | None) -> bool:
        """Judge the pending link failure with the record after it (``(seq, line, links to the
        pending line)``, None at the end or when the next is not in place); whether that next
        record's own failing link is explained by it."""
        nonlocal pending
        if pending is None:
            return False
        seq, line, before = pending
        pending = None
        if nxt is not None and nxt[0] == seq + 1 and not nxt[2]:
            add(line.where, "edited: this record's bytes changed (neither link around it holds)")
            return True
        add(before, f"edited: this line's hash does not match the prev of {line.where} "
                    "(this line changed, or that prev was written by hand)")
        return False

    for line in lines:
        if not line.raw.endswith(b"\n"):
            add(line.where, "truncated: this record is cut short (no end of line)")
            garbled += 1
            continue
        rec = line.chained()
        if rec is None:
            plain = line.record()
            if prev_seq is None and plain is not None and "seq" not in plain and "prev" not in plain:
                unchained, prev = unchained + 1, line
                continue
            add(line.where, "edited: not a valid chained record (seq and prev)")
            garbled += 1
            continue
        seq, digest = rec["seq"], line.digest
        if head is not None and digest == head.hash:
            head_where = line.where
        follows = prev is not None and rec["prev"] == prev.digest
        explained = settle((seq, line, follows)) if pending else False
        lost_here = False
        if prev_seq is None:  # the first chained record
            first, first_where = seq, line.where
            if prev is not None and not follows:
                add(line.where, "edited: the first chained record does not link to the line before it")
            elif prev is None and seq == 1 and rec["prev"] != GENESIS:
                add(line.where, "edited: seq 1 does not begin a chain (its prev is not 64 zeros)")
        elif follows and seq != prev_seq + 1:
            add(line.where, f"edited: seq {seq} where {prev_seq + 1} was due, though the link holds")
            seq = prev_seq + 1
        if prev_seq is None:
            pass
        elif seq > max_seq:  # a new number: in place, or after a gap
            if seq > max_seq + 1:
                lo, hi = max_seq + 1, seq - 1
                if _loss_alert(rec) and rec["missing_to"] == hi:
                    lost_here = True
                    add(line.where, f"lost: {_range(lo, hi)} missing before this line; its writer found them gone "
                                    "and recorded this alert")
                elif not (garbled and hi - lo + 1 <= garbled):  # (else: the lines that are no records were these)
                    index = add(line.where, f"deleted: {_range(lo, hi)} missing before this line")
                    if len(gaps) < GAPS_KEPT:
                        gaps.append([lo, hi, index, False])
            elif (before := known(seq - 1)) is not None and rec["prev"] != before[0] and not explained:
                pending = (seq, line, before[1])
        elif (gap := next((g for g in gaps if g[0] <= seq <= g[1]), None)) is not None:  # missing before: moved
            if not gap[3]:
                gap[3] = True
                problems[gap[2]][1] = (f"reordered: {_range(gap[0], gap[1])} not in place before this line; "
                                       f"record {seq} is at {line.where}")
            if (before := known(seq - 1)) is not None and rec["prev"] != before[0] and not follows:
                add(line.where, f"edited: this record's prev is not the hash of record {seq - 1} ({before[1]})")
        else:  # a number seen before: a copy, or a number used again
            earlier = known(seq)
            if repeats and repeats[2] == seq - 1 and follows:
                repeats[2] = seq
            else:
                repeats[:] = [add(line.where, ""), seq, seq, earlier[1] if earlier else None,
                              earlier is not None and earlier[0] == digest]
            copy = ("exact copies of" if repeats[4] else "records numbered as") + \
                (f" those from {repeats[3]}" if repeats[3] else " records read before")
            problems[repeats[0]][1] = f"repeated: {_range(repeats[1], repeats[2])} again from this line: {copy}"
            prev, prev_seq, count, garbled = line, seq, count + 1, 0
            continue
        if _loss_alert(rec) and not lost_here and not _found_again(rec, known(rec["missing_to"]), seq):
            add(line.where, f"lost: its writer recorded that records were lost: {loss_words(rec)}")
        seen[seq] = (digest, line.where)
        if len(seen) > 2 * SEEN_KEPT:
            for old in list(seen)[:SEEN_KEPT]:
                del seen[old]
        repeats.clear()
        prev, prev_seq, max_seq, count, garbled = line, seq, max(max_seq, seq), count + 1, 0
    settle(None)
    end = prev.where if prev is not None else "(the log)"
    if first is not None and history_from is not None and first > history_from:
        problems.insert(0, [first_where or end, f"missing: {_range(history_from, first - 1)} before this line, the "
                                                f"first record read: they are in none of the files read"])
    if head is not None and head.seq:
        if max_seq < head.seq:
            also = (f" (the hash its head holds is that of {head_where})" if head_where else
                    " (the hash its head holds, of its last record, is in no record read)") if max_seq else ""
            add(end, f"truncated: {_range(max_seq + 1, head.seq)} missing: the log ends at seq {max_seq} but its "
                     f"writer's head state says it wrote up to seq {head.seq}; cut off the end, unless records were "
                     f"removed before it and the rest renumbered and re-chained by hand{also}")
        elif (at := known(head.seq)) is not None and at[0] != head.hash:
            add(at[1], f"edited: record seq {head.seq} is not the one its writer wrote "
                       f"(its head state holds another hash{'; that hash is of ' + head_where if head_where else ''})")
    found = tuple(Problem(w, t) for w, t in problems)
    return Verdict(not found, count, first, max_seq or None, found, unchained, first_where, head is not None)


#: where the shipped logrotate file is installed: its ``rotate N`` says how many old files of a log are kept
LOGROTATE_FILE = "/etc/logrotate.d/mcpd"


def first_record(path: str) -> dict[str, Any] | None:
    """The JSON record on the first line of ``path`` (``.gz`` decompressed), or None when it has
    none or cannot be read."""
    try:
        with _open(path) as f:
            return Line(path, f.readline(1 << 20)).record()
    except (OSError, EOFError):
        return None


def logrotate_keeps(conf: str, log: str) -> int | None:
    """How many rotated files of ``log`` (an absolute path) the logrotate file ``conf`` keeps: the
    ``rotate N`` of the block naming it (a path or a glob), else of the file's top level; None
    when the file cannot be read or does not name the log."""
    try:
        with open(conf, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return None
    default: int | None = None
    names: list[str] = []
    inside: list[str] | None = None
    keeps: int | None = None
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        while words:
            word = words.pop(0)
            if inside is None and word.endswith("{"):
                names += [word[:-1]] if word[:-1] else []
                inside, keeps = names, None
                names = []
            elif inside is None:
                if word == "rotate" and words and words[0].isdigit():
                    default = int(words.pop(0))
                else:
                    names.append(word)
            elif word == "}":
                if any(fnmatch.fnmatchcase(log, n.strip('"')) for n in inside):
                    return keeps if keeps is not None else default
                inside = None
            elif word == "rotate" and words and words[0].isdigit():
                keeps = int(words.pop(0))
    return None


@dataclass(frozen=True)
class History:
    """What the files of a log say about the files before them: the number of the oldest and of
    the newest file read (their first record, see :data:`mcpd.common.audit.ROTATE`), the oldest
    file's first ``seq``, and how many rotated files logrotate keeps (``keeps``, from ``conf``;
    None when not known or when the files were given by hand)."""

    paths: tuple[str, ...]
    oldest: int | None
    newest: int | None
    first_seq: int | None
    keeps: int | None
    conf: str

    @classmethod
    def of(cls, paths: list[str], live: str | None, conf: str) -> "History":
        """The history of ``paths`` (oldest first); ``live``: the log they are the whole set of
        (None: files given by hand, whose retention is not judged)."""
        first, last = first_record(paths[0]), first_record(paths[-1])
        seq = first.get("seq") if first else None
        return cls(tuple(paths), _number(first), _number(last), seq if type(seq) is int else None,
                   logrotate_keeps(conf, os.path.abspath(live)) if live else None, conf)

    def accepted_start(self) -> int:
        """The ``seq`` history may begin at: the oldest file's first when logrotate's retention
        explains every file missing before it (the oldest kept is at least the newest's number
        less ``keeps``), else 1."""
        o, n, k = self.oldest, self.newest, self.keeps
        if o is not None and n is not None and k is not None and self.first_seq and 1 < o <= n - k:
            return self.first_seq
        return 1

    def retention_words(self) -> str:
        """Why the records before the oldest file are not missing (see :meth:`accepted_start`)."""
        return (f"seq 1..{(self.first_seq or 1) - 1} (the log's files 1..{(self.oldest or 1) - 1}) were removed by "
                f"logrotate's retention: it keeps {self.keeps} rotated files ({self.conf}) and this log has had "
                f"{self.newest} files")

    def missing_hints(self, first_seq: int, given: bool) -> list[str]:
        """Lines explaining a chain that does not begin at seq 1 (``first_seq`` its first)."""
        o, n, k = self.oldest, self.newest, self.keeps
        hints = []
        if o is not None and o > 1:
            hints.append(f"the oldest file read, {self.paths[0]}, is the log's file {o}: the {o - 1} file"
                         f"{'s' * (o > 2)} before it {'are' if o > 2 else 'is'} not here")
        elif o is None:
            hints.append(f"the oldest file read, {self.paths[0]}, does not say which file of the log it is (written "
                         "before files were numbered, or its first record is gone)")
        if given:
            hints.append("the files given may not be all of them: without FILE arguments verify reads the whole set")
        elif k is not None and o is not None and n is not None and o > 1:
            hints.append(f"logrotate keeps {k} rotated files of this log ({self.conf}) and it has had {n} files: it "
                         f"would still keep file{'s' * (o - 1 > max(1, n - k))} {max(1, n - k)}"
                         f"{f'..{o - 1}' if o - 1 > max(1, n - k) else ''}, so they were removed by other means")
        elif k is None:
            hints.append(f"{self.conf} does not say how many files of this log logrotate keeps")
        hints.append(f"if they were removed on purpose, --since-seq {first_seq} accepts a history that begins there")
        return hints


def _number(rec: dict[str, Any] | None) -> int | None:
    """The file number a log file's first record gives it (:func:`mcpd.common.audit.file_number`)."""
    return None if rec is None else file_number(json.dumps(rec).encode())


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
#: and the calls of the unprivileged route the kernel refused (``refused_by_os``)
DECISIONS = {"reject": ("reject", REFUSED_AT_OPEN, REFUSED_BY_OS)}


@dataclass(frozen=True)
class Filter:
    """Which records to show: ``user`` (principal or OS account), ``decision`` (``reject`` lists
    every refusal, see :data:`DECISIONS`), ``path`` (a glob over the requested and resolved path),
    ``since``/``until`` (aware datetimes, inclusive), ``event`` (``alert``, ``reload`` ...;
    ``login`` lists every login attempt, refused ones too, also as older logs recorded those:
    event ``reject`` with tool ``login``), ``route`` (the route column, :func:`route_of`)."""

    user: str | None = None
    decision: str | None = None
    path: str | None = None
    since: datetime.datetime | None = None
    until: datetime.datetime | None = None
    event: str | None = None
    route: str | None = None

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.user, self.decision, self.path, self.since, self.until, self.event,
                                           self.route))

    def match(self, rec: dict[str, Any]) -> bool:
        """Whether ``rec`` passes every filter given."""
        if self.event is not None and rec.get("event") != self.event and not (
                self.event == "login" and rec.get("tool") == "login" and rec.get("event") == "reject"):
            return False
        if self.route is not None and route_of(rec) != self.route:
            return False
        if self.user is not None and self.user not in (rec.get("user"), rec.get("os_user")):
            return False
        if self.decision is not None and rec.get("decision") not in DECISIONS.get(self.decision, (self.decision,)):
            return False
        if self.path is not None and not any(
                isinstance(p, str) and fnmatch.fnmatchcase(p, self.path)
                for p in (rec.get("requested_path"), rec.get("resolved_path"), rec.get("real_path"))):
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


class Order:
    """Watches the ``seq`` of the records a view reads, in the order it reads them (``backwards``:
    newest first), and counts those out of order or read twice (an old log copied over a newer
    one, records moved): a view that shows them says so (:meth:`warning`)."""

    def __init__(self, backwards: bool = False) -> None:
        self.backwards, self.count = backwards, 0
        self.example = ""
        self._last: tuple[int, str] | None = None

    def see(self, path: str, rec: dict[str, Any]) -> None:
        """Note record ``rec``, read from ``path``."""
        seq = rec.get("seq")
        if type(seq) is not int:
            return
        if self._last is not None and (seq >= self._last[0] if self.backwards else seq <= self._last[0]):
            self.count += 1
            if not self.example:
                (a, pa), (b, pb) = ((seq, path), self._last) if self.backwards else (self._last, (seq, path))
                self.example = f"seq {b} ({os.path.basename(pb)}) after seq {a} ({os.path.basename(pa)})"
        self._last = (seq, path)

    def warning(self, log: str) -> str | None:
        """The warning to show, or None when every record read was in order."""
        if not self.count:
            return None
        return (f"warning: {self.count} record{'s' * (self.count > 1)} of {log} out of order or repeated among those "
                f"read ({self.example}): the log was changed; run mcpd audit verify")


def last_records(paths: list[str], flt: Filter, count: int, end: int | None = None,
                 order: Order | None = None) -> list[tuple[bytes, dict[str, Any]]]:
    """The last ``count`` records of the files ``paths`` (oldest first: :func:`rotated_set`) that
    pass ``flt``, oldest first, each with its raw line: read from the end of the newest file
    backwards, so ``-n 5`` reads little even across a year of rotated files. ``end``: where the
    newest file is taken to end (bytes). Lines that are no JSON record are skipped. ``order``
    (backwards) sees every record read.

    Raises:
        OSError: a file cannot be read.
    """
    found: list[tuple[bytes, dict[str, Any]]] = []
    if count <= 0:
        return found
    for i, path in enumerate(reversed(paths)):
        for raw in backwards(path, end if i == 0 else None):
            rec = Line(path, raw).record()
            if rec is not None and order is not None:
                order.see(path, rec)
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

#: the arguments of ``files/find`` a record keeps, and how a readable line names them
FIND_FIELDS = (("find_name", "name"), ("find_type", "type"), ("max_depth", "max_depth"))


def _text(value: Any) -> str:
    """A field as shown on screen: :func:`~mcpd.common.printable.field`, so nothing a client sent
    (a path with a newline, an ESC, a bidi override, spaces that would fake columns) forges or
    hides a line or a column: escaped strictly, quoted when it holds a space, a quote or a
    backslash, shortened with a marker past :data:`~mcpd.common.printable.FIELD_CHARS`."""
    return field(str(value))


def _reason(rec: dict[str, Any]) -> str:
    """The reason column: the record's ``reason`` (:func:`_text`), then what the daemon adds in
    its own words: ``[CODE]``, the failure's detail, what a loss alert says was lost, a load's
    part and digest, the count of alerts suppressed."""
    reason = _text(rec.get("reason") or "-")
    if rec.get("outcome"):
        reason += f" [{_text(rec['outcome'])}]"
    if rec.get("reason_detail"):
        reason += f" (detail: {_text(rec['reason_detail'])})"
    if type(rec.get("missing_to")) is int:
        reason += f": {printable(loss_words(rec))}"
    if rec.get("parts"):
        reason += f" [part {_text(rec.get('part'))} of {_text(rec['parts'])}, sha256 {_text(str(rec.get('sha256') or 'none')[:12])}]"
    if rec.get("suppressed"):
        reason += f" (+{_text(rec['suppressed'])} like it suppressed)"
    return reason


def route_of(rec: dict[str, Any]) -> str:
    """The route column: the record's ``route``; for records without one, ``login`` for a login
    or logout (also one recorded as event ``reject`` with tool ``login``), ``privileged`` for
    another call the policy process recorded, ``start`` for the grants load of a daemon's start,
    else the event."""
    if rec.get("route"):
        return str(rec["route"])
    event = rec.get("event")
    if rec.get("tool") == "login" or event in ("login", "logout"):
        return "login"
    if event in ("accept", "reject"):
        return "privileged"
    if event == "reload" and rec.get("load") == "start":
        return "start"
    return str(event or "-")


def human(rec: dict[str, Any], source: str = "") -> str:
    """One record as a readable line: time, user (``principal(account)``), route, tool, path
    (``requested -> resolved`` when they differ; a find's ``name=``, ``type=``, ``max_depth=``),
    decision, reason, bytes, and the rule that decided (``grant``) when there is one; other events
    show their event name and the fields that say what. ``source``: where the record is from
    when the view mixes logs (``access log``), added at the end in brackets.
    Every field a client may control is shown by :func:`_text`: the line never spans two lines,
    a field never looks like two, and what a client sent shows as escapes."""
    when = str(rec.get("time", "?"))[:19].replace("T", " ")
    user, account = rec.get("user"), rec.get("os_user")
    who = f"{_text(user)}({_text(account)})" if user and account and user != account else _text(user or account or "-")
    path = rec.get("resolved_path") or rec.get("requested_path") or rec.get("grants_file") or rec.get("log_file") or "-"
    if rec.get("requested_path") and rec.get("resolved_path") and rec["requested_path"] != rec["resolved_path"]:
        path = f"{_text(rec['requested_path'])} -> {_text(rec['resolved_path'])}"
    else:
        path = _text(path)
    path += f" (opened {_text(rec['real_path'])})" if rec.get("real_path") else ""  # a symlink led there
    path += "".join(f" {label}={_text(rec[key])}" for key, label in FIND_FIELDS if rec.get(key) is not None)
    extra = f" pid={_text(rec['pid'])}" if "pid" in rec else ""
    size = rec.get("bytes")
    rule = f"  rule: {_text(rec['grant'])}" if rec.get("grant") else ""
    where = f"  [{source}]" if source else ""
    return (f"{printable(when)}  {who:<14} {_text(route_of(rec)):<12} {_text(rec.get('tool') or '-'):<14} {path}{extra}  "
            f"{_text(rec.get('decision') or '-')}  {_reason(rec)}  {'-' if size is None else _text(size)}{rule}{where}")


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
