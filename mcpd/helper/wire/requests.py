"""Request tables: the fixed requests a process serves, and the one schema check held to them.

Root (:mod:`mcpd.helper.monitor`) and the policy process each serve a table of :class:`Request`
entries, one per request type. :func:`check` holds a decoded request to its entry before any
handler runs and raises :class:`SchemaError`; each process maps that to its own ending (root ends
the channel and stops, the policy process ends the connection with an audit ``alert``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Key:
    """One key of a request: its exact type (``str``, ``int``, ``bool`` or ``dict``; ``bool`` is not
    ``int``), whether it must be present, for a string its most characters (0: no limit), and
    ``choices``: the only values it may take (empty: any of its type)."""

    type: type
    required: bool = True
    longest: int = 4096
    choices: tuple[Any, ...] = ()


ID = Key(int)  # the ``id`` every request carries, echoed in its reply


@dataclasses.dataclass(frozen=True)
class Request:
    """One request type: its ``name`` (the request's ``type``), its ``keys`` besides ``type`` and
    ``id``, its ``handler`` (called as ``handler(server, request)``), ``doc``: what it may do and
    when, and ``pool``: the serving process's capacity class for it ("" where there is none)."""

    name: str
    keys: Mapping[str, Key]
    handler: Callable[[Any, dict[str, Any]], dict[str, Any]]
    doc: str
    pool: str = ""


class SchemaError(Exception):
    """A request its table does not serve; the message says why (``"open: unknown key 'x'"``)."""


def table(*requests: Request) -> dict[str, Request]:
    """The entries ``requests`` by name. Raises ``ValueError`` when a name comes twice."""
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise ValueError("a request type is in the table twice")
    return {r.name: r for r in requests}


def check(served: Mapping[str, Request], req: dict[str, Any]) -> Request:
    """The entry of ``served`` (a :func:`table`) for ``req`` (a decoded frame), once ``req`` holds
    exactly its keys: a known ``type``, an int ``id``, every required key and no other, each of its
    exact type, no longer than its limit and one of its choices when it has some.

    Raises:
        SchemaError: ``"unknown request type"``, or ``"<type>: unknown key 'k'"``,
            ``"<type>: missing key 'k'"``, ``"<type>: malformed key 'k'"`` (wrong type, too long, not a choice).
    """
    kind = req.get("type")
    if type(kind) is not str or kind not in served:
        raise SchemaError("unknown request type")
    entry = served[kind]
    keys = {**entry.keys, "id": ID}
    for key in req:
        if key != "type" and key not in keys:
            raise SchemaError(f"{kind}: unknown key {key!r}")
    for key, want in keys.items():
        if key not in req:
            if want.required:
                raise SchemaError(f"{kind}: missing key {key!r}")
            continue
        value = req[key]
        if type(value) is not want.type or (isinstance(value, str) and want.longest and len(value) > want.longest) \
                or (want.choices and value not in want.choices):
            raise SchemaError(f"{kind}: malformed key {key!r}")
    return entry
