"""Building one audit record: the field rules and the record's canonical encoding.

A record is one JSON object on one line, plain ASCII, members in a fixed order: ``seq`` and
``prev`` (the chain, added by the writer: :mod:`mcpd.common.audit.chain`), ``time`` (ISO 8601
UTC, microseconds), ``event``, then the fields in the order given. Field names are short lower
case words; names that say secret or contents (``token``, ``password``, ``content`` ...) are
refused, values must be scalars, and a string over :data:`MAX_VALUE_CHARS` is cut, ending in
:data:`CUT` (docs/REFERENCE.md §7).

The usual fields: ``user`` (principal), ``os_user``, ``token_id``, ``peer``, ``session``,
``tool``, ``requested_path``, ``resolved_path``, ``real_path`` (what root opened, when a symlink
led elsewhere), ``grant``, ``decision``, ``reason``, ``outcome``, ``bytes``, ``duration_ms``,
``route``, ``pid``, ``suppressed``. This module holds no file and no chain state: the writer is
:mod:`mcpd.common.audit.writer`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import re
import time
from typing import Any

FORBIDDEN_KEYS = frozenset({"token", "password", "passwd", "secret", "content", "contents"})
_EVENT_RE = re.compile(r"[a-z][a-z_]{0,31}")  # whole names only (fullmatch: "$" would let a final newline by)
_KEY_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")  # (sha256: digits too)
MAX_VALUE_CHARS = 4096  # longer strings are cut, ending in CUT (a path is at most 4096 bytes anyway)
CUT = "\u2026"  # the last character of a value cut to MAX_VALUE_CHARS
_RESERVED = ("seq", "prev", "time", "event")


class AuditError(ValueError):
    """A record that must not be written (forbidden key, bad event name or value type)."""


def _forbidden(key: str) -> bool:
    return key in FORBIDDEN_KEYS or any(key.endswith("_" + word) for word in FORBIDDEN_KEYS)


@functools.lru_cache(maxsize=1024)
def _key_error(key: str) -> str | None:
    """Why ``key`` may not be a field name (None when it may); cached, as records repeat the same
    few keys."""
    if not _KEY_RE.fullmatch(key) or key in _RESERVED:
        return f"bad audit field name {key!r}"
    if _forbidden(key):
        return f"audit field {key!r} is never logged"
    return None


_encode = json.JSONEncoder(ensure_ascii=True, separators=(",", ":")).encode  # one encoder, not one per record
string_json = json.encoder.encode_basestring_ascii  # the encoder's own string writer (its C one)


def _value(value: Any) -> str:
    """``value`` (a scalar :func:`_clean` let through) as :data:`_encode` writes it, the same
    characters (property-tested), without the encoder's per-call set-up for the common kinds: a
    record is written for every call."""
    kind = type(value)
    if kind is str:
        return string_json(value)
    if value is None:
        return "null"
    if kind is int:
        return int.__repr__(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is float and value - value == 0:  # finite (NaN and the infinities are not)
        return float.__repr__(value)
    return _encode(value)  # subclasses of int and str, NaN, the infinities


def _clean(value: Any, key: str) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):  # a longer one is cut, and says so
        return value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS - 1] + CUT
    raise AuditError(f"audit field {key!r} must be a string, number, boolean or null")


def record_body(event: str, fields: dict[str, Any], now: datetime.datetime | None = None, first: str = "") -> str:
    """``"time":...,"event":...``, then ``first`` (fields already encoded, see :class:`Fields`),
    then ``fields``, checked and encoded, without braces. ``now``: the record's time (default: the
    clock), converted to UTC when it has a time zone, taken as UTC when it has none.

    Raises:
        AuditError: a bad event name, or a field :func:`field_members` refuses.
    """
    if not _EVENT_RE.fullmatch(event):
        raise AuditError(f"bad audit event {event!r}")
    head = f'"time":"{_time_text(now)}","event":"{event}"'  # both plain ASCII, as checked
    return ",".join([p for p in (head, first, field_members(fields)) if p])


_second: tuple[int, str] = (-1, "")  # the clock's last whole second (since the epoch) and its text


def _time_text(now: datetime.datetime | None) -> str:
    """A record's ``time``: ``now`` (default: the clock), in UTC (converted when it has a time
    zone, taken as UTC when it has none), as ISO 8601 with microseconds and ``Z``:
    ``2026-01-02T03:04:05.000007Z``. The clock's date and time of day are formatted once a second,
    not once a record (one is written for every call)."""
    global _second
    if now is not None:
        now = now.astimezone(datetime.UTC) if now.tzinfo is not None else now
        return f'{now.replace(tzinfo=None).isoformat(timespec="microseconds")}Z'
    second, nanos = divmod(time.time_ns(), 1_000_000_000)
    known = _second  # (one read: another thread may replace it meanwhile)
    if known[0] != second:
        known = _second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{known[1]}.{nanos // 1000:06d}Z"


def field_members(fields: dict[str, Any]) -> str:
    """``fields`` checked and encoded as JSON object members, in order (no braces; ``""`` for
    none). The leading run of fields that are strings or null (a call's who, what and decision)
    is encoded once and remembered: the same session reading the same path gives the same
    members; the fields after it (counts, durations) are encoded each time."""
    items = tuple(fields.items())
    text = 0
    for _, value in items:
        if type(value) is not str and value is not None:
            break
        text += 1
    head = _text_members(items[:text]) if text else ""
    if text == len(items):
        return head
    tail = _encode_members(items[text:])
    return f"{head},{tail}" if head and tail else head or tail


@functools.lru_cache(maxsize=512)
def _text_members(items: tuple[tuple[str, str | None], ...]) -> str:
    return _encode_members(items)


def _encode_members(items: tuple[tuple[str, Any], ...]) -> str:
    """``items`` (key, value pairs, keys distinct) checked (:func:`_key_error`, :func:`_clean`)
    and written as JSON object members, in order: what ``_encode(dict(items))[1:-1]`` gives. Keys
    need no escaping (:data:`_KEY_RE`)."""
    members = []
    for key, value in items:
        if (error := _key_error(key)) is not None:
            raise AuditError(error)
        members.append(f'"{key}":{_value(_clean(value, key))}')
    return ",".join(members)


def record_line(body: str, seq: int | None, prev: str | None) -> str:
    """One record from its encoded ``body``, the chain members first when ``seq`` is given."""
    if seq is None:
        return "{" + body + "}"
    return f'{{"seq":{_value(seq)},"prev":{_value(prev)},{body}}}'


def format_record(event: str, fields: dict[str, Any], now: datetime.datetime | None = None,
                  seq: int | None = None, prev: str | None = None) -> str:
    """Build one audit line (JSON, no trailing newline), validating it: ``seq`` and ``prev`` first
    when given (the chain), then ``time``, ``event`` and ``fields`` in order.

    Raises:
        AuditError: bad event name, a key naming a secret or contents, or a non-scalar value.
    """
    return record_line(record_body(event, fields, now), seq, prev)


@dataclasses.dataclass(frozen=True)
class Fields:
    """Record fields checked and encoded once (:func:`encode_fields`), to begin any number of
    records (:meth:`~mcpd.common.audit.writer.AuditLog.record_with`): a writer whose records repeat
    the same who and what (the front's, one per call) encodes them once, not once per record."""

    text: str  # the fields as JSON object members, in order, without braces
    keys: frozenset[str]


def refuse_twice(keys: frozenset[str], fields: dict[str, Any]) -> None:
    """Raise :class:`AuditError` when ``fields`` names a field of ``keys`` (already encoded) again."""
    if not keys.isdisjoint(fields):
        raise AuditError(f"audit fields given twice: {sorted(keys & fields.keys())}")


def encode_fields(**fields: Any) -> Fields:
    """``fields`` checked and encoded as :meth:`~mcpd.common.audit.writer.AuditLog.record` would write them.

    Raises:
        AuditError: a key naming a secret or contents, a bad key, or a non-scalar value.
    """
    return Fields(_encode_members(tuple(fields.items())), frozenset(fields))


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A record checked and encoded ahead of its writing (:meth:`~mcpd.common.audit.writer.AuditLog.prepare`)."""

    body: str  # "time", "event" and the fields given so far, encoded, without braces
    keys: frozenset[str]


FIND_ARGS = (("name", "find_name"), ("type", "find_type"), ("max_depth", "max_depth"))  # argument -> field


#: what a ``files/grep`` record keeps of its pattern: its SHA-256 (hex) and length, never the pattern
GREP_FIELDS = ("pattern_sha256", "pattern_length")


def find_fields(tool: str, arguments: Any) -> dict[str, Any]:
    """What a ``files/find`` call searched for, as record fields (``find_name``, ``find_type``,
    ``max_depth``), from its raw ``arguments`` (a value that is no scalar as its JSON type in
    brackets, ``(list)``); for ``files/grep``, :data:`GREP_FIELDS` of its pattern (a pattern
    that is no string: neither) and ``max_depth``; ``{}`` for any other tool or arguments that
    are no object."""
    if tool == "files/grep" and isinstance(arguments, dict):
        pattern, depth = arguments.get("pattern"), arguments.get("max_depth")
        kept: dict[str, Any] = {} if not isinstance(pattern, str) else {
            "pattern_sha256": hashlib.sha256(pattern.encode("utf-8", "surrogatepass")).hexdigest(),
            "pattern_length": len(pattern)}
        return kept if depth is None else {**kept, "max_depth": depth if isinstance(depth, int) else "(value)"}
    if tool != "files/find" or not isinstance(arguments, dict):
        return {}
    out: dict[str, Any] = {}
    for arg, key in FIND_ARGS:
        if arg in arguments:
            value = arguments[arg]
            out[key] = value if value is None or isinstance(value, (str, int, float, bool)) else \
                f"({type(value).__name__})"
    return out


#: the ``decision`` of a call the grants allowed and a later step refused: root's opener (a symlink
#: in the path, several hard links, not a regular file), the secrets' check of the real path
REFUSED_AT_OPEN = "refused_at_open"
#: the ``decision`` of a call on the unprivileged route that the kernel refused (the OS account's
#: own permissions said no: ``PERMISSION_DENIED``): the daemon did not serve it
REFUSED_BY_OS = "refused_by_os"
