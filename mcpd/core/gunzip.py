"""A gzip stream read like :class:`gzip.GzipFile`, its headers parsed by zlib.

The standard library's ``GzipFile`` reads a member header's ``FNAME`` and ``FCOMMENT`` fields one
byte per read of the file object, in Python: a ``.gz`` whose header holds megabytes of comment
costs seconds before the first byte of text, so a search's time budget (checked between pieces of
text) could not stop it. Here zlib (``wbits=31``: gzip framing, CRC-32 and length checked) parses
each member whole, headers included, fed :data:`FEED` bytes at a time; members follow one another
as ``gzip`` allows, zero bytes between or after them are padding.
"""

from __future__ import annotations

import zlib
from typing import Any

FEED = 8 * 1024  # compressed bytes read at a time: what was read is about what was used (the bomb ratio)


class GzipStream:
    """``read(n)`` of the text of the gzip data that ``raw.read(n)`` gives (a file object, or
    anything with ``read``); ``read`` answers ``b""`` at its end.

    Raises (from ``read``): ``EOFError`` when the data ends inside a member; ``zlib.error`` for
    damaged data (a bad header, check value or length, or trailing bytes that are no member)."""

    def __init__(self, raw: Any) -> None:
        self._raw, self._in, self._member, self._ended = raw, b"", None, False
        self._z: Any = None

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes of text (``n < 0``: up to 1 MiB), fewer
        only where a member ends or at the end; ``b""`` at the end."""
        want = n if n is not None and n >= 0 else 1024 * 1024
        while not self._ended and want:
            if not self._in:
                self._in = self._raw.read(FEED)
                if not self._in:
                    if self._z is not None:
                        raise EOFError("compressed file ended before the end-of-stream marker was reached")
                    self._ended = True
                    break
            if self._z is None:
                self._in = self._in.lstrip(b"\0")
                if not self._in:
                    continue
                self._z = zlib.decompressobj(31)
            out = self._z.decompress(self._in, want)
            if self._z.eof:
                self._in, self._z = self._z.unused_data, None
            else:
                self._in = self._z.unconsumed_tail
            if out:
                return out
        return b""

    def close(self) -> None:
        self._z, self._in, self._ended = None, b"", True
