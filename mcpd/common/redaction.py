"""Secret redaction as policy: the detector names, the ``redact`` setting's parsing, and how a call carries it.

A principal (``users.yaml``) or a grant (``mcp-sudo.yaml``) may say ``redact: secrets`` (every
detector) or ``redact: [private-key, token, ...]`` (docs/REFERENCE.md §3 "Redaction"). The
setting that applies to a call is the union of the principal's and, on the privileged route, the
allowing grant's. It travels to the worker inside the call's arguments under :data:`REDACT_KEY`
(a sorted list of detector names), put there by the front (the principal's, unprivileged route)
or by the policy process (privileged route: it replaces whatever the front sent). The detection
itself runs in the worker only (:mod:`mcpd.core.redact`); nothing here reads content.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: every detector, in the order the worker applies them
DETECTORS = ("private-key", "cloud-key", "token", "url-password", "shadow-hash", "assignment")
#: the one word meaning every detector
ALL = "secrets"
#: the arguments' key holding the detectors of a call (never a client argument: the front drops a client's)
REDACT_KEY = "_redact"
#: the ops whose answers are redacted
REDACTED_OPS = ("files/read", "files/grep")
#: the refusal of a base64 read (or a binary resource) for a caller whose answers are redacted:
#: ``PERMISSION_DENIED``, this as its message and ``reason``
REDACTED_BYTES = "redaction applies: bytes cannot be redacted"
#: what a ``redact`` value must be, for messages
REDACT_TEXT = f"'{ALL}' or a list of detectors ({', '.join(DETECTORS)})"


class RedactError(ValueError):
    """A ``redact`` value that is neither ``secrets`` nor a list of known detectors."""


def parse_redact(value: Any) -> tuple[str, ...]:
    """The detectors a ``redact`` setting names, sorted in :data:`DETECTORS` order.

    ``None`` or an empty list: none; ``"secrets"``: all; a list of detector names (``secrets``
    allowed in it too). Raises :class:`RedactError` (message naming the bad item) otherwise.
    """
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise RedactError(f"redact must be {REDACT_TEXT}")
    chosen: set[str] = set()
    for item in items:
        if item == ALL:
            chosen.update(DETECTORS)
        elif isinstance(item, str) and item in DETECTORS:
            chosen.add(item)
        else:
            raise RedactError(f"unknown detector {item!r} in redact (expected {REDACT_TEXT})")
    return tuple(d for d in DETECTORS if d in chosen)


def union(*settings: Iterable[str]) -> tuple[str, ...]:
    """The detectors of all ``settings`` together, in :data:`DETECTORS` order."""
    chosen = {d for s in settings for d in s}
    return tuple(d for d in DETECTORS if d in chosen)


def describe(detectors: Iterable[str]) -> str:
    """Operators' words for a setting: ``none``, ``secrets (all detectors)`` or the names."""
    names = tuple(detectors)
    if not names:
        return "none"
    return f"{ALL} (all detectors)" if set(names) == set(DETECTORS) else ", ".join(names)


def with_redaction(op: str, args: dict[str, Any], detectors: Iterable[str]) -> dict[str, Any]:
    """``args`` for the worker with :data:`REDACT_KEY` set to ``detectors`` for an op whose answer is
    redacted (any value already there, a client's, dropped); other ops' args without the key."""
    out = {k: v for k, v in args.items() if k != REDACT_KEY}
    names = union(detectors)
    if names and op in REDACTED_OPS:
        out[REDACT_KEY] = list(names)
    return out


def from_args(args: Any) -> tuple[str, ...]:
    """The detectors a worker's request ``args`` carry (:data:`REDACT_KEY`); a malformed value or
    an unknown name means every detector (fail closed)."""
    value = args.get(REDACT_KEY) if isinstance(args, dict) else None
    if value is None:
        return ()
    if not isinstance(value, list) or any(not isinstance(v, str) or v not in DETECTORS for v in value):
        return DETECTORS
    return union(value)


def counts_text(counts: Any) -> str:
    """How the access and audit records write a call's redaction counts: ``kind:N`` items, comma
    separated, in :data:`DETECTORS` order (``""``: nothing was redacted); anything malformed is
    left out (a number the worker reports is no more than a number)."""
    if not isinstance(counts, dict):
        return ""
    return ",".join(f"{k}:{counts[k]}" for k in DETECTORS
                    if isinstance(counts.get(k), int) and not isinstance(counts[k], bool) and counts[k] > 0)
