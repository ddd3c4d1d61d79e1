"""Which records a view shows, and in what order they were read.

A :class:`Filter` selects records by principal or OS account, decision, path glob, time, event
and route (docs/REFERENCE.md §7); :func:`last_records` finds the last ``n`` that pass, newest file
first; an :class:`Order` counts records read out of order or twice, which a view reports as a
warning. Times are UTC: ISO 8601 or a span back from now (:func:`parse_time`).
"""

from __future__ import annotations

import datetime
import fnmatch
import os
import re
from dataclasses import dataclass
from typing import Any

from mcpd.admin.audit.logfiles import Line, backwards
from mcpd.common.audit.records import REFUSED_AT_OPEN, REFUSED_BY_OS


def parse_time(text: str) -> datetime.datetime:
    """An ISO 8601 time (``2026-12-01``, ``2026-12-01T06:00``, ``...Z``; no offset means UTC), or
    a span back from now: ``90s``, ``15m``, ``2h``, ``3d``.

    Raises:
        ValueError: neither form.
    """
    m = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if m:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=int(m.group(1)) * unit)
    when = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)


def record_time(rec: dict[str, Any]) -> datetime.datetime | None:
    """The ``time`` of a record as an aware datetime, or ``None`` when missing or malformed."""
    try:
        return parse_time(str(rec["time"])) if "time" in rec else None
    except ValueError:
        return None


#: a decision filter and the decisions it lists: ``reject`` also lists the calls the grants allowed
#: but root's opener refused (``refused_at_open``: a symlink in the path, several hard links ...)
#: and the calls of the unprivileged route the kernel refused (``refused_by_os``)
DECISIONS = {"reject": ("reject", REFUSED_AT_OPEN, REFUSED_BY_OS)}


@dataclass(frozen=True)
class Filter:
    """Which records to show: ``user`` (principal or OS account), ``decision`` (``reject`` lists
    every refusal, see :data:`DECISIONS`), ``path`` (a glob over the requested and resolved path),
    ``since``/``until`` (aware datetimes, inclusive), ``event`` (``alert``, ``reload`` ...;
    ``login`` lists every login attempt, refused ones too, also as older logs recorded those:
    event ``reject`` with tool ``login``), ``route`` (the route column, :func:`route_of`),
    ``claims`` (an OAuth call's ``iss``, ``sub``, ``client``, ``jti``: each given pair must match)."""

    user: str | None = None
    decision: str | None = None
    path: str | None = None
    since: datetime.datetime | None = None
    until: datetime.datetime | None = None
    event: str | None = None
    route: str | None = None
    claims: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.claims) or any(v is not None for v in (self.user, self.decision, self.path, self.since,
                                                                self.until, self.event, self.route))

    def match(self, rec: dict[str, Any]) -> bool:
        """Whether ``rec`` passes every filter given."""
        if self.event is not None and rec.get("event") != self.event and not (
                self.event == "login" and rec.get("tool") == "login" and rec.get("event") == "reject"):
            return False
        if self.route is not None and route_of(rec) != self.route:
            return False
        if any(rec.get(key) != value for key, value in self.claims):
            return False
        if self.user is not None and self.user not in (rec.get("user"), rec.get("os_user")):
            return False
        if self.decision is not None and rec.get("decision") not in DECISIONS.get(self.decision, (self.decision,)):
            return False
        if self.path is not None and not any(
                isinstance(p, str) and fnmatch.fnmatchcase(p, self.path)
                for p in (rec.get("requested_path"), rec.get("resolved_path"), rec.get("real_path"))):
            return False
        if self.since is not None or self.until is not None:
            when = record_time(rec)
            if when is None or (self.since and when < self.since) or (self.until and when > self.until):
                return False
        return True


def route_of(rec: dict[str, Any]) -> str:
    """The route column: the record's ``route``; for records without one, ``login`` for a login
    or logout (also one recorded as event ``reject`` with tool ``login``), ``privileged`` for
    another call the policy process recorded, ``start`` for the grants load of a daemon's start,
    else the event."""
    if rec.get("route"):
        return str(rec["route"])
    event = rec.get("event")
    if rec.get("tool") == "login" or event in ("login", "logout"):
        return "login"
    if event in ("accept", "reject"):
        return "privileged"
    if event == "reload" and rec.get("load") == "start":
        return "start"
    return str(event or "-")


class Order:
    """Watches the ``seq`` of the records a view reads, in the order it reads them (``backwards``:
    newest first), and counts those out of order or read twice (an old log copied over a newer
    one, records moved): a view that shows them says so (:meth:`warning`)."""

    def __init__(self, backwards: bool = False) -> None:
        self.backwards, self.count = backwards, 0
        self.example = ""
        self._last: tuple[int, str] | None = None

    def see(self, path: str, rec: dict[str, Any]) -> None:
        """Note record ``rec``, read from ``path``."""
        seq = rec.get("seq")
        if type(seq) is not int:
            return
        if self._last is not None and (seq >= self._last[0] if self.backwards else seq <= self._last[0]):
            self.count += 1
            if not self.example:
                (a, pa), (b, pb) = ((seq, path), self._last) if self.backwards else (self._last, (seq, path))
                self.example = f"seq {b} ({os.path.basename(pb)}) after seq {a} ({os.path.basename(pa)})"
        self._last = (seq, path)

    def warning(self, log: str) -> str | None:
        """The warning to show, or None when every record read was in order."""
        if not self.count:
            return None
        return (f"warning: {self.count} record{'s' * (self.count > 1)} of {log} out of order or repeated among those "
                f"read ({self.example}): the log was changed; run mcpd audit verify")


def last_records(paths: list[str], flt: Filter, count: int, end: int | None = None,
                 order: Order | None = None) -> list[tuple[bytes, dict[str, Any]]]:
    """The last ``count`` records of the files ``paths`` (oldest first: :func:`rotated_set`) that
    pass ``flt``, oldest first, each with its raw line: read from the end of the newest file
    backwards, so ``-n 5`` reads little even across a year of rotated files. ``end``: where the
    newest file is taken to end (bytes). Lines that are no JSON record are skipped. ``order``
    (backwards) sees every record read.

    Raises:
        OSError: a file cannot be read.
    """
    found: list[tuple[bytes, dict[str, Any]]] = []
    if count <= 0:
        return found
    for i, path in enumerate(reversed(paths)):
        for raw in backwards(path, end if i == 0 else None):
            rec = Line(path, raw).record()
            if rec is not None and order is not None:
                order.see(path, rec)
            if rec is not None and flt.match(rec):
                found.append((raw, rec))
                if len(found) == count:
                    return found[::-1]
    return found[::-1]
