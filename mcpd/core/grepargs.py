"""``files/grep``'s arguments and its cursor (docs/REFERENCE.md §3 ``files/grep``).

Pure and standard-library only, like :mod:`mcpd.core.walk`: the front, the worker and the
privileged walker parse a call alike. The pattern is checked here for its shape only (a string of
at most :data:`MAX_PATTERN` characters); it is compiled, and refused when it is no RE2 pattern,
where it is used (:mod:`mcpd.core.grepscan`), so the front loads no regex engine.

A cursor is an opaque string the tool gives back when it stopped early: base64url of
``{"v": 1, "q": QUERY, "p": PATH, "o": OFFSET | null, "n": LINE}``. ``QUERY`` is a hash of the
arguments that decide what matches (pattern, flags, path, filters, depth, symlinks, route), so a
cursor is refused for another search; ``PATH`` is where to go on: with ``OFFSET`` (a byte offset
of the file's text, decompressed for a compressed file) that file from that line (``LINE``, its
number) on, with ``null`` whatever comes after it in the walk's order. A cursor grants nothing:
every file it leads to is opened and judged as on a first call.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any

from mcpd.common.validate import check_bool, check_int, check_number, check_object, check_path
from mcpd.helper.wire.errors import invalid_argument

MAX_PATTERN, MAX_GLOB, MAX_GLOBS, MAX_CURSOR = 4096, 1024, 32, 8192  # characters; globs per list
CONTEXT_MAX = 10  # lines before and after a match
MATCHES, MATCHES_MAX = 200, 1000  # max_matches: default and largest
BUDGET, BUDGET_MAX = 10, 60  # time_budget_seconds: default and largest (docs/REFERENCE.md §2.5 deadline)
KEYS = ("pattern", "fixed_string", "ignore_case", "word", "invert", "path", "include", "exclude", "max_depth",
        "follow_symlinks", "context", "max_matches", "time_budget_seconds", "max_file_bytes", "max_total_bytes",
        "cursor", "privileged")
#: the arguments a cursor is bound to: what decides which lines match, and where
QUERY_KEYS = ("pattern", "fixed_string", "ignore_case", "word", "invert", "path", "include", "exclude", "max_depth",
              "follow_symlinks", "privileged")


def _globs(a: dict[str, Any], key: str) -> tuple[str, ...]:
    value = a.get(key)
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) > MAX_GLOBS or not all(
            isinstance(g, str) and 0 < len(g) <= MAX_GLOB and "\0" not in g and "/" not in g for g in items):
        raise invalid_argument(f"{key} must be a glob or a list of at most {MAX_GLOBS} globs on file names "
                               f"(1 to {MAX_GLOB} characters, no '/')", argument=key)
    return tuple(items)


def parse_grep_args(args: Any) -> dict[str, Any]:
    """Validate ``files/grep`` arguments (run by the front, the worker and the walker).

    Returns every key of :data:`KEYS`: ``pattern`` (str), the four flags (bool), ``path``,
    ``include``/``exclude`` (tuples of globs), ``max_depth`` (int | None), ``follow_symlinks``,
    ``context`` (0..10), ``max_matches`` (1..1000), ``time_budget_seconds`` (float),
    ``max_file_bytes``/``max_total_bytes`` (int | None: the configured limits), ``cursor`` (the
    string, checked: :func:`cursor_of` decodes it) and ``privileged``; the dict is valid arguments
    again (the front passes it on to the worker, which parses it again).

    Raises:
        ToolError: ``INVALID_ARGUMENT`` naming the argument: a bad path or number, an unknown key,
            a pattern that is not a string of at most 4096 characters (or holds a lone
            surrogate), a bad glob list, ``follow_symlinks`` with ``privileged``, or a cursor that
            is malformed or was given by another search.
    """
    a = check_object(args, KEYS)
    pattern = a.get("pattern")
    if not isinstance(pattern, str) or len(pattern) > MAX_PATTERN:
        raise invalid_argument(f"pattern must be a string of at most {MAX_PATTERN} characters", argument="pattern")
    try:
        pattern.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid_argument("pattern is not valid UTF-8 (lone surrogate)", argument="pattern") from None
    out: dict[str, Any] = {
        "pattern": pattern, "fixed_string": check_bool(a, "fixed_string"), "ignore_case": check_bool(a, "ignore_case"),
        "word": check_bool(a, "word"), "invert": check_bool(a, "invert"), "path": check_path(a, "path"),
        "include": _globs(a, "include"), "exclude": _globs(a, "exclude"),
        "max_depth": check_int(a, "max_depth", None, 1, None), "follow_symlinks": check_bool(a, "follow_symlinks"),
        "context": check_int(a, "context", 0, 0, CONTEXT_MAX),
        "max_matches": check_int(a, "max_matches", MATCHES, 1, MATCHES_MAX),
        "time_budget_seconds": check_number(a, "time_budget_seconds", BUDGET, 0, BUDGET_MAX),
        "max_file_bytes": check_int(a, "max_file_bytes", None, 1, None),
        "max_total_bytes": check_int(a, "max_total_bytes", None, 1, None),
        "privileged": check_bool(a, "privileged"),
    }
    if out["follow_symlinks"] and out["privileged"]:
        raise invalid_argument("follow_symlinks is not available with privileged", argument="follow_symlinks")
    out["cursor"] = a.get("cursor")
    decode_cursor(out["cursor"], query_hash(out))
    return out


def cursor_of(parsed: dict[str, Any]) -> dict[str, Any] | None:
    """The decoded cursor of parsed arguments (``{"p", "o", "n"}``), or None."""
    return decode_cursor(parsed["cursor"], query_hash(parsed))


def query_hash(parsed: dict[str, Any]) -> str:
    """The hash a cursor carries: of the :data:`QUERY_KEYS` of parsed arguments (16 hex digits)."""
    canon = json.dumps([parsed[k] if not isinstance(parsed[k], tuple) else list(parsed[k]) for k in QUERY_KEYS],
                       separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()[:16]


def encode_cursor(parsed: dict[str, Any], path: str, offset: int | None, line: int) -> str:
    """The cursor that resumes this search at ``path`` (module docstring)."""
    body = {"v": 1, "q": query_hash(parsed), "p": path, "o": offset, "n": line}
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(value: Any, query: str) -> dict[str, Any] | None:
    """The cursor ``value`` as ``{"p", "o", "n"}``, or None when absent.

    Raises:
        ToolError: ``INVALID_ARGUMENT`` (argument ``cursor``) for a string this tool did not give,
            or one given by a search with other arguments.
    """
    if value is None:
        return None
    bad = invalid_argument("cursor is not one files/grep gave: pass next_cursor back unchanged", argument="cursor")
    if not isinstance(value, str) or not 0 < len(value) <= MAX_CURSOR:
        raise bad
    try:
        body = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except (ValueError, binascii.Error):
        raise bad from None
    if not isinstance(body, dict) or body.get("v") != 1 or set(body) != {"v", "q", "p", "o", "n"}:
        raise bad
    path, offset, line = body["p"], body["o"], body["n"]
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path or not _count(line, 1) or not (
            offset is None or _count(offset, 0)):
        raise bad
    if body["q"] != query:
        raise invalid_argument("cursor belongs to another search: pattern, path, filters and flags must stay the same",
                               argument="cursor")
    return {"p": path, "o": offset, "n": line}


def _count(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low
