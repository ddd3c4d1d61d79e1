"""One rule for putting text a client controls on a human's screen: :func:`printable`.

A path, a principal's name or a reason may hold newlines, terminal escapes or bidirectional
overrides; printed as they are, they forge lines in an auditor's view (``audit tail``), recolour
a terminal or reorder what a reader sees. Every readable rendering of such text (audit views,
grant tools, log lines, ``linuxctl list``/``find``) passes it through :func:`printable`; JSON
output does not need to (JSON escapes control characters itself).
"""

from __future__ import annotations

import unicodedata

#: characters that change how the text around them is shown, though Unicode calls some of them
#: printable: bidirectional marks, embeddings, overrides and isolates, and the line separators
_REORDERING = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029")


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with everything that is not plainly visible written as an escape.

    Args:
        text: any string (lone surrogates included).
    Returns:
        a string of visible characters and plain spaces only: a backslash becomes ``\\\\``;
        control characters (C0, DEL, C1, so newline, carriage return, tab and ESC), format
        characters (Unicode category Cf: zero-width and bidirectional controls), the line and
        paragraph separators, unassigned code points and lone surrogates become ``\\xNN``,
        ``\\uNNNN`` or ``\\UNNNNNNNN``. The mapping is one-to-one, so two different inputs never
        look the same, and the result never spans two lines.
    """
    if text.isascii() and text.isprintable() and "\\" not in text:
        return text  # the usual case: nothing to do
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == " " or (ch.isprintable() and ch not in _REORDERING and unicodedata.category(ch) != "Cf"):
            out.append(ch)
        else:
            out.append(_escape(ch))
    return "".join(out)
