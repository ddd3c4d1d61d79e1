"""The human form of a record: one line per record, nothing a client sent can forge it.

Every field a client controls (a path, a name, a pattern, a reason quoting one) goes through the
one escape rule of :func:`mcpd.common.printable.field`: what is not plainly visible is written as
an escape, a field holding a space, a quote or a backslash is quoted, a long one is cut with its
length. So a record is always one line, and a field never looks like two (docs/REFERENCE.md §7).
``tail --json`` shows the raw record instead (:func:`as_json_line`).
"""

from __future__ import annotations

import json
from typing import Any

from mcpd.admin.audit.filters import route_of
from mcpd.admin.audit.verify import loss_words
from mcpd.common.audit.records import FIND_ARGS, GREP_FIELDS
from mcpd.common.printable import field, printable

#: the arguments of ``files/find`` a record keeps (field, label): how a readable line names them
FIND_FIELDS = tuple((key, arg) for arg, key in FIND_ARGS) + tuple((key, key) for key in GREP_FIELDS)


def _text(value: Any) -> str:
    """A field as shown on screen: :func:`~mcpd.common.printable.field`, so nothing a client sent
    (a path with a newline, an ESC, a bidi override, spaces that would fake columns) forges or
    hides a line or a column: escaped strictly, quoted when it holds a space, a quote or a
    backslash, shortened with a marker past :data:`~mcpd.common.printable.FIELD_CHARS`."""
    return field(str(value))


def _reason(rec: dict[str, Any]) -> str:
    """The reason column: the record's ``reason`` (:func:`_text`), then what the daemon adds in
    its own words: ``[CODE]``, the failure's detail, what a loss alert says was lost, a load's
    part and digest, the count of alerts suppressed."""
    reason = _text(rec.get("reason") or "-")
    if rec.get("outcome"):
        reason += f" [{_text(rec['outcome'])}]"
    if rec.get("reason_detail"):
        reason += f" (detail: {_text(rec['reason_detail'])})"
    if type(rec.get("missing_to")) is int:
        reason += f": {printable(loss_words(rec))}"
    if rec.get("parts"):
        reason += f" [part {_text(rec.get('part'))} of {_text(rec['parts'])}, sha256 {_text(str(rec.get('sha256') or 'none')[:12])}]"
    if rec.get("suppressed"):
        reason += f" (+{_text(rec['suppressed'])} like it suppressed)"
    return reason


def human(rec: dict[str, Any], source: str = "") -> str:
    """One record as a readable line: time, user (``principal(account)``), route, tool, path
    (``requested -> resolved`` when they differ; a find's ``name=``, ``type=``, ``max_depth=``),
    decision, reason, bytes, and the rule that decided (``grant``) when there is one; other events
    show their event name and the fields that say what. ``source``: where the record is from
    when the view mixes logs (``access log``), added at the end in brackets.
    Every field a client may control is shown by :func:`_text`: the line never spans two lines,
    a field never looks like two, and what a client sent shows as escapes."""
    when = str(rec.get("time", "?"))[:19].replace("T", " ")
    user, account = rec.get("user"), rec.get("os_user")
    who = f"{_text(user)}({_text(account)})" if user and account and user != account else _text(user or account or "-")
    path = rec.get("resolved_path") or rec.get("requested_path") or rec.get("grants_file") or rec.get("log_file") or "-"
    if rec.get("requested_path") and rec.get("resolved_path") and rec["requested_path"] != rec["resolved_path"]:
        path = f"{_text(rec['requested_path'])} -> {_text(rec['resolved_path'])}"
    else:
        path = _text(path)
    path += f" (opened {_text(rec['real_path'])})" if rec.get("real_path") else ""  # a symlink led there
    path += "".join(f" {label}={_text(rec[key])}" for key, label in FIND_FIELDS if rec.get(key) is not None)
    extra = f" pid={_text(rec['pid'])}" if "pid" in rec else ""
    size = rec.get("bytes")
    rule = f"  rule: {_text(rec['grant'])}" if rec.get("grant") else ""
    where = f"  [{source}]" if source else ""
    rule += "".join(f"  {key}={_text(rec[key])}" for key in ("iss", "sub", "client", "act", "jti") if rec.get(key))
    return (f"{printable(when)}  {who:<14} {_text(route_of(rec)):<12} {_text(rec.get('tool') or '-'):<14} {path}{extra}  "
            f"{_text(rec.get('decision') or '-')}  {_reason(rec)}  {'-' if size is None else _text(size)}{rule}{where}")


def as_json_line(raw: bytes, rec: dict[str, Any]) -> str:
    """A record's line as ``tail --json`` prints it: its own bytes when they are printable ASCII
    (what the writer writes: ``verify`` hashes exactly these), else ``rec`` encoded again as
    ASCII JSON (escapes, never a raw control character)."""
    text = raw.rstrip(b"\n")
    if text.isascii() and text.decode("ascii").isprintable():
        return text.decode("ascii")
    return json.dumps(rec, separators=(",", ":"), ensure_ascii=True)
