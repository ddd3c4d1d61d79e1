"""Redaction of a ``files/read`` page: whole lines only, then the detectors (docs/REFERENCE.md §3 "Redaction").

Detection works on whole lines, so a redacted byte window never shows part of a line: a line the
window's start or end cuts is withheld (the text starts after it, or ends before it) and the
answer's byte range and truncation warning name the bytes actually shown, which are the
original file's bytes: paging on from the warning's offset never skips or splits a line. A window
inside one line (a line longer than the window) shows :data:`LONG_LINE` instead, its byte range
the whole window. A page that starts inside a private key block (judged on the
:data:`mcpd.core.redact.LOOKBACK` bytes before it) is redacted from its start to the block's end.
"""

from __future__ import annotations

from mcpd.core import redact, textdecode
from mcpd.core.rawread import Pread, pread_full

LONG_LINE = "[WITHHELD: this window lies inside one line; read that line whole with start_line/end_line]"


def _nbytes(text: str, codec: str) -> int:
    return len(text.encode(codec, "surrogatepass" if codec.startswith("utf") else "strict"))


def _line_starts_at(rd: Pread, pos: int, codec: str, bom: int) -> bool:
    """Whether byte ``pos`` of the file begins a line (the file's start, or a ``\\n`` before it)."""
    if pos <= bom:
        return True
    unit = textdecode.unit(codec)
    if pos - unit < bom:
        return False
    return pread_full(rd, unit, pos - unit).decode(codec, "ignore") == "\n"


def whole_lines(rd: Pread, text: str, first: int, end: int, codec: str, bom: int, at_eof: bool) -> tuple[str, int, int]:
    """The byte window ``[first, end)`` decoded as ``text``, cut to whole lines (module docstring):
    ``(text, first, end)``. ``at_eof``: the window reaches the end of the file (its last line,
    even unterminated, is whole)."""
    if text and not _line_starts_at(rd, first, codec, bom):
        i = text.find("\n")
        if i < 0:
            return LONG_LINE, first, end
        first += _nbytes(text[: i + 1], codec)
        text = text[i + 1:]
    if text and not at_eof and not text.endswith("\n"):
        j = text.rfind("\n")
        if j < 0:
            return LONG_LINE, first, end
        end -= _nbytes(text[j + 1:], codec)
        text = text[: j + 1]
    return text, first, end


def redact_page(rd: Pread, text: str, first: int, codec: str, bom: int,
                detectors: tuple[str, ...]) -> tuple[str, dict[str, int]]:
    """``text`` (whole lines from byte ``first`` of the file) with its secrets redacted, and the counts by kind."""
    if text == LONG_LINE:
        return text, {}
    inside = "private-key" in detectors and redact.inside_at(rd, first, codec, bom)
    return redact.redact_text(text, detectors, inside)
