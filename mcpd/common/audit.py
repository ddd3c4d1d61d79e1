"""Audit records: one JSON line per call, decision, login, worker, reload or alert (SPEC §7).

Two logs use it: the root helper's audit log (privileged calls and everything else the helper
does) and the front's access log (every call that does not reach the helper), same format.

Each record is one ``write`` on a descriptor opened with ``O_APPEND`` (mode 0600, in a 0700
folder), under an exclusive ``flock``, so records never interleave and each reaches the kernel at
once. Where journald runs, each record also goes to the journal by its native protocol
(:func:`journal_entry`: the line as ``MESSAGE`` and every field as ``MCPD_<FIELD>``, plus
``MCPD_PATH``), so journal-remote, rsyslog or Vector carry them off the host. That copy is best
effort (never blocks, never fails a record); the file is the record.

The log is a hash chain (SPEC §7.2): every record starts with ``seq`` (1, 2, 3 ...) and ``prev``,
the SHA-256 (hex) of the previous record's exact bytes, its newline included (:data:`GENESIS` for
the first record ever). The chain goes on across rotation: holding the file's lock, the writer
checks that the path still names its file (device and inode); when logrotate (``create``) has
renamed it, the writer opens the new file and its first record carries the hash of the last
record of the old one. On start the chain resumes from the file's last line, or, when the file is
empty, from the last line of ``FILE.1`` (the file logrotate just renamed); a writer that finds
records it did not write (another process) goes on from the last of them. Each log has one
writer process in the daemon; two writers stay chained except across two rotations between two
records of one of them. ``mcpd audit verify`` checks the chain.

Record fields (all optional but ``seq``, ``prev``, ``time`` and ``event``): ``time`` (ISO 8601
UTC), ``event`` (``accept``, ``reject``, ``reload``, ``reload_failed``, ``alert``, ``spawn``,
``kill`` ...), ``user`` (principal), ``os_user``, ``token_id``, ``peer``, ``session``, ``tool``,
``requested_path``, ``resolved_path``, ``grant``, ``decision``, ``reason``, ``outcome``, ``bytes``,
``duration_ms``, ``route``, ``pid``, ``suppressed``.
Keys that name secrets or contents (``token``, ``password``, ``content`` ...) are refused, and
values must be scalars, so nothing larger can slip in.

Alerts are rate-limited (SPEC §7.1): at most :data:`ALERT_BURST` per reason in each
:data:`ALERT_WINDOW` seconds; the ones over are counted, and once the window is over (checked at
every record, and on close) one more alert of that reason carries the count as ``suppressed``. A
flood costs a few lines and loses no count.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import functools
import hashlib
import json
import os
import re
import socket
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

FORBIDDEN_KEYS = frozenset({"token", "password", "passwd", "secret", "content", "contents"})
_EVENT_RE = re.compile(r"[a-z][a-z_]{0,31}")  # whole names only (fullmatch: "$" would let a final newline by)
_KEY_RE = re.compile(r"[a-z][a-z_]{0,31}")
MAX_VALUE_CHARS = 4096  # longer strings are cut (a path is at most 4096 bytes anyway)
GENESIS = "0" * 64  # ``prev`` of the first record of a chain
ALERT_BURST, ALERT_WINDOW, ALERT_KEYS = 10, 60.0, 256  # alerts per reason per window (s); reasons tracked
_RESERVED = ("seq", "prev", "time", "event")


class AuditError(ValueError):
    """A record that must not be written (forbidden key, bad event name or value type)."""


def _forbidden(key: str) -> bool:
    return key in FORBIDDEN_KEYS or any(key.endswith("_" + word) for word in FORBIDDEN_KEYS)


@functools.lru_cache(maxsize=1024)
def _key_error(key: str) -> str | None:
    """Why ``key`` may not be a field name (None when it may); cached, as records repeat the same
    few keys and this check was most of a record's cost."""
    if not _KEY_RE.fullmatch(key) or key in _RESERVED:
        return f"bad audit field name {key!r}"
    if _forbidden(key):
        return f"audit field {key!r} is never logged"
    return None


_encode = json.JSONEncoder(ensure_ascii=True, separators=(",", ":")).encode  # one encoder, not one per record
_string = json.encoder.encode_basestring_ascii  # the encoder's own string writer (its C one)


