"""The tools' ``outputSchema`` (docs/REFERENCE.md §2.4): JSON Schema of the ``structuredContent``
each tool answers, listed to sessions of 2025-06-18 and later.

Every schema admits the tool's own result and the error object of an ``isError`` result
(``{"error": {"code", "message", "details"?}}``, docs/REFERENCE.md §2.5): a tool that declares a
schema must answer ``structuredContent`` matching it, and a client may check error results too.
``files/read`` declares none: its ``structuredContent`` comes only with ``include_metadata``.
"""

from __future__ import annotations

from typing import Any

_STR: dict[str, Any] = {"type": "string"}
_INT: dict[str, Any] = {"type": "integer", "minimum": 0}
_BOOL: dict[str, Any] = {"type": "boolean"}
_TYPES = ["file", "dir", "symlink", "fifo", "socket", "char", "block", "unknown"]


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """An object with ``properties``, all of them ``required`` unless a list says which."""
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


#: the ``structuredContent`` of an ``isError`` result
ERROR: dict[str, Any] = _object({"error": _object(
    {"code": _STR, "message": _STR, "details": {"type": "object"}}, ["code", "message"])})

_PATH_REASON = _object({"path": _STR, "reason": _STR})

LIST: dict[str, Any] = _object({
    "path": _STR,
    "kind": {"enum": ["directory", "entry"]},
    "entries": {"type": "array", "items": _object({
        "name": _STR, "type": {"enum": _TYPES}, "size": _INT, "mode": _STR, "permissions": _STR,
        "owner": {"type": ["string", "integer"]}, "group": {"type": ["string", "integer"]}, "mtime": _STR,
        "target": _STR,
    }, ["name", "type", "size", "mode", "permissions", "owner", "group", "mtime"])},
    "total": _INT,
    "truncated": _BOOL,
    "note": _nullable(_STR),
})

FIND: dict[str, Any] = _object({
    "root": _STR,
    "matches": {"type": "array", "items": _object({"path": _STR, "type": {"enum": _TYPES}})},
    "truncated": _BOOL,
    "stopped": {"enum": [None, "max_results", "time_budget"]},
    "scanned": _INT,
    "errors": {"type": "array", "items": _PATH_REASON},
    "error_count": _INT,
})

FILETYPE: dict[str, Any] = _object({
    "path": _STR, "type": {"enum": _TYPES}, "size": _INT, "mime": _STR, "target": _STR,
    "description": _STR, "text": _BOOL, "encoding": _nullable(_STR), "bom": _BOOL,
    "line_endings": {"enum": [None, "LF", "CRLF", "CR", "mixed", "none"]},
    "line_ending_counts": _nullable(_object({"LF": _INT, "CRLF": _INT, "CR": _INT})),
    "sampled_bytes": _INT,
}, ["path", "type", "size", "mime"])

_LINES: dict[str, Any] = {"type": "array", "items": _STR}
GREP: dict[str, Any] = _object({
    "path": _STR,
    "matches": {"type": "array", "items": _object(
        {"path": _STR, "line": {"type": "integer", "minimum": 1}, "byte_offset": _INT, "text": _STR,
         "before": _LINES, "after": _LINES}, ["path", "line", "byte_offset", "text"])},
    "files_searched": _INT,
    "files_matched": _INT,
    "bytes_searched": _INT,
    "files_skipped": {"type": "object", "additionalProperties": _INT},
    "skipped": {"type": "array", "items": _PATH_REASON},
    "truncated": _BOOL,
    "stopped": {"enum": [None, "max_matches", "answer_size", "time_budget", "byte_limit"]},
    "next_cursor": _nullable(_STR),
})


def output_schema(result: dict[str, Any]) -> dict[str, Any]:
    """A tool's ``outputSchema``: an object that is its ``result`` or the error object."""
    return {"type": "object", "anyOf": [result, ERROR]}
