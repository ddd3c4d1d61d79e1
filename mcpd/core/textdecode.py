"""Decoding for the reading core (docs/REFERENCE.md §3 "decoding", the ``encoding`` argument).

A byte-order mark selects UTF-8/16/32 and is stripped; otherwise the requested encoding is used
(default UTF-8). ``auto`` means: BOM, else UTF-8 when the bytes are valid UTF-8, else the guess of
:func:`detect` (libmagic and charset-normalizer combined); the metadata names the codec used. Invalid bytes are an ``ENCODING_ERROR`` naming the requested
encoding and a detected one.

A byte window (default and byte mode) can start or end inside a character; such cut characters
are left out, never mangled (:func:`decode_window`).

Choice (documented for docs/REFERENCE.md §3's notes): without a BOM, ``utf-16`` means UTF-16 little-endian,
and an explicit ``utf-16`` request skips the NUL-byte binary test, since UTF-16 text without a
BOM is full of NUL bytes.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

import charset_normalizer
import magic

from mcpd.core import magicdb
from mcpd.helper.wire.errors import ENCODING_ERROR, ToolError

# UTF-32 LE first: its BOM begins with the UTF-16 LE one.
_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_SAMPLE = 64 * 1024  # bytes given to charset-normalizer


@dataclass(frozen=True)
class Window:
    """A decoded byte window: ``text``; ``skip`` bytes left out at the start (a cut character);
    ``used`` bytes decoded after them (a cut character at the end is not counted); ``codec``
    actually used."""

    text: str
    skip: int
    used: int
    codec: str


def sniff_bom(head: bytes) -> tuple[str | None, int]:
    """The codec a BOM at the start of ``head`` selects and the BOM's length in bytes (or ``(None, 0)``)."""
    for bom, codec in _BOMS:
        if head.startswith(bom):
            return codec, len(bom)
    return None, 0


def unit(codec: str) -> int:
    """Code unit size in bytes: 2 for UTF-16, 4 for UTF-32, else 1."""
    if codec.startswith("utf-16"):
        return 2
    if codec.startswith("utf-32"):
        return 4
    return 1


def is_wide(codec: str) -> bool:
    """True when ``\\n`` is not the single byte 0x0A in ``codec`` (UTF-16/32): lines are then found
    in decoded text rather than in bytes."""
    return unit(codec) > 1


def _magic_encoding() -> magic.Magic:
    return magicdb.classifier("encoding")


def _western(sample: bytes, verdict: str) -> str | None:
    """``latin-1`` or ``cp1252`` when libmagic's ``verdict`` allows it and the bytes read as Western
    European text, else None.

    libmagic says ``iso-8859-1`` for bytes that hold no 0x80-0x9F (ISO-8859 text) and
    ``unknown-8bit`` when they do (cp1252 puts € “ ” — there). Either is only taken when the
    decoded text looks like a Latin-script language: ASCII letters are the majority (a Cyrillic or
    Greek single-byte file is nearly all high bytes), and no non-letter sits inside a word (cp1250
    Polish read as Latin-1 gives ``¿`` and ``³`` between letters).
    """
    codec = {"iso-8859-1": "latin-1", "unknown-8bit": "cp1252"}.get(verdict)
    if codec is None:
        return None
    try:
        text = sample.decode(codec)
    except UnicodeDecodeError:  # one of cp1252's five undefined bytes
        return None
    letters = sum(1 for ch in text if ch.isalpha())
    high = sum(1 for ch in text if ch.isalpha() and ord(ch) > 0x7F)
    if not letters or 2 * high > letters:
        return None
    for i in range(1, len(text) - 1):
        ch = text[i]
        if ord(ch) > 0x7F and not ch.isalpha() and text[i - 1].isalpha() and text[i + 1].isalpha():
            return None
    return codec


