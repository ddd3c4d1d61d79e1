"""Encodings guessed right (issue 14): libmagic's verdict and charset-normalizer's combined, so
short Western text is Latin-1 or cp1252 (charset-normalizer alone says cp1006 for "café crème"),
while Cyrillic, Greek, Central European and CJK files still get charset-normalizer's answer. The
read core (ENCODING_ERROR's detectedEncoding, ``auto`` and its metadata) and files/filetype use
the one guess."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import charset_normalizer
import pytest

from mcpd.common.config import ReadLimits
from mcpd.core import fileopen, ops, textdecode
from mcpd.core.fileops.filetype import describe_bytes

CTX = ops.OpContext(limits=ReadLimits(), open_file=fileopen.open_regular, open_dir=fileopen.open_directory)

WESTERN = [
    ("café crème", "latin-1"),
    ("café crème\n", "latin-1"),
    ("Grüße aus Köln\n", "latin-1"),
    ("Größe und Maße: café, naïve résumé.\n" * 20, "latin-1"),
    ("naïve façade — “quoted” for 5 €\n", "cp1252"),
    ("Ça coûte 5 €.\n", "cp1252"),
]
OTHERS = [
    ("Привет, как дела? Это тестовый файл.\n", "cp1251"),
    ("Zażółć gęślą jaźń. Pchnąć w tę łódź jeża lub ośm skrzyń fig.\n", "cp1250"),
    ("Καλημέρα κόσμε, αυτό είναι ένα αρχείο.\n", "iso8859-7"),
    ("日本語のテキストファイルです。\n", "shift_jis"),
]


def read(path: Path, **args: Any) -> dict[str, Any]:
    reply = ops.run({"id": 1, "op": "files/read", "args": {"path": str(path), **args}}, dataclasses.replace(CTX))
    return dict(reply)


def test_charset_normalizer_alone_gets_short_latin1_wrong() -> None:
    """The reason for the combination: if this starts passing, the library improved."""
    best = charset_normalizer.from_bytes("café crème".encode("latin-1")).best()
    assert best is not None and best.encoding not in ("latin_1", "cp1252")


@pytest.mark.parametrize(("text", "encoding"), WESTERN)
def test_western_text_is_latin1_or_cp1252(text: str, encoding: str) -> None:
    assert textdecode.detect(text.encode(encoding)) == encoding


@pytest.mark.parametrize(("text", "encoding"), OTHERS)
def test_other_scripts_are_left_to_charset_normalizer(text: str, encoding: str) -> None:
    data = text.encode(encoding)
    guess = textdecode.detect(data)
    assert guess not in ("latin-1", "cp1252")
    assert data.decode(guess) == text


@pytest.mark.parametrize(("text", "encoding"), [*WESTERN, ("ünïcødé ☃ text\n", "utf-8")])
def test_read_core_reports_and_auto_decodes(tmp_path: Path, text: str, encoding: str) -> None:
    path = tmp_path / "sample.txt"
    path.write_bytes(text.encode(encoding))
    auto = read(path, encoding="auto", include_metadata=True)
    assert auto["ok"], auto
    assert auto["result"]["text"] == text
    assert auto["result"]["metadata"]["encoding"] == {"latin-1": "latin-1", "cp1252": "cp1252"}.get(encoding, "utf-8")
    if encoding != "utf-8":
        err = read(path)
        assert not err["ok"] and err["error"]["code"] == "ENCODING_ERROR"
        assert err["error"]["details"]["detectedEncoding"] == encoding
        again = read(path, encoding=err["error"]["details"]["detectedEncoding"])  # the hint is requestable
        assert again["ok"] and again["result"]["text"] == text


@pytest.mark.parametrize(("text", "encoding"), [*WESTERN, ("ünïcødé ☃ text\n", "utf-8")])
def test_filetype_reports_the_encoding(text: str, encoding: str) -> None:
    found = describe_bytes(text.encode(encoding), truncated=False)
    assert (found["text"], found["encoding"]) == (True, encoding)
