"""Text a client controls cannot forge or disguise a line in a readable view."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mcpd.common.printable import printable


def test_a_newline_and_a_forged_suffix_stay_on_one_visible_line() -> None:
    forged = "/tmp/x\n2026-12-01T00:00:00Z  admin  privileged  files/read /etc/shadow  accept granted"
    shown = printable(forged)
    assert "\n" not in shown and "\\x0a" in shown
    assert shown.startswith("/tmp/x\\x0a2026")


def test_terminal_escapes_and_bidi_overrides_are_written_as_escapes() -> None:
    assert printable("a\x1b[31mred\x1b[0m") == "a\\x1b[31mred\\x1b[0m"
    assert printable("\u202eevil") == "\\u202eevil"
    assert printable("x\u2028y\u2066z\u200bw") == "x\\u2028y\\u2066z\\u200bw"
    assert printable("\r\t\x7f\x85") == "\\x0d\\x09\\x7f\\x85"


def test_lone_surrogates_and_backslashes_are_unambiguous() -> None:
    assert printable("a\udcffb") == "a\\udcffb"
    assert printable("\\x0a") == "\\\\x0a"  # a literal backslash is never mistaken for an escape
    assert printable("\n") != printable("\\x0a")


def test_ordinary_text_is_unchanged() -> None:
    for text in ("/var/log/syslog", "/srv/données/été.txt", "/home/ø/日本語 file.txt", ""):
        assert printable(text) == text


@given(st.text())
def test_never_two_lines_and_one_to_one(text: str) -> None:
    shown = printable(text)
    assert len(shown.splitlines()) <= 1
    assert all(ch == " " or (ch.isprintable() and ord(ch) not in (0x2028, 0x2029)) for ch in shown)


@given(st.text(), st.text())
def test_different_texts_never_look_the_same(a: str, b: str) -> None:
    if a != b:
        assert printable(a) != printable(b)


# -- default-ignorable code points and combining marks -----------------------------------------

#: code points a renderer shows as nothing, though Python calls some of them printable
IGNORABLE = [0x00AD, 0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180B, 0x180E, 0x180F, 0x200B, 0x2060, 0x3164,
             0xFE00, 0xFE0F, 0xFEFF, 0xFFA0, 0x1D173, 0xE0000, 0xE0001, 0xE0041, 0xE0100, 0xE01EF, 0xE0FFF]


def test_default_ignorable_code_points_are_always_escaped() -> None:
    for code in IGNORABLE:
        for strict in (False, True):
            shown = printable(f"a{chr(code)}b", strict=strict)
            assert shown != f"a{chr(code)}b" and shown.startswith("a\\") and shown.endswith("b"), (hex(code), shown)
    assert printable("\u3164") == "\\u3164" and printable("x\U000e0100") == "x\\U000e0100"


def test_combining_marks_are_kept_in_names_and_escaped_in_the_strict_form() -> None:
    struck = "/srv/secret\u0336.txt"  # U+0336 strikes through the letter before it
    assert printable(struck) == struck
    assert printable(struck, strict=True) == "/srv/secret\\u0336.txt"
    for name in ("नमस्ते", "שָׁלוֹם", "e\u0301t\u0301e\u0301", "\u20dd"):  # Mn marks, and an enclosing one (Me)
        assert printable(name) == name
        assert printable(name, strict=True) != name and "\\u" in printable(name, strict=True)


@given(st.text())
def test_the_strict_form_shows_no_mark_and_no_form_shows_an_ignorable(text: str) -> None:
    import unicodedata

    from mcpd.common.printable import ignorable

    loose, strict = printable(text), printable(text, strict=True)
    assert not any(ignorable(ord(ch)) for ch in loose + strict)
    assert not any(unicodedata.category(ch) in ("Mn", "Me") for ch in strict)
    assert len(strict.splitlines()) <= 1


@given(st.text(), st.text())
def test_the_strict_form_is_one_to_one_too(a: str, b: str) -> None:
    if a != b:
        assert printable(a, strict=True) != printable(b, strict=True)


# -- one field of a line of several ------------------------------------------------------------


def unfield(shown: str) -> str:
    """The text :func:`field` showed as ``shown`` (not shortened): the auditor's reading of it."""
    import re

    if shown.startswith('"'):
        assert shown.endswith('"') and len(shown) >= 2
        shown = shown[1:-1]
    out, i = [], 0
    while i < len(shown):
        if shown[i] != "\\":
            out.append(shown[i])
            i += 1
            continue
        m = re.compile(r'\\(\\|"|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})').match(shown, i)
        assert m is not None, shown[i:]
        token = m.group(1)
        out.append(token if token in ('\\', '"') else chr(int(token[1:], 16)))
        i = m.end()
    return "".join(out)


def test_a_field_with_spaces_is_quoted_so_it_cannot_forge_columns() -> None:
    from mcpd.common.printable import field

    forged = "/x  accept  granted  25  rule: users.a files/read paths /x (mcp-sudo.yaml:3)"
    assert field(forged) == f'"{forged}"'
    assert field("alice(t29alice) privileged   files/read     /etc/shadow  accept") \
        == '"alice(t29alice) privileged   files/read     /etc/shadow  accept"'
    assert field("/srv/data/app/log.txt") == "/srv/data/app/log.txt"  # the usual case: as it is
    assert field('a"b') == '"a\\"b"' and field("a\\b") == '"a\\\\b"' and field("") == '""'
    assert field("x\ny") == '"x\\x0ay"'


def test_an_overlong_field_is_shortened_with_a_marker_and_its_length() -> None:
    from mcpd.common.printable import FIELD_CHARS, field

    padded = "/x  accept  granted" + "/" + " " * 250 + "/" * 3000
    shown = field(padded)
    assert len(shown) < FIELD_CHARS + 30
    assert shown.startswith('"/x  accept  granted') and shown.endswith(f'"\u2026[{len(padded)} chars]')
    long_plain = "/srv/" + "a" * 500
    assert field(long_plain).endswith('"\u2026[505 chars]') and field(long_plain, limit=None) == long_plain
    escaped = "\n" * 300  # never cut inside an escape
    assert field(escaped).count("\\x0a") * 4 + 2 == len(field(escaped).split("\u2026")[0])


@given(st.text())
def test_a_field_reads_back_as_the_text_and_never_holds_a_bare_space(text: str) -> None:
    from mcpd.common.printable import field

    shown = field(text, limit=None)
    assert unfield(shown) == text
    if not shown.startswith('"'):
        assert " " not in shown and '"' not in shown and "\\" not in shown and shown
    assert len(shown.splitlines()) <= 1


@given(st.text(), st.text())
def test_different_fields_never_look_the_same(a: str, b: str) -> None:
    from mcpd.common.printable import field

    if a != b:
        assert field(a, limit=None) != field(b, limit=None)


def test_line_mode_keeps_tab_and_backslash_and_escapes_what_forges_a_line() -> None:
    from mcpd.common.printable import printable as shown
    assert shown("a\tb\\c", line=True) == "a\tb\\c"
    assert shown("a\tb\\c") == "a\\x09b\\\\c"  # names and audit fields keep the one-to-one form
    for ch, esc in (("\r", "\\x0d"), ("\n", "\\x0a"), ("\x1b", "\\x1b"), ("\x07", "\\x07"), ("\x7f", "\\x7f"),
                    ("\u0085", "\\x85"), ("\u202e", "\\u202e"), ("\u2028", "\\u2028"), ("\u200b", "\\u200b")):
        assert shown(f"x{ch}y", line=True) == f"x{esc}y"