def detect(data: bytes) -> str:
    """The encoding of bytes that are not UTF-8: a name the ``encoding`` argument accepts when it
    can (``latin-1``, ``cp1252``), else a Python codec name, or ``"unknown"``.

    libmagic's verdict and charset-normalizer's are combined: charset-normalizer alone guesses
    short Western text badly (``café crème`` in Latin-1 comes out as cp1006, Urdu), while libmagic
    tells ISO-8859 from other 8-bit text but not which language. So Latin-1 or cp1252 is chosen
    when libmagic allows it and the text reads as a Latin-script language (:func:`_western`), and
    charset-normalizer decides otherwise (Cyrillic, Greek, CJK, Central European ...). A sample of
    at most 64 KiB is used.
    """
    sample = data[:_SAMPLE]
    western = _western(sample, str(_magic_encoding().from_buffer(sample)).lower())
    if western is not None:
        return western
    best = charset_normalizer.from_bytes(sample).best()
    return best.encoding if best is not None else "unknown"


def encoding_error(data: bytes, requested: str, where: int = 0) -> ToolError:
    """An ``ENCODING_ERROR`` for ``data`` not decodable as ``requested``; the detected encoding is
    guessed from the bytes around byte index ``where``."""
    lo = max(0, where - _SAMPLE // 2)
    detected = detect(data[lo : lo + _SAMPLE])
    return ToolError(
        ENCODING_ERROR,
        f"the file is not valid {requested}; it looks like {detected}",
        requestedEncoding=requested,
        detectedEncoding=detected,
    )


def _lead_skip(data: bytes, codec: str, rel: int) -> int:
    """Bytes to leave out at the start of a window beginning ``rel`` bytes into the text (after the
    BOM) because they belong to a character that starts before the window."""
    if codec == "utf-8":
        n = 0
        while n < min(3, len(data)) and 0x80 <= data[n] <= 0xBF:
            n += 1
        return n
    size = unit(codec)
    if size > 1:
        n = (-rel) % size
        if size == 2 and len(data) >= n + 2:
            first = int.from_bytes(data[n : n + 2], "little" if codec.endswith("le") else "big")
            if 0xDC00 <= first <= 0xDFFF:  # low surrogate
                n += 2
        return n
    if codecs.lookup(codec).name in ("latin-1", "iso8859-1", "ascii", "cp1252"):
        return 0
    for n in range(min(4, len(data))):  # other multibyte guesses: first offset that decodes
        try:
            codecs.getincrementaldecoder(codec)().decode(data[n : n + 16], final=False)
            return n
        except UnicodeDecodeError:
            continue
    return 0


def _decode(data: bytes, codec: str, requested: str, final: bool, cut_start: bool, rel: int) -> Window:
    skip = _lead_skip(data, codec, rel) if cut_start else 0
    body = data[skip:] if skip else data
    try:
        if final:  # to the end of the file: all of it decodes, nothing is left pending (a small file read whole)
            return Window(body.decode(codec), skip, len(body), codec)
        decoder = codecs.getincrementaldecoder(codec)()
        text = decoder.decode(body, final=False)
    except UnicodeDecodeError as exc:
        raise encoding_error(data, requested, skip + exc.start) from None
    pending = len(decoder.getstate()[0])  # a cut last character (incl. a half surrogate pair)
    return Window(text, skip, len(body) - pending, codec)


def decode_window(
    data: bytes, codec: str, requested: str, *, final: bool, cut_start: bool = False, rel: int = 0
) -> Window:
    """Decode a window of file bytes.

    Args:
        data: the window's bytes (no BOM).
        codec: a Python codec name, or ``"auto"``.
        requested: the ``encoding`` argument as the caller gave it (for error details).
        final: the window ends at end of file (a cut last character is then an error, not left out).
        cut_start: the window may begin inside a character (byte mode with an offset).
        rel: the window's start in bytes after the BOM (aligns UTF-16/32 code units).

    Raises:
        ToolError: ``ENCODING_ERROR`` with ``requestedEncoding`` and ``detectedEncoding``.
    """
    if codec != "auto":
        return _decode(data, codec, requested, final, cut_start, rel)
    try:
        return _decode(data, "utf-8", requested, final, cut_start, rel)
    except ToolError:
        guess = detect(data)
        if guess == "unknown":
            raise encoding_error(data, requested) from None
        return _decode(data, guess, requested, final, cut_start, rel)