def _value(value: Any) -> str:
    """``value`` (a scalar :func:`_clean` let through) as :data:`_encode` writes it, the same
    characters (property-tested), without the encoder's per-call set-up for the common kinds: a
    record is written for every call, and this was a large part of its cost."""
    kind = type(value)
    if kind is str:
        return _string(value)
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
    if isinstance(value, str):
        return value[:MAX_VALUE_CHARS]
    raise AuditError(f"audit field {key!r} must be a string, number, boolean or null")


def _body(event: str, fields: dict[str, Any], now: datetime.datetime | None = None, first: str = "") -> str:
    """``"time":...,"event":...``, then ``first`` (fields already encoded, see :class:`Fields`),
    then ``fields``, checked and encoded, without braces. ``now``: the record's time (default: the
    clock), converted to UTC when it has a time zone, taken as UTC when it has none."""
    if not _EVENT_RE.fullmatch(event):
        raise AuditError(f"bad audit event {event!r}")
    head = f'"time":"{_time_text(now)}","event":"{event}"'  # both plain ASCII, as checked
    return ",".join([p for p in (head, first, _members(fields)) if p])


_second: tuple[int, str] = (-1, "")  # the clock's last whole second (since the epoch) and its text


def _time_text(now: datetime.datetime | None) -> str:
    """A record's ``time``: ``now`` (default: the clock), in UTC (converted when it has a time
    zone, taken as UTC when it has none), as ISO 8601 with microseconds and ``Z``:
    ``2026-01-02T03:04:05.000007Z``. The clock's date and time of day are formatted once a second,
    not once a record (one is written for every call)."""
    global _second
    if now is not None:
        now = now.astimezone(datetime.timezone.utc) if now.tzinfo is not None else now
        return f'{now.replace(tzinfo=None).isoformat(timespec="microseconds")}Z'
    second, nanos = divmod(time.time_ns(), 1_000_000_000)
    known = _second  # (one read: another thread may replace it meanwhile)
    if known[0] != second:
        known = _second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{known[1]}.{nanos // 1000:06d}Z"


def _members(fields: dict[str, Any]) -> str:
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


def _line(body: str, seq: int | None, prev: str | None) -> str:
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
    return _line(_body(event, fields, now), seq, prev)


@dataclasses.dataclass(frozen=True)
class Fields:
    """Record fields checked and encoded once (:func:`encode_fields`), to begin any number of
    records (:meth:`AuditLog.record_with`): a writer whose records repeat the same who and what
    (the front's, one per call) encodes them once, not once per record."""

    text: str  # the fields as JSON object members, in order, without braces
    keys: frozenset[str]


def _refuse_twice(keys: frozenset[str], fields: dict[str, Any]) -> None:
    """Raise :class:`AuditError` when ``fields`` names a field of ``keys`` (already encoded) again."""
    if not keys.isdisjoint(fields):
        raise AuditError(f"audit fields given twice: {sorted(keys & fields.keys())}")


def encode_fields(**fields: Any) -> Fields:
    """``fields`` checked and encoded as :meth:`AuditLog.record` would write them.

    Raises:
        AuditError: a key naming a secret or contents, a bad key, or a non-scalar value.
    """
    return Fields(_encode_members(tuple(fields.items())), frozenset(fields))


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A record checked and encoded ahead of its writing (:meth:`AuditLog.prepare`)."""

    body: str  # "time", "event" and the fields given so far, encoded, without braces
    keys: frozenset[str]


def last_line(fd: int, block: int = 65536) -> bytes:
    """The last line of the open file ``fd`` (its newline included when present; ``b""`` when empty)."""
    pos = os.fstat(fd).st_size
    found = b""
    while pos > 0:
        step = min(block, pos)
        pos -= step
        found = os.pread(fd, step, pos) + found
        cut = found.rfind(b"\n", 0, len(found) - 1)
        if cut >= 0:
            return found[cut + 1:]
    return found


def chain_after(line: bytes) -> tuple[int, str]:
    """``(seq, hash)`` a record written after ``line`` continues from: the line's ``seq`` (0 when
    it has none or is empty) and the SHA-256 of its bytes (:data:`GENESIS` for no line at all)."""
    if not line:
        return 0, GENESIS
    try:
        seq = json.loads(line).get("seq")
    except (ValueError, AttributeError):
        seq = None
    return (seq if isinstance(seq, int) and not isinstance(seq, bool) else 0), hashlib.sha256(line).hexdigest()


JOURNAL_SOCKET = "/run/systemd/journal/socket"


def journal_entry(line: str, ident: str) -> bytes:
    """One record (``line``, as :func:`format_record` made it) in the journal's native protocol
    (systemd.io/JOURNAL_NATIVE_PROTOCOL): ``MESSAGE``, ``SYSLOG_IDENTIFIER`` = ``ident``,
    ``PRIORITY`` (4 alert, 5 reject, else 6), ``MCPD_PATH`` (resolved, else requested path) and
    ``MCPD_<KEY>`` for every field but null ones (``MCPD_USER``, ``MCPD_DECISION`` ...). Values
    go in the protocol's length-prefixed form, so no newline in a path can forge a field."""
    record = json.loads(line)
    event = record.get("event")
    fields = {"MESSAGE": line, "SYSLOG_IDENTIFIER": ident, "PRIORITY": {"alert": 4, "reject": 5}.get(event, 6)}
    path = record.get("resolved_path") or record.get("requested_path")
    fields.update({"MCPD_PATH": path} if path else {})
    fields.update({f"MCPD_{k.upper()}": v for k, v in record.items() if v is not None})
    out = bytearray()
    for key, value in fields.items():
        data = (str(value).lower() if isinstance(value, bool) else str(value)).encode()
        out += key.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
    return bytes(out)


