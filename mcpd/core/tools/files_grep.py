"""The ``files/grep`` tool: search file contents for a pattern, in one file or a tree, like ``grep -rn``.

Schema, description and the text of the op's result. The argument checks are
:func:`mcpd.core.grepargs.parse_grep_args`; the search is :mod:`mcpd.core.fileops.grep`.
"""

from __future__ import annotations

import json
from typing import Any

from mcpd.common.greplines import grep_lines
from mcpd.core.grepargs import BUDGET, BUDGET_MAX, CONTEXT_MAX, MATCHES, MATCHES_MAX, MAX_GLOB, MAX_GLOBS, MAX_PATTERN
from mcpd.core.grepargs import parse_grep_args as parse_args
from mcpd.core.tools._outputs import GREP, output_schema
from mcpd.core.tools._schemas import PATH_SCHEMA, PRIVILEGED_SCHEMA

NAME = "files/grep"
DESCRIPTION = (
    "Search file contents on the server for a pattern, like `grep -rn`: `path` is one file or a folder searched "
    "recursively (depth first, in name order). `pattern` is an RE2 regular expression (linear time; no "
    "backreferences or lookaround) matched line by line, or a literal string with `fixed_string: true`; "
    "`ignore_case`, `word` (whole words), `invert` (lines that do not match). `include`/`exclude`: globs on file "
    "names; `max_depth` (1 = the folder's own files); `follow_symlinks` (default false; loops detected). `context`: "
    f"lines before and after each match (max {CONTEXT_MAX}). Files ending in .gz, .xz, .bz2, .zst are searched "
    "decompressed; binary files (a NUL byte in the first 8 KiB) are skipped and counted. Answer: `path:line:text` "
    "lines (context lines `path-line-text`), and `structuredContent` with `matches`, `files_searched`, "
    f"`files_skipped` by reason. Stops at `max_matches` (default {MATCHES}, max {MATCHES_MAX}), after "
    f"`time_budget_seconds` (default {BUDGET}, max {BUDGET_MAX}) or at the byte limits, and then gives "
    "`next_cursor`: call again with the same arguments and `cursor` set to it for the rest. `privileged: true` "
    "searches under an mcp-sudo.yaml grant for files/grep: each file the grant covers is opened by the "
    "server and searched with your account's worker; files the grant does not cover are counted as `not_granted`. "
    "When the server redacts secrets for this caller, the "
    "text is searched and shown redacted ([REDACTED:<kind>]; `structuredContent.redacted` counts them)."
)
_GLOBS: dict[str, Any] = {"oneOf": [
    {"type": "string", "minLength": 1, "maxLength": MAX_GLOB},
    {"type": "array", "maxItems": MAX_GLOBS, "items": {"type": "string", "minLength": 1, "maxLength": MAX_GLOB}}]}
INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "pattern": {"type": "string", "maxLength": MAX_PATTERN, "description": "RE2 pattern (or a literal string)."},
        "path": {**PATH_SCHEMA, "description": "Absolute path of a file or of a folder to search."},
        "fixed_string": {"type": "boolean", "default": False},
        "ignore_case": {"type": "boolean", "default": False},
        "word": {"type": "boolean", "default": False},
        "invert": {"type": "boolean", "default": False},
        "include": {**_GLOBS, "description": "Only files whose name matches one of these globs."},
        "exclude": {**_GLOBS, "description": "No file whose name matches one of these globs."},
        "max_depth": {"type": "integer", "minimum": 1},
        "follow_symlinks": {"type": "boolean", "default": False},
        "context": {"type": "integer", "minimum": 0, "maximum": CONTEXT_MAX, "default": 0},
        "max_matches": {"type": "integer", "minimum": 1, "maximum": MATCHES_MAX, "default": MATCHES},
        "time_budget_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": BUDGET_MAX, "default": BUDGET},
        "max_file_bytes": {"type": "integer", "minimum": 1, "description": "Per-file limit (at most the server's)."},
        "max_total_bytes": {"type": "integer", "minimum": 1, "description": "Bytes searched in all (at most the server's)."},
        "cursor": {"type": "string", "description": "next_cursor of the previous call, to go on where it stopped."},
        "privileged": PRIVILEGED_SCHEMA,
    },
    "required": ["pattern", "path"],
    "additionalProperties": False,
}
#: the ``structuredContent`` it answers (listed to sessions of 2025-06-18 and later)
OUTPUT_SCHEMA: dict[str, Any] | None = output_schema(GREP)
__all__ = ["DESCRIPTION", "INPUT_SCHEMA", "OUTPUT_SCHEMA", "NAME", "format_result", "parse_args"]
_STOPS = {"max_matches": "stopped at max_matches", "answer_size": "stopped: the answer reached its size limit",
          "time_budget": "stopped when the time budget ran out", "byte_limit": "stopped at the limit of bytes searched"}


def format_result(result: dict[str, Any]) -> dict[str, Any]:
    """The MCP ``CallToolResult``: ``grep -rn`` lines, then a summary and notes; ``structuredContent`` is the op result.

    Args:
        result: :func:`mcpd.core.fileops.grep.Search.result`'s dict.
    """
    matches = result.get("matches", [])
    lines = grep_lines(matches)
    n, searched = len(matches), result.get("files_searched", 0)
    skipped = result.get("files_skipped", {})
    tail = f", {sum(skipped.values())} skipped ({', '.join(f'{k}: {v}' for k, v in skipped.items())})" if skipped \
        else ""
    lines.append(f"[{n} {'match' if n == 1 else 'matches'} in {result.get('files_matched', 0)} of {searched} "
                 f"{'file' if searched == 1 else 'files'} searched under {result['path']}{tail}]")
    if skipped.get("not_granted"):
        n = skipped["not_granted"]
        lines.append(f"[NOTE: {n} {'file' if n == 1 else 'files'} in the folders searched {'is' if n == 1 else 'are'} "
                     "not covered by your grant for files/grep: not searched, and not named]")
    if result.get("stopped"):
        again = json.dumps({"cursor": result.get("next_cursor")})
        lines.append(f"[NOTE: {_STOPS.get(result['stopped'], 'stopped')}; the rest: call again with the same "
                     f"arguments and {again}]")
    return {"content": [{"type": "text", "text": "\n".join(lines)}], "structuredContent": result}
