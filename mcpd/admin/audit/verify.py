"""``mcpd audit verify``'s judgement: every break of a log's hash chain, and what it is.

The chain (:mod:`mcpd.common.audit.chain`): record ``n`` carries ``seq`` and ``prev``, the
hash of record ``n-1``'s exact bytes (newline included). :func:`verify` walks lines in file order
(oldest first) and lists every break it finds (edited, deleted, reordered, repeated, truncated,
lost, missing), not only the first, from seq 1 unless told where history may begin
(docs/REFERENCE.md §7.2). Memory is bounded: the last :data:`SEEN_KEPT` records are remembered.

Limits, as for any hash chain without an outside anchor: a consistent rewrite by whoever can
write the log and its writer's head state is invisible here; the journal copy of each record is
that anchor.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mcpd.admin.audit.logfiles import Line
from mcpd.common.audit.chain import GENESIS
from mcpd.common.audit.head import Head


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
    whole chain; ``None``: anywhere). ``head``: the writer's head state (:func:`~mcpd.common.audit.head.read_head_at`),
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
            same = earlier is not None and earlier[0] == digest
            if repeats and repeats[2] == seq - 1 and follows:
                repeats[2], repeats[4] = seq, repeats[4] and same  # one forged record: not all copies
            else:
                repeats[:] = [add(line.where, ""), seq, seq, earlier[1] if earlier else None, same]
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