class AuditLog:
    """An append-only, hash-chained JSON-lines audit log (SPEC §7; see the module docstring).

    Args:
        path: the log file; its folder is created with mode 0700 when missing, the file with 0600.
        syslog: also send each record to the system log: the journal (native protocol, at
            ``journal``), when that socket exists at start.
        ident: the journal's ``SYSLOG_IDENTIFIER`` (``mcpd-audit``; the front's access log:
            ``mcpd-access``).
        journal: the journal socket (a namespaced journald's, in tests).

    Raises:
        OSError: the folder or file cannot be created or opened (the helper must not run blind).
    """

    def __init__(self, path: str, syslog: bool = True, clock: Callable[[], float] = time.monotonic,
                 ident: str = "mcpd-audit", journal: str = JOURNAL_SOCKET) -> None:
        self.path, self._clock = path, clock
        self._alerts: dict[str, list[float]] = {}  # reason -> [window start, written, suppressed]
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(folder)
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(folder, 0o700)
        self._fd = self._open()
        self._lock = threading.Lock()
        self._end, self._seq, self._prev = -1, 0, GENESIS
        if os.fstat(self._fd).st_size == 0:
            self._resume_from(path + ".1")
        self._journal: tuple[socket.socket, str] | None = None
        if syslog and stat.S_ISSOCK(os.stat(journal).st_mode if os.path.exists(journal) else 0):
            self._journal = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC), journal
        self._ident = ident

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NOCTTY
        fd = os.open(self.path, flags, 0o600)  # read too: the chain resumes from the last line
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode):
            os.close(fd)
            raise OSError(f"{self.path}: audit log is not a regular file")
        if stat.S_IMODE(fst.st_mode) != 0o600 and fst.st_uid == os.geteuid():
            os.fchmod(fd, 0o600)
        return fd

    def _resume_from(self, rotated: str) -> None:
        try:
            fd = os.open(rotated, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                self._seq, self._prev = chain_after(last_line(fd))
        finally:
            os.close(fd)

    def _lock_current(self) -> os.stat_result:
        """``flock`` our file, first reopening the path while it no longer names it (renamed by
        logrotate, or removed), and return the file's ``fstat`` taken under the lock. Writers
        check the path under the lock, so once we hold the old file's lock nobody writes to it
        again: its last line is where the chain goes on. When anything fails (the path cannot be
        opened again) the lock is released before the error is raised: other writers never wait
        on a record that was not written."""
        while True:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                fst = os.fstat(self._fd)
                try:
                    st = os.stat(self.path, follow_symlinks=False)
                    if (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino):
                        return fst
                except FileNotFoundError:
                    pass
                if (last := last_line(self._fd)):
                    self._seq, self._prev = chain_after(last)
                fd, self._end = self._open(), 0
            except BaseException:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                raise
            os.close(self._fd)  # drops the old file's lock
            self._fd = fd

    def record(self, event: str, **fields: Any) -> None:
        """Append one record (see the module docstring for the fields), next link of the chain.

        Raises:
            AuditError: the record breaks the rules (nothing is written).
            OSError: the write failed.
        """
        with self._lock:
            self._write_due(self._clock())
            if event == "alert" and not self._admit(fields):
                return
            self._write(_body(event, fields))

    def record_with(self, event: str, first: Fields, **fields: Any) -> None:
        """Append the record :meth:`record` would write for ``first``'s fields followed by
        ``fields``, without checking and encoding ``first``'s again. Not for alerts.

        Raises:
            AuditError: a field in both, or one :meth:`record` refuses.
            OSError: the write failed.
        """
        if event == "alert":
            raise AuditError("alerts are written with record()")
        _refuse_twice(first.keys, fields)
        self._append(_body(event, fields, first=first.text))

    def prepare(self, event: str, **fields: Any) -> Prepared:
        """Check and encode a record now (its ``time`` is now) to write later with
        :meth:`finish`, which adds the fields only known then: the work is done while the caller
        waits anyway (a privileged read's record is prepared while the worker reads), not after.
        Not for alerts (they are rate-limited when written).

        Raises:
            AuditError: as :meth:`record`.
        """
        if event == "alert":
            raise AuditError("alerts are written with record()")
        return Prepared(_body(event, fields), frozenset(fields))

    def finish(self, prepared: Prepared, **fields: Any) -> None:
        """Append a record from :meth:`prepare` with ``fields`` after the ones it has, as the next
        link of the chain.

        Raises:
            AuditError: a field the record already has, or one :meth:`record` refuses.
            OSError: the write failed.
        """
        _refuse_twice(prepared.keys, fields)
        self._append(",".join(p for p in (prepared.body, _members(fields)) if p))

    def _append(self, body: str) -> None:
        """Write the record of encoded ``body`` (not an alert), after the alert counts now due."""
        with self._lock:
            self._write_due(self._clock())
            self._write(body)

    def _write_due(self, now: float | None) -> None:
        """Write the count of each alert reason whose window is over (all when ``now`` is None)."""
        if not self._alerts:  # (the usual case: nothing to look at)
            return
        for reason, (_, _, dropped) in self._due(now):
            self._write(_body("alert", {"reason": reason, "suppressed": int(dropped)}))

    def _due(self, now: float | None) -> list[tuple[str, list[float]]]:
        """Alert reasons whose window is over (all when ``now`` is None) with a count to write; forgets them."""
        done = [(k, v) for k, v in self._alerts.items() if now is None or now - v[0] >= ALERT_WINDOW]
        for key, _ in done:
            del self._alerts[key]
        return [(k, v) for k, v in done if v[2]]

    def _admit(self, fields: dict[str, Any]) -> bool:
        """Whether an alert may be written now (else it is counted as suppressed)."""
        key = str(fields.get("reason"))[:200]
        key = key if key in self._alerts or len(self._alerts) < ALERT_KEYS else "(other reasons)"
        slot = self._alerts.setdefault(key, [self._clock(), 0, 0])
        if slot[1] >= ALERT_BURST:
            slot[2] += 1
            return False
        slot[1] += 1
        return True

    def _write(self, body: str) -> None:
        """Append the record of encoded ``body`` (see :func:`_body`) with the next ``seq``/``prev``."""
        size, torn = self._lock_current().st_size, b""
        try:
            if size != self._end and size > 0:  # first write, or another writer appended
                last = last_line(self._fd)
                self._seq, self._prev = chain_after(last)
                torn = b"" if last.endswith(b"\n") else b"\n"  # a torn line stays its own line
            line = _line(body, self._seq + 1, self._prev)
            data = (line + "\n").encode("ascii")
            self._end = size + len(torn) + len(data)
            data = torn + data
            if os.write(self._fd, data) != len(data):
                raise OSError(f"{self.path}: short audit write")
            self._seq, self._prev = self._seq + 1, hashlib.sha256(data[len(torn):]).hexdigest()
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        if self._journal is not None:
            try:
                self._journal[0].sendto(journal_entry(line, self._ident), socket.MSG_DONTWAIT, self._journal[1])
            except OSError:
                pass  # journald busy or gone: the file has the record

    def close(self) -> None:
        """Write the counts of alerts still held back, then close the file (idempotent)."""
        with self._lock:
            if self._fd >= 0:
                self._write_due(None)
                os.close(self._fd)
                self._fd = -1
            if self._journal is not None:
                self._journal[0].close()

    def __enter__(self) -> "AuditLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
