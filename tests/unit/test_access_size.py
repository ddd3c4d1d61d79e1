"""The ``bytes`` of an access record: UTF-8 bytes of the text answered (docs/REFERENCE.md §7.1)."""

from __future__ import annotations

from mcpd.front.access import answer_size


def test_bytes_are_the_answers_utf8_bytes_ascii_or_not() -> None:
    assert answer_size({"text": "x" * 4096}) == 4096
    assert answer_size({"text": "é" * 10}) == 20
    assert answer_size({"text": "a\udcff"}) == 4  # a lone surrogate as the worker sends it (surrogatepass)
    assert answer_size({"text": ""}) == 0
    assert answer_size({"entries": [1, 2, 3]}) == 3 and answer_size({"matches": [1]}) == 1
    assert answer_size(None) == 0 and answer_size({}) == 0
