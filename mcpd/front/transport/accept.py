"""The ``Accept`` request header as ``/mcp`` reads it: media ranges with their weights (RFC 9110
§12.5.1), for a server that offers two types, ``application/json`` and ``text/event-stream``.

The grammar (RFC 9110 §5.6, §12.4.2, §12.5.1): a comma-separated list (empty elements allowed)
of ``type/subtype``, ``type/*`` or ``*/*``, each followed by ``;``-separated parameters
``name=token`` or ``name="quoted string"`` (no whitespace around ``=``). The parameter ``q``
(any case) is the weight: ``0`` to ``1`` with at most three decimals (``0``, ``0.5``, ``1.000``;
not ``.5``, ``0.5000``, ``1.5``, ``1e-3`` nor a quoted value); without one a range weighs 1.

The rule: a type's weight is the weight of the most specific range that matches it (the type
itself, then ``type/*``, then ``*/*``; equally specific ranges: the highest weight), ``0`` when none
does; a weight of 0 means "not acceptable". Parameters other than ``q`` do not restrict a range
(neither offered type has any). A header that breaks the grammar is refused as a whole
(:class:`MalformedAccept`) rather than guessed at: a dropped ``q=0`` would turn a refusal into
acceptance. The header sent several times is one list (RFC 9110 §5.3).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = r'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t -~\x80-\xff])*"'
_RANGE = re.compile(rf"({_TOKEN})/({_TOKEN})")
_PARAM = re.compile(rf"[ \t]*;[ \t]*(?:({_TOKEN})=({_TOKEN}|{_QUOTED}))?")
_QVALUE = re.compile(r"0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?")


class MalformedAccept(ValueError):
    """An ``Accept`` value that breaks the grammar; the message says where."""


def parse(value: str) -> list[tuple[str, str, int]]:
    """The media ranges of one ``Accept`` value, in order.

    Args:
        value: the header's value (Starlette's, decoded as Latin-1).

    Returns:
        ``(type, subtype, weight)`` per range: lower-case type and subtype (``"*"`` for a
        wildcard), the weight in thousandths (``0`` to ``1000``).

    Raises:
        MalformedAccept: the value breaks the grammar (see the module docstring), a range's ``q``
            is given twice, or ``*/subtype`` is named.
    """
    ranges: list[tuple[str, str, int]] = []
    pos, end = 0, len(value)
    while True:
        pos = _skip_ows(value, pos)
        if pos >= end:
            return ranges
        if value[pos] == ",":  # an empty element
            pos += 1
            continue
        m = _RANGE.match(value, pos)
        if m is None:
            raise MalformedAccept(f"no type/subtype at character {pos}")
        kind, sub = m.group(1).lower(), m.group(2).lower()
        if kind == "*" and sub != "*":
            raise MalformedAccept(f"*/{sub}: a wildcard type needs a wildcard subtype")
        pos = m.end()
        weight: int | None = None
        while (p := _PARAM.match(value, pos)) is not None:
            pos = p.end()
            if p.group(1) is not None and p.group(1).lower() == "q":
                if weight is not None:
                    raise MalformedAccept(f"{kind}/{sub}: q given twice")
                if not _QVALUE.fullmatch(p.group(2)):
                    raise MalformedAccept(f"{kind}/{sub}: q must be 0 to 1 with at most three decimals")
                weight = _thousandths(p.group(2))
        pos = _skip_ows(value, pos)
        if pos < end and value[pos] != ",":
            raise MalformedAccept(f"unexpected character at {pos}")
        ranges.append((kind, sub, 1000 if weight is None else weight))


def _skip_ows(value: str, pos: int) -> int:
    """The index of the first character at or after ``pos`` that is not a space or a tab."""
    while pos < len(value) and value[pos] in " \t":
        pos += 1
    return pos


def _thousandths(qvalue: str) -> int:
    """``"0.25"`` → 250 (``qvalue`` matched :data:`_QVALUE`)."""
    whole, _, frac = qvalue.partition(".")
    return int(whole) * 1000 + int((frac + "000")[:3])


def weight(ranges: Iterable[tuple[str, str, int]], media_type: str) -> int:
    """The weight in thousandths that ``ranges`` (from :func:`parse`) give ``media_type``
    (lower-case ``type/subtype``): the most specific matching range's, the highest among equally
    specific ones; ``0`` when none matches."""
    kind, _, sub = media_type.partition("/")
    best: tuple[int, int] | None = None  # (specificity, weight)
    for rkind, rsub, q in ranges:
        if rkind == "*":
            level = 0
        elif rkind != kind:
            continue
        elif rsub == "*":
            level = 1
        elif rsub == sub:
            level = 2
        else:
            continue
        if best is None or (level, q) > best:
            best = (level, q)
    return 0 if best is None else best[1]


def acceptable(values: list[str], offered: Iterable[str]) -> set[str]:
    """The ``offered`` media types (lower-case ``type/subtype``) that the ``Accept`` header
    ``values`` (every copy of the header, in order) accepts, i.e. gives a weight above 0. No
    header accepts every one; a header present but empty accepts none.

    Raises:
        MalformedAccept: as :func:`parse`.
    """
    offered = list(offered)
    if not values:
        return set(offered)
    ranges = [r for value in values for r in parse(value)]
    return {t for t in offered if weight(ranges, t) > 0}
