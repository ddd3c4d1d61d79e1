"""File metadata for ``files/read`` with ``include_metadata``, ready for ``structuredContent``.

The checksum and the line count need the whole file: it is streamed once in 1 MiB chunks and
refused with ``FILE_TOO_LARGE`` past the response cap (a sparse 8 GB file is never hashed).
"""

from __future__ import annotations

import codecs
import datetime
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

from mcpd.common.config import ReadLimits
from mcpd.core import textdecode
from mcpd.helper.wire.errors import FILE_TOO_LARGE, ToolError

_CHUNK = 1024 * 1024

_SUFFIXES: dict[str, str] = {
    ".py": "python", ".pyi": "python-stub", ".yaml": "yaml", ".yml": "yaml", ".sh": "shell",
    ".bash": "shell", ".zsh": "shell", ".ini": "ini", ".cfg": "ini", ".json": "json",
    ".md": "markdown", ".markdown": "markdown", ".toml": "toml", ".c": "c", ".h": "c",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".ts": "typescript",
    ".go": "go", ".rs": "rust", ".rb": "ruby", ".pl": "perl", ".php": "php", ".java": "java",
    ".cpp": "cpp", ".cc": "cpp", ".hpp": "cpp", ".html": "html", ".css": "css", ".xml": "xml",
    ".sql": "sql", ".service": "systemd", ".socket": "systemd", ".timer": "systemd",
}
_NAMES: dict[str, str] = {"Dockerfile": "dockerfile", "Makefile": "makefile", "nginx.conf": "nginx"}
_SHEBANG = re.compile(rb"^#!\s*(?:/usr/bin/env\s+(?:-\S+\s+)*)?(?:\S*/)?([A-Za-z]+)")
_INTERPRETERS: dict[str, str] = {
    "python": "python", "sh": "shell", "bash": "shell", "dash": "shell", "zsh": "shell",
    "ksh": "shell", "node": "javascript", "perl": "perl", "ruby": "ruby", "php": "php",
}


def language(path: str, head: bytes) -> str:
    """A language name from the file name and shebang: ``python``, ``python-stub`` (.pyi), ``yaml``,
    ``shell``, ``ini``, ``nginx`` (anything under a folder named ``nginx``), ``json``,
    ``markdown``, ``toml``, ``c``, ``javascript`` ... or ``text``."""
    p = PurePosixPath(path)
    lang = _SUFFIXES.get(p.suffix.lower())
    if lang:
        return lang
    if p.name in _NAMES:
        return _NAMES[p.name]
    if any(part.startswith("nginx") for part in p.parts[:-1]):
        return "nginx"
    m = _SHEBANG.match(head[:256])
    if m:
        name = m.group(1).decode("ascii").lower()
        return _INTERPRETERS.get(name, "python" if name.startswith("python") else "text")
    return "text"


def _count_lines(last: str | bytes, newlines: int, seen: bool) -> int:
    return newlines + (1 if seen and last not in ("\n", b"\n") else 0)


def describe(
    rd: Callable[[int, int], bytes], st: os.stat_result, path: str, head: bytes, codec: str, bom: int,
    limits: ReadLimits, counted: bool = False,
) -> dict[str, Any]:
    """The metadata of an open file.

    Args:
        rd: ``(n, pos) -> bytes`` of the file (read from byte 0 to its end): its own bytes, or the
            text it decompresses to.
        st: its ``fstat`` (``size`` comes from here, in bytes, unless ``counted``: then ``size``
            is the bytes ``rd`` gave, and ``sha256`` theirs).
        path: the path as requested. head: the file's first bytes (for the shebang).
        codec: the codec actually used to decode the answer. bom: BOM length in bytes.
        limits: ``response_cap`` bounds the bytes hashed.

    Returns:
        ``{"path", "size", "lines", "encoding", "bom", "language", "lastModified", "sha256"}``;
        ``lastModified`` is ISO 8601 UTC, ``lines`` counts ``\\n`` plus an unterminated last line.

    Raises:
        ToolError: ``FILE_TOO_LARGE`` when the file is over the response cap (size or bytes read).
    """
    suggestion = "call again without include_metadata: files over the response cap are not hashed"
    cap = limits.response_cap
    if st.st_size > cap and not counted:
        raise ToolError(FILE_TOO_LARGE, "file too large to checksum", size=st.st_size, limit=cap, suggestion=suggestion)
    h = hashlib.sha256()
    wide = textdecode.is_wide(codec)
    dec = codecs.getincrementaldecoder(codec)(errors="replace") if wide else None
    pos, newlines, last = 0, 0, ""
    while True:
        b = rd(_CHUNK, pos)
        if not b:
            break
        h.update(b)
        body = b[max(0, bom - pos) :]
        pos += len(b)
        if pos > cap:
            raise ToolError(FILE_TOO_LARGE, "file too large to checksum", size=pos, limit=cap, suggestion=suggestion)
        piece: str | bytes = dec.decode(body) if dec is not None else body
        if piece:
            newlines += piece.count("\n" if wide else b"\n")  # type: ignore[arg-type]
            last = piece[-1:]  # type: ignore[assignment]
    mtime = datetime.datetime.fromtimestamp(st.st_mtime, tz=datetime.UTC)
    return {
        "path": path,
        "size": pos if counted else st.st_size,
        "lines": _count_lines(last, newlines, last != ""),
        "encoding": codec,
        "bom": bom > 0,
        "language": language(path, head),
        "lastModified": mtime.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "sha256": h.hexdigest(),
    }
