"""Text a client controls cannot forge or disguise a line in a readable view."""

from __future__ import annotations

from hypothesis import given, strategies as st

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
