"""The grants file of each load, rebuilt from the audit log's ``reload`` records.

The policy process records every load of the grants file whole: its text and the changes made,
in adjacent parts, with the text's SHA-256 (:func:`mcpd.policy.grants_reload.reload_records`).
:func:`loads` puts the parts back together and says when a load is not whole, so
``mcpd grants at TIME`` can show the file in force at any time the log covers.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from mcpd.admin.audit.filters import record_time
from mcpd.admin.audit.logfiles import Line, records


@dataclass
class Load:
    """One load of the grants file as its records hold it (:func:`loads`): when (``time``, the
    first record's), where (``where`` ``FILE:LINE``, ``first``/``last`` seq), the file
    (``grants_file``), ``sha256`` as recorded, the file's ``text`` and the ``changes`` made, rebuilt
    from the parts; ``problem`` says why it is not whole (a part missing, parts not adjacent, the
    text not matching its digest, or records written before reloads were recorded whole)."""

    time: datetime.datetime | None
    where: str
    first: int | None
    last: int | None
    grants_file: str
    sha256: str
    text: str
    changes: list[str]
    problem: str | None = None


def loads(lines: Iterable[Line]) -> Iterator[Load]:
    """Every successful load of the grants file recorded in ``lines`` (``reload`` records, in
    order), rebuilt from its parts (see :func:`mcpd.policy.grants_reload.reload_records`)."""
    current: list[dict[str, Any]] = []
    where = ""

    def done() -> Load:
        one = current[0]
        parts = one.get("parts")
        seqs = [r.get("seq") for r in current]
        text = "".join(str(r.get("grants_text", "")) for r in current)
        changes = "".join(str(r.get("changes_text", "")) for r in current)
        load = Load(record_time(one), where, seqs[0], seqs[-1], str(one.get("grants_file", "?")),
                    str(one.get("sha256", "")), text, changes.split("\n") if changes else [])
        if parts is None:
            load.problem = "recorded before reloads were recorded whole: only its summary is in the log"
        elif not isinstance(parts, int) or [r.get("part") for r in current] != list(range(1, parts + 1)):
            load.problem = f"parts {[r.get('part') for r in current]} of {parts}: not whole"
        elif not all(isinstance(s, int) for s in seqs) or seqs != list(range(int(seqs[0] or 0), int(seqs[0] or 0) + len(seqs))):
            load.problem = "its parts are not adjacent records"
        elif any(r.get("sha256") != one.get("sha256") for r in current) or \
                hashlib.sha256(text.encode("utf-8")).hexdigest() != one.get("sha256"):
            load.problem = "its text does not match its recorded sha256"
        elif len(load.changes) != one.get("changes"):
            load.problem = f"{len(load.changes)} changes where {one.get('changes')} were recorded"
        return load

    for line, rec in records(lines):
        if rec.get("event") != "reload":
            continue
        part = rec.get("part")
        if current and (not isinstance(part, int) or part <= int(current[-1].get("part") or 0)
                        or rec.get("sha256") != current[0].get("sha256")):  # a new set (the last one not whole)
            yield done()
            current = []
        if not current:
            where = line.where
        current.append(rec)
        if part is None or part == rec.get("parts"):
            yield done()
            current = []
    if current:
        yield done()
