"""The ``files/read`` tool: schema, description, argument validation, result shape
(docs/REFERENCE.md §3, §2.4, §2.5).

``parse_args`` is pure and trusts nothing: the front runs it, and the worker runs it again
before it reads anything (on the privileged route the policy process checks only the path).
"""

from __future__ import annotations

from typing import Any

from mcpd.common.validate import check_bool, check_choice, check_int, check_object, check_path
from mcpd.core.tools._schemas import ENCODINGS
from mcpd.helper.wire.errors import invalid_argument

NAME = "files/read"

DESCRIPTION = """Read a text file on the server. Returns the text raw (no line numbers) as one text item.

Arguments: path (absolute, required); start_line, end_line (integers >= 1); offset (integer >= 0, bytes); \
limit (integer >= 1, bytes); privileged (boolean, default false: read with root's rights under a \
mcp-sudo.yaml grant); encoding (utf-8 default, ascii, latin-1, cp1252, utf-16, auto, base64); decompress \
(boolean, default true); include_metadata (boolean: adds path, size, lines, encoding, language, \
lastModified, sha256 as structured content).

encoding base64 reads any file, binary too: the text item is the bytes of the window (offset, limit; \
10240 bytes without limit; at most 3/4 of the response cap) base64-encoded, and structured content gives \
byteRange {start, end}, next_offset (null at the end), eof, size, and fileId and version (the file read: \
another fileId = another file at the path; another version = it was written). Lines do not apply to it.

Compressed files (.gz, .xz, .bz2, .zst) are read as the text they decompress to: offsets and lines count in \
that text (a read further back decompresses again from the start); metadata names the compression. \
decompress false reads the file's own bytes (BINARY_FILE as text: use base64). A decompression bomb \
(ratio over 200, or text over 1 GiB) is FILE_TOO_LARGE; damaged data ENCODING_ERROR (reason corrupt).

Modes, in this precedence:
- line mode (start_line and/or end_line given): lines end at \\n only (\\r, \\f, U+2028 are ordinary \
characters); the lines come back byte-exact with their own terminators. start_line alone: to the end; \
end_line alone: from line 1; end_line < start_line: end_line ignored; end_line past the end: clamped. \
start_line past the end -> RANGE_OUT_OF_BOUNDS (details start_line, totalLines). A file has as many lines \
as \\n characters, plus one if the last byte is not \\n.
- byte mode (offset and/or limit given): offset alone returns up to 10240 bytes from offset, then a \
[WARNING: File truncated ...] line with the exact arguments of the next call when more remains; with \
limit, up to limit bytes and no warning. offset at or past the end returns "". Characters cut at either \
edge are left out.
- default mode: the whole file up to 10240 bytes; a longer file gives its first 10240 bytes (cut back to \
a whole character) and the truncation warning with the next call's arguments.

Redaction: when the server redacts secrets for this caller, each one reads [REDACTED:<kind>] (line numbers and byte offsets stay the file's; structuredContent.redacted counts them by kind), and a byte window shows whole lines only: a line it cuts is withheld and the warning names its offset.

An empty file reads as "" in every mode (start_line 1 included). A byte-order mark selects UTF-8/16/32 \
and is stripped. Errors (isError, structuredContent.error.code): INVALID_ARGUMENT, FILE_NOT_FOUND, \
PERMISSION_DENIED, NOT_A_REGULAR_FILE (directories, FIFOs, sockets, devices), BINARY_FILE (a NUL byte in \
the first 8 KiB), ENCODING_ERROR (details requestedEncoding, detectedEncoding: retry with that \
encoding), LINE_TOO_LONG (a selected line over 64 KiB: use offset/limit), FILE_TOO_LARGE (answer over \
the 10 MiB response cap: read a smaller range), HELPER_UNAVAILABLE, TIMEOUT, RATE_LIMITED."""

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "Absolute path of the file."},
        "start_line": {"type": "integer", "minimum": 1, "description": "First line (1-based) of a line range."},
        "end_line": {"type": "integer", "minimum": 1, "description": "Last line (inclusive) of a line range."},
        "offset": {"type": "integer", "minimum": 0, "description": "Byte offset of a byte range."},
        "limit": {"type": "integer", "minimum": 1, "description": "Maximum bytes of a byte range."},
        "privileged": {"type": "boolean", "default": False, "description": "Read through a sudo-style grant."},
        "encoding": {"type": "string", "enum": sorted(ENCODINGS), "default": "utf-8",
                     "description": "How the bytes are decoded; base64: the bytes themselves, base64-encoded."},
        "decompress": {"type": "boolean", "default": True,
                       "description": "Read a .gz/.xz/.bz2/.zst file as the text it decompresses to."},
        "include_metadata": {"type": "boolean", "default": False, "description": "Add file metadata."},
    },
    "required": ["path"],
    "additionalProperties": False,
}
#: none: ``structuredContent`` comes only with ``include_metadata`` (a declared schema would
#: require it in every answer)
OUTPUT_SCHEMA: dict[str, Any] | None = None

_INTS: dict[str, int] = {"start_line": 1, "end_line": 1, "offset": 0, "limit": 1}
_BOOLS = ("privileged", "include_metadata")
_KNOWN = frozenset(INPUT_SCHEMA["properties"])


def parse_args(args: Any) -> dict[str, Any]:
    """Validate ``files/read`` arguments (docs/REFERENCE.md §3, §2.5) with :mod:`mcpd.common.validate`.

    Args:
        args: the JSON ``arguments`` object as received (anything).

    Returns:
        ``{"path": str, "start_line", "end_line", "offset", "limit": int | None,
        "privileged": bool, "encoding": str, "decompress": bool, "include_metadata": bool}``.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` (details ``argument``) for a non-object, an unknown key,
            a missing, relative, over-long, NUL-containing or non-UTF-8 path, a wrong type
            (``true`` and ``3.0`` are not integers), a line number < 1, a negative offset, a
            limit < 1, an unknown encoding, a line range with ``encoding: base64``.
    """
    args = check_object(args, _KNOWN)
    out: dict[str, Any] = {"path": check_path(args, "path")}
    for name, low in _INTS.items():
        out[name] = check_int(args, name, None, low, None)
    for name in _BOOLS:
        out[name] = check_bool(args, name)
    out["encoding"] = check_choice(args, "encoding", ENCODINGS, "utf-8")
    out["decompress"] = check_bool(args, "decompress", True)
    if out["encoding"] == "base64" and (out["start_line"] is not None or out["end_line"] is not None):
        key = "start_line" if out["start_line"] is not None else "end_line"
        raise invalid_argument("encoding base64 reads bytes, not lines: use offset and limit", argument=key)
    return out


def format_result(result: dict[str, Any]) -> dict[str, Any]:
    """The MCP ``CallToolResult`` for a ``files/read`` result ``{"text", "metadata"?, "redacted"?}``:
    one raw text content item, and ``structuredContent`` = the metadata when present, with
    ``redacted`` (secrets replaced, by kind) when the answer was redacted. A base64 read is a text
    item too (of base64): every MCP client hands text items to its model, while blob resources
    are dropped or shown as an attachment by several."""
    reply: dict[str, Any] = {"content": [{"type": "text", "text": result["text"]}]}
    meta = result.get("metadata")
    if isinstance(result.get("redacted"), dict):
        meta = {**(meta or {}), "redacted": result["redacted"]}
    if meta is not None:
        reply["structuredContent"] = meta
    return reply
