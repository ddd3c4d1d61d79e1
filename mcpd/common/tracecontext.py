"""W3C Trace Context from a request's ``params._meta`` (docs/REFERENCE.md §7.1): the
``traceparent`` and ``tracestate`` an OpenTelemetry client sends, checked strictly, for the access
and audit records.

A value that breaks the W3C syntax is dropped, never an error and never written: the records hold
only what the syntax allows (lowercase hex and dashes; printable ASCII without ``,`` or ``=`` in a
``tracestate`` value), so nothing a client writes there can forge a field or a line. The front
checks what it received, and the policy process checks again what the front passes on.
"""

from __future__ import annotations

import re
from typing import Any

#: ``version-trace_id-parent_id-flags``: version ``00`` (the one defined), ids not all zero
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
TRACEPARENT_CHARS = 55
TRACESTATE_CHARS = 512
_MEMBERS = 32
_KEY = r"(?:[a-z][a-z0-9_*/-]{0,255}|[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13})"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER = re.compile(f"({_KEY})=({_VALUE})")


def traceparent(value: Any) -> str | None:
    """``value`` when it is a valid ``traceparent`` (``00-<32 hex>-<16 hex>-<2 hex>``, lowercase,
    neither id all zeros), else ``None``."""
    if isinstance(value, str) and len(value) == TRACEPARENT_CHARS and _TRACEPARENT.fullmatch(value):
        return value
    return None


def tracestate(value: Any) -> str | None:
    """``value`` when it is a valid ``tracestate`` (at most 512 characters, at most 32
    comma-separated ``key=value`` list-members, each key once; spaces and tabs around a member and
    empty members allowed), else ``None``."""
    if not isinstance(value, str) or not value or len(value) > TRACESTATE_CHARS or not value.isascii():
        return None
    keys: set[str] = set()
    for part in value.split(","):
        member = part.strip(" \t")
        if not member:
            continue
        found = _MEMBER.fullmatch(member)
        if found is None or found.group(1) in keys:
            return None
        keys.add(found.group(1))
    return value if 0 < len(keys) <= _MEMBERS else None


def trace_fields(meta: Any) -> dict[str, str]:
    """The record fields of a request's ``_meta``: ``traceparent`` and ``tracestate`` when valid
    (a ``tracestate`` only with a valid ``traceparent``, as W3C ties it to one); ``{}`` otherwise."""
    if not isinstance(meta, dict):
        return {}
    parent = traceparent(meta.get("traceparent"))
    if parent is None:
        return {}
    state = tracestate(meta.get("tracestate"))
    return {"traceparent": parent} if state is None else {"traceparent": parent, "tracestate": state}
