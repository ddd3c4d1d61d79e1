"""Matching lines for ``files/grep``: the pattern as RE2 compiles it, and one file's text scanned line by line.

RE2 (``google-re2``) matches in time linear in the text, whatever the pattern: ``(a*)*b`` on a
long line of ``a`` answers at once. The pattern is compiled once per call, for UTF-8 text, with
``^``/``$`` at line ends and no match ever spanning a newline; a pattern holding newlines is
several patterns, any of which matches (as grep's). ``fixed_string`` matches the pattern
literally, ``word`` only where it is neither preceded nor followed by a word character (RE2's
ASCII ``\\b``), ``ignore_case`` folds case (Unicode simple folding).

The text is searched as bytes, each piece read (:mod:`mcpd.core.grepread`) whole by RE2 (not a
Python loop per line): bytes that are not UTF-8 are matched by no character class, ``.``
included, but never stop a search, and a line shown is decoded with each such byte written
``\\xNN``. Lines end at ``\\n``; a line over :data:`PIECE` bytes is searched in pieces of that
size (a match across two pieces is missed), each with the line's number. A line shown is cut at
:data:`SHOW_BYTES` bytes, around the match, with the bytes left out said in ``[... N bytes]``
markers.

With redaction (docs/REFERENCE.md §3 "Redaction", :class:`Redaction`) each block of whole lines is
redacted first (:mod:`mcpd.core.redact`) and the pattern searched in what is left, so no pattern
can find a secret, or tell it by what matches; line numbers and byte offsets stay the file's.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mcpd.helper.wire.errors import invalid_argument

PIECE = 1024 * 1024  # bytes: the longest line searched whole
LAZY_BYTES = 64 * 1024 * 1024  # bytes of a file passed uncounted at most (:func:`scan`'s ``recount``)
SHOW_BYTES = 2048  # bytes of a line shown
_SPECIAL = frozenset("\\.+*?()|[]{}^$")


def compile_pattern(args: dict[str, Any]) -> Any:
    """The compiled RE2 pattern of parsed ``files/grep`` arguments (bytes patterns, byte offsets).

    Raises:
        ToolError: ``INVALID_ARGUMENT`` (argument ``pattern``) with RE2's reason, e.g.
            ``invalid pattern: missing ): (``; backreferences and lookaround are not RE2.
    """
    import re2

    parts = args["pattern"].split("\n")
    if args["fixed_string"]:
        parts = ["".join("\\" + c if c in _SPECIAL else c for c in p) for p in parts]
    body = "|".join(f"(?:{p})" for p in parts) if len(parts) > 1 else parts[0]
    if args["word"]:
        body = f"\\b(?:{body})\\b"
    opts = re2.Options()
    opts.never_nl, opts.log_errors, opts.case_sensitive = True, False, not args["ignore_case"]
    opts.max_mem = 64 * 1024 * 1024
    try:
        return re2.compile(("(?m)" + body).encode("utf-8"), opts)
    except re2.error as exc:
        why = exc.args[0] if exc.args else "not an RE2 pattern"
        why = why.decode("utf-8", "backslashreplace") if isinstance(why, bytes) else str(why)
        why = why.partition(": ")[0]  # RE2 names the part of the pattern after the colon: ours, wrapped
        raise invalid_argument(f"invalid pattern: {why[:300]} (RE2 syntax)", argument="pattern") from None


def literal(args: dict[str, Any]) -> bytes | None:
    """The bytes a ``files/grep`` pattern matches exactly, when it is one ASCII literal (no RE2
    special character unless ``fixed_string``, no newline, no ``ignore_case`` or ``word``): then
    ``pattern in text`` tells, as the compiled pattern's search does, whether any line matches;
    None for every other pattern (and the empty one, which matches every line)."""
    p = args["pattern"]
    if not p or not p.isascii() or "\n" in p or args["ignore_case"] or args["word"] or \
            not args["fixed_string"] and any(c in _SPECIAL for c in p):
        return None
    return p.encode("ascii")


def show(raw: bytes, at: int = 0) -> str:
    """Line ``raw`` as text (module docstring), cut around byte ``at`` when over :data:`SHOW_BYTES`."""
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if len(raw) <= SHOW_BYTES:
        return raw.decode("utf-8", "backslashreplace")
    start = 0 if at < SHOW_BYTES - 256 else min(at - 128, len(raw) - SHOW_BYTES)
    end = start + SHOW_BYTES
    while start > 0 and 0x80 <= raw[start] < 0xC0 and at - start < 256:  # not inside a character
        start -= 1
    while end < len(raw) and 0x80 <= raw[end] < 0xC0:
        end -= 1
    text = raw[start:end].decode("utf-8", "backslashreplace")
    return (f"[... {start} bytes] " if start else "") + text + f" [... {len(raw) - end} more bytes]"


@dataclass
class Budget:
    """What one call may still take (shared by every file of the call); the scan stops when it is gone."""

    max_matches: int
    answer_bytes: int  # of text shown, contexts included
    total_bytes: int  # of text searched
    deadline: float  # time.monotonic() seconds
    matches: list[dict[str, Any]] = field(default_factory=list)
    searched: int = 0  # bytes
    shown: int = 0  # bytes
    #: (path, line) -> kind -> markers the file itself holds on that line (literal text, no redaction)
    own_marks: dict[tuple[str, int], dict[str, int]] = field(default_factory=dict)

    def add(self, match: dict[str, Any], size: int) -> str | None:
        """Keep ``match`` (``size`` bytes of text shown); the stop reason when the budget is now spent."""
        self.matches.append(match)
        self.shown += size
        if len(self.matches) >= self.max_matches:
            return "max_matches"
        return "answer_size" if self.shown >= self.answer_bytes else None


@dataclass
class Redaction:
    """The detectors of a redacted search, and whether the text searched next starts inside a private key block."""

    detectors: tuple[str, ...]
    inside: bool = False
    mid_line: bool = False  # the text searched next starts inside a line (a long one, or where a cursor pointed)


def shown_marks(matches: list[dict[str, Any]], detectors: tuple[str, ...],
                literal: dict[tuple[str, int], dict[str, int]] | None = None) -> dict[str, int]:
    """The secrets redacted in the lines an answer shows, by kind: each marker shown counts once,
    less the markers the file itself holds on that line (``literal``: :attr:`Budget.own_marks`)."""
    counts: dict[str, int] = {}
    for m in matches:
        before, after = m.get("before", ()), m.get("after", ())
        lines = [m["line"] - len(before) + i for i in range(len(before))] + [m["line"]] \
            + [m["line"] + 1 + i for i in range(len(after))]
        for text, at in zip([*before, m["text"], *after], lines):
            if "[REDACTED:" in text:
                forged = (literal or {}).get((m["path"], at), {})
                for kind in detectors:
                    if (n := text.count(f"[REDACTED:{kind}]") - forged.get(kind, 0)) > 0:
                        counts[kind] = counts.get(kind, 0) + n
    return counts


LONG_LINE = b"[WITHHELD: part of a line, not searched]"


def _redacted(block: bytes, secrets: Redaction, piece: bool) -> bytes:
    """``block`` redacted (its lines kept).
    ``piece``: the block ends inside a line over :data:`PIECE` bytes; such a line (its start here,
    its rest in the blocks after) is :data:`LONG_LINE`, never searched, as a piece could cut a
    secret; so is the rest of a line a search resumed inside (``secrets.mid_line``)."""
    from mcpd.core import redact

    first = block.find(b"\n")
    if secrets.mid_line and first < 0:
        out = LONG_LINE
    else:
        a = first + 1 if secrets.mid_line else 0
        b = block.rfind(b"\n") + 1 if piece else len(block)
        mid, _ = redact.redact(block[a:b], secrets.detectors, secrets.inside)
        out = (LONG_LINE + b"\n" if secrets.mid_line else b"") + mid + (LONG_LINE if piece else b"")
    secrets.inside = "private-key" in secrets.detectors and redact.still_inside(secrets.inside, block)
    secrets.mid_line = piece
    return out


def _line_starts(block: bytes) -> list[int]:
    """The offset in ``block`` of each of its line starts."""
    starts, p = [0], block.find(b"\n")
    while p >= 0:
        starts.append(p + 1)
        p = block.find(b"\n", p + 1)
    return starts


@dataclass
class Stop:
    """Where and why a scan stopped early: go on at byte ``offset`` of the text, line ``line``."""

    reason: str
    offset: int
    line: int


def _spans(regex: Any, block: bytes, invert: bool, size: int) -> Iterator[tuple[int, int, int]]:
    """``(start, end, match start)`` of each selected line of ``block[:size]`` (``end`` before its
    ``\\n``), searched as a text that ends at ``size`` (a view, not a copy)."""
    text = block if size == len(block) else memoryview(block)[:size]
    pos = 0
    ends_line = size > 0 and block[size - 1] == 0x0A
    while pos < size:
        m = regex.search(text, pos)
        if m is not None and ends_line and m.start() >= size:
            m = None  # an empty match after the block's last newline is no line (the next block's first starts there)
        hit = size if m is None else block.rfind(b"\n", 0, m.start()) + 1
        if invert:
            while pos < hit:
                end = block.find(b"\n", pos, hit)
                end = hit if end < 0 else end
                yield pos, end, pos
                pos = end + 1
            if m is None:
                return
        elif m is None:
            return
        end = block.find(b"\n", m.start(), size)
        end = size if end < 0 else end
        if not invert:
            yield hit, end, m.start()
        pos = end + 1


def _before(block: bytes, start: int, n: int, prev: collections.deque[bytes]) -> list[bytes]:
    """The ``n`` lines before the line at ``start`` (from the previous block's tail when need be)."""
    out: list[bytes] = []
    pos = start
    while len(out) < n and pos > 0:
        begin = block.rfind(b"\n", 0, pos - 1) + 1
        out.append(block[begin:pos - 1])
        pos = begin
    if len(out) < n:
        out.extend(list(prev)[::-1][:n - len(out)])
    return out[::-1]


def _after(block: bytes, pos: int, n: int, size: int) -> list[bytes]:
    """Up to ``n`` lines of ``block[:size]`` from ``pos`` (a line start) on."""
    out: list[bytes] = []
    while len(out) < n and pos < size:
        end = block.find(b"\n", pos, size)
        end = size if end < 0 else end
        out.append(block[pos:end])
        pos = end + 1
    return out


def scan(pieces: Iterable[bytes], regex: Any, path: str, args: dict[str, Any], budget: Budget,
         offset: int = 0, line: int = 1, now: Any = None, secrets: Redaction | None = None,
         recount: Callable[[int, int], int] | None = None) -> Stop | None:
    """Search one file's text (``pieces``, from byte ``offset``, line ``line``) into ``budget``.

    Each selected line becomes ``{"path", "line", "byte_offset", "text"}`` (plus ``before`` and
    ``after``, lists of the context lines' texts, when ``args["context"]``). Returns None at the
    end of the text, or a :class:`Stop` when the budget is spent (``max_matches``,
    ``answer_size``) or, checked after each piece, its bytes (``byte_limit``) or time
    (``time_budget``; ``now`` is the clock) ran out. ``secrets``: search and show the text redacted
    (module docstring). ``recount(start, end)``: the number of ``\\n`` in the text's bytes
    ``start`` to ``end`` (file offsets), read again; given, a block without a selected line is not
    counted as it passes, only when a later match or a stop needs the line number (counting
    ``\\n`` costs more than searching: a file nothing matches is never counted); past
    :data:`LAZY_BYTES` uncounted bytes the file is counted as it passes, so a stop (its time
    budget spent) never waits long for its line number. Not used with ``secrets``. Raises what
    ``pieces`` (or ``recount``) raises.
    """
    lazy = recount is not None and secrets is None
    counted = offset  # file offset ``line`` is the number of; below ``offset`` when blocks were passed uncounted

    def sync() -> None:  # bring ``line`` to ``offset``
        nonlocal line, counted
        if counted < offset:
            assert recount is not None
            line += recount(counted, offset)
            counted = offset

    n, invert = args["context"], args["invert"]
    prev: collections.deque[bytes] = collections.deque(maxlen=max(n, 1))
    waiting: list[tuple[dict[str, Any], int]] = []  # matches still owed after-context, and how many lines
    stop: Stop | None = None
    carry = b""
    it = iter(pieces)
    done = False
    while not done:
        chunk = next(it, None)
        if chunk is None:
            done, data = True, carry
        else:
            data = carry + chunk if carry else chunk
        cut = len(data) if done else data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) < PIECE:
                carry = data
                continue
            cut = len(data)
        if not cut:
            continue
        # the block is block[:size], not copied out of data (a 1 MiB copy per read costs more than the search)
        block, size, carry = data, cut, data[cut:]
        raw_len, starts, raw = size, None, None  # the file's bytes in this block (redaction changes the block's)
        if secrets is not None:
            raw = data[:cut]
            block = _redacted(raw, secrets, not done and not raw.endswith(b"\n"))
            size = len(block)
            if b"[REDACTED:" in raw:  # the file's own marker text is no redaction (shown_marks)
                from mcpd.core.redact import literal_marks
                budget.own_marks.update(((path, line + i), n) for i, n in literal_marks(raw, block).items())
        if waiting:
            lines = _after(block, 0, max(k for _, k in waiting), size)
            for owed, k in waiting:
                owed["after"].extend(show(x) for x in lines[:k])
            waiting = []
        if stop is not None:
            return stop
        seen, at_line, selected = 0, line, False
        for start, end, hit in _spans(regex, block, invert, size):
            if not selected:
                selected = True
                sync()
                at_line = line
            at_line += block.count(b"\n", seen, start)
            seen = start
            text = show(block[start:end], hit - start)
            if raw is not None and starts is None:
                starts = _line_starts(raw)  # the file's offsets, not the redacted text's (on a first match only)
            at = start if starts is None else starts[at_line - line]
            match: dict[str, Any] = {"path": path, "line": at_line, "byte_offset": offset + at, "text": text}
            shown = len(text)
            if n:
                match["before"] = [show(x) for x in _before(block, start, n, prev)]
                after = _after(block, end + 1, n, size)
                match["after"] = [show(x) for x in after]
                shown += sum(len(x) for x in match["before"]) + sum(len(x) for x in match["after"])
                if len(after) < n and end + 1 >= size and not done:
                    waiting.append((match, n - len(after)))
            why = budget.add(match, shown)
            if why is not None:
                nxt = end + 1 if starts is None else starts[at_line - line + 1] if at_line - line + 1 < len(starts) \
                    else raw_len
                stop = Stop(why, offset + nxt, at_line + 1)
                break
        if n:
            prev.extend(_before(block, size, n, prev) if block.endswith(b"\n", 0, size) else [])  # its last lines
        budget.searched += raw_len
        if stop is not None:
            if not waiting or done:
                return stop
            continue
        if not lazy or selected:
            line += block.count(b"\n", 0, size)
            counted += raw_len
        offset += raw_len
        if lazy and offset - counted >= LAZY_BYTES:  # a long file: counted from here on as it passes
            sync()
            lazy = False
        if not done and budget.searched >= budget.total_bytes:
            sync()
            return Stop("byte_limit", offset, line)
        if not done and now is not None and now() > budget.deadline:
            sync()
            return Stop("time_budget", offset, line)
    return None
