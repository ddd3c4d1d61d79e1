"""One rule for putting text a client controls on a human's screen: :func:`printable`, and
:func:`field` for one field of a line an auditor reads.

A path, a principal's name or a reason may hold newlines, terminal escapes or bidirectional
overrides; printed as they are, they forge lines in an auditor's view (``audit tail``), recolour
a terminal or reorder what a reader sees. Every readable rendering of such text (audit views,
grant tools, log lines, ``linuxctl list``/``find``) passes it through :func:`printable`; JSON
output does not need to (JSON escapes control characters itself).

Spaces are visible, but in a line of several fields they forge field boundaries: a path of
``"/x  accept  granted"`` reads as three columns. The audit views therefore show each field a
client controls through :func:`field`: escaped strictly, quoted when it holds a space, a quote or
a backslash (the quote inside written ``\\"``), and shortened past a length with an explicit
marker giving its full length.
"""

from __future__ import annotations

import unicodedata

#: characters that change how the text around them is shown, though Unicode calls some of them
#: printable: bidirectional marks, embeddings, overrides and isolates, and the line separators
_REORDERING = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029")

#: Unicode's default-ignorable code points (DerivedCoreProperties.txt, Default_Ignorable_Code_Point):
#: a renderer shows nothing for them, so two names differing only by one look the same. Some are
#: letters (U+115F, U+3164 Hangul fillers) or marks (U+034F, the variation selectors) that Python
#: calls printable; all are escaped.
_IGNORABLE = ((0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
              (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
              (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
              (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))

#: the general categories of combining marks (nonspacing, enclosing): escaped by the strict form only
_MARKS = frozenset({"Mn", "Me"})

#: how many characters :func:`field` shows of one field before it shortens it
FIELD_CHARS = 200


def ignorable(code: int) -> bool:
    """Whether the code point ``code`` is default-ignorable (see :data:`_IGNORABLE`)."""
    return any(lo <= code <= hi for lo, hi in _IGNORABLE)


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _shown(ch: str, strict: bool, line: bool = False) -> str:
    """``ch`` as :func:`printable` writes it."""
    if ch == "\\":
        return ch if line else "\\\\"
    if ch == " " or (line and ch == "\t"):
        return ch
    if not ch.isprintable() or ch in _REORDERING:
        return _escape(ch)
    category = unicodedata.category(ch)
    if category == "Cf" or ignorable(ord(ch)) or (strict and category in _MARKS):
        return _escape(ch)
    return ch


def printable(text: str, strict: bool = False, line: bool = False) -> str:
    """``text`` with everything that is not plainly visible written as an escape.

    Args:
        text: any string (lone surrogates included).
        strict: also escape combining marks (categories Mn and Me, such as U+0336, the
            strike-through). Names in many scripts hold them (Devanagari vowel signs, Hebrew
            points, a decomposed ``é``), so a listing of names (``linuxctl list``) keeps them; the
            audit views, which must show exactly what was sent, use the strict form.
        line: the text is a file's line shown as ``grep -rn`` shows it (``linuxctl grep``): a tab
            and a backslash stay themselves (they cannot forge a line or move the cursor), all
            the rest is escaped as below. Not one-to-one (a line holding the four characters
            ``\\x1b`` looks like one holding ESC), so never for a name or an audit field.
    Returns:
        a string of visible characters and plain spaces only: a backslash becomes ``\\\\``;
        control characters (C0, DEL, C1, so newline, carriage return, tab and ESC), format
        characters (Unicode category Cf: zero-width and bidirectional controls), the line and
        paragraph separators, every default-ignorable code point (Hangul fillers, variation
        selectors, tags, U+034F ...), unassigned code points and lone surrogates become
        ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``. The mapping is one-to-one, so two different
        inputs never look the same, and the result never spans two lines.
    """
    if text.isascii() and text.isprintable() and (line or "\\" not in text):
        return text  # the usual case: nothing to do
    return "".join(_shown(ch, strict, line) for ch in text)


_QUOTE_IF = frozenset(' "\\')


def field(text: str, limit: int | None = FIELD_CHARS) -> str:
    """``text`` as one field of a readable line of several (the audit views): never mistaken for
    two fields, for part of another, or for a field of other text.

    Args:
        text: a value a client may control (a path, a name, a pattern, a reason quoting one).
        limit: the most characters shown before the field is shortened (None: never).
    Returns:
        :func:`printable` ``(text, strict=True)``, as it is when that holds no space, quote or
        backslash (and is not empty); else between double quotes, a quote inside written ``\\"``
        (a backslash is already ``\\\\``). Longer than ``limit``: quoted, its first characters,
        the closing quote, then ``…[N chars]`` with ``N`` the length of ``text`` (a marker no
        field can hold outside its quotes). One-to-one, as :func:`printable` is.
    """
    shown = printable(text, strict=True)
    if text and not _QUOTE_IF.intersection(shown) and (limit is None or len(shown) <= limit):
        return shown
    units = [('\\"' if ch == '"' else ch) for ch in text] if shown == text else \
        [_shown(ch, True).replace('"', '\\"') for ch in text]
    total = sum(map(len, units)) + 2
    if limit is None or total <= limit:
        return '"' + "".join(units) + '"'
    kept, size = [], 2
    for unit in units:
        if size + len(unit) > limit:
            break
        kept.append(unit)
        size += len(unit)
    return '"' + "".join(kept) + f'"\u2026[{len(text)} chars]'
