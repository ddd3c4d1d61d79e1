"""Audit records: one JSON line per call, decision, login, worker, reload or alert (SPEC §7).

Two logs use it: the root helper's audit log (privileged calls and everything else the helper
does) and the front's access log (every call that does not reach the helper), same format.

Each record is one ``write`` on a descriptor opened with ``O_APPEND`` (mode 0600, in a 0700
folder), under an exclusive ``flock``, so records never interleave and each reaches the kernel at
once (:meth:`AuditLog.record_set`: several adjacent records in one ``write``). Where journald runs,
each record also goes to the journal by its native protocol (:func:`journal_entry`: the line as
``MESSAGE`` and every field as ``MCPD_<FIELD>``, plus ``MCPD_PATH``), so journal-remote, rsyslog
or Vector carry them off the host. That copy is best effort (never blocks, never fails a record);
the file is the record.

The log is a hash chain (SPEC §7.2): every record starts with ``seq`` (1, 2, 3 ...) and ``prev``,
the SHA-256 (hex) of the previous record's exact bytes, its newline included (:data:`GENESIS` for
the first record ever). The chain goes on across rotation: holding the file's lock, the writer
checks that the path still names its file (device and inode); when logrotate (``create``) has
renamed it, the writer opens the new file and its first record carries the hash of the last
record of the old one. On start the chain resumes from the file's last line, or, when the file is
empty, from the last line of ``FILE.1`` (the file logrotate just renamed); a writer that finds
records it did not write (another process) goes on from the last of them. Each log has one
writer process in the daemon; two writers stay chained except across two rotations between two
records of one of them. ``mcpd audit verify`` checks the chain. The first record of every new
file is a :data:`ROTATE` record numbering it (``file_number``: the log's 1st, 2nd ... file), so
``verify`` can tell how many older files there were and which of them logrotate's retention
removed; it is written only at a rotation (or on start after one), never on the per-record path.
A file found deleted (no name left) rather than renamed is an alert naming the records it held.

The chain's head lives outside the log. The writer remembers where its last record ends (device,
inode, offset, length, hash) and, before each record, compares the file's ``fstat`` (taken under
the lock anyway) with it: the same file of the same size is the usual case and costs nothing more.
Any other size is looked at: its last record still in place, byte for byte, means another writer
appended; gone (the file cut, emptied in place or rewritten) is an ``alert`` (:data:`LOST_TAIL`,
with ``missing_from``/``missing_to`` naming the records gone), and the chain goes on after the
last record written: numbers are never reused, and its hash stays ``prev``, so ``verify`` sees the
gap too. Given ``head_dir`` (the policy process's state folder), the writer also keeps that place
in a small file there (:data:`HEAD_FILE`, :class:`Head`), made with the atomic write of
:func:`mcpd.common.folders.write_file` on start and then rewritten in place by one ``pwrite`` of a
fixed-width line after each record (a rename per record would cost a file creation each time).
On start it checks that the record the head names is still where it was written (in the log, or
in ``FILE.1`` after a rotation by rename), so a tail cut while the daemon was stopped is an alert
too; ``mcpd audit verify`` reads the head and fails when the log ends before it. A rotation by
rename is no loss: the old file keeps its inode and its records. ``copytruncate`` (which the
shipped logrotate file never uses) empties the file in place: the writer cannot tell it from a
cut and says so in an alert, and goes on from its own last record, so the copy and the new file
still chain whole.

Record fields (all optional but ``seq``, ``prev``, ``time`` and ``event``): ``time`` (ISO 8601
UTC), ``event`` (``accept``, ``reject``, ``reload``, ``reload_failed``, ``alert``, ``spawn``,
``kill`` ...), ``user`` (principal), ``os_user``, ``token_id``, ``peer``, ``session``, ``tool``,
``requested_path``, ``resolved_path``, ``real_path`` (what root opened, when a symlink led
elsewhere), ``grant``, ``decision``, ``reason``, ``outcome``, ``bytes``, ``duration_ms``, ``route``,
``pid``, ``suppressed``; a call the grants allowed and root's opener
refused is ``event`` ``reject`` with ``decision`` :data:`REFUSED_AT_OPEN`. Keys that name secrets or
contents (``token``, ``password``, ``content`` ...) are refused, and values must be scalars, so
nothing larger can slip in; a string over :data:`MAX_VALUE_CHARS` is cut and ends in :data:`CUT`.

Alerts are rate-limited (SPEC §7.1): at most :data:`ALERT_BURST` per reason in each
:data:`ALERT_WINDOW` seconds; the ones over are counted, and once the window is over (checked at
every record, and on close) one more alert of that reason carries the count as ``suppressed``. A
flood costs a few lines and loses no count.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
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

from mcpd.common.folders import read_file, write_file

FORBIDDEN_KEYS = frozenset({"token", "password", "passwd", "secret", "content", "contents"})
_EVENT_RE = re.compile(r"[a-z][a-z_]{0,31}")  # whole names only (fullmatch: "$" would let a final newline by)
_KEY_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")  # (sha256: digits too)
MAX_VALUE_CHARS = 4096  # longer strings are cut, ending in CUT (a path is at most 4096 bytes anyway)
CUT = "\u2026"  # the last character of a value cut to MAX_VALUE_CHARS
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
    if isinstance(value, str):  # a longer one is cut, and says so
        return value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS - 1] + CUT
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


def tail_of(fd: int, size: int, block: int = 65536) -> tuple[bytes, bytes]:
    """The end of the open file ``fd``'s first ``size`` bytes: ``(line, partial)``, its last whole
    line (newline included; ``b""`` when it has none) and the bytes after it that no newline ends
    (a torn record; ``b""`` as a rule)."""
    pos, found = size, b""
    while pos > 0:
        step = min(block, pos)
        pos -= step
        found = os.pread(fd, step, pos) + found
        end = found.rfind(b"\n")
        if end < 0:
            continue
        start = found.rfind(b"\n", 0, end)
        if start >= 0 or pos == 0:
            return found[start + 1:end + 1], found[end + 1:]
    return b"", found


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


FIND_ARGS = (("name", "find_name"), ("type", "find_type"), ("max_depth", "max_depth"))  # argument -> field


def find_fields(tool: str, arguments: Any) -> dict[str, Any]:
    """What a ``files/find`` call searched for, as record fields (``find_name``, ``find_type``,
    ``max_depth``), from its raw ``arguments`` (a value that is no scalar as its JSON type in
    brackets, ``(list)``); ``{}`` for any other tool or arguments that are no object."""
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
#: the ``reason`` of the alert a writer records when its log no longer ends with the last record
#: it wrote (cut, emptied or replaced); ``missing_from``/``missing_to`` name the records gone
#: (``missing_from`` null when where the loss begins is not known), ``found_seq`` the last record
#: the log still held (0: none). The access log's writer says ``access log`` (:func:`lost_reason`).
LOST_TAIL = "the audit log lost records its writer had written"
#: the ``event`` of the first record of every new file of a log (a rotation by rename, or a file
#: created again after it was removed): ``file_number`` counts the log's files (1 is the file its
#: first record went to; null when the file before this one had no number: a log begun before
#: files were numbered), so ``mcpd audit verify`` can tell how many older files there were
ROTATE = "rotate"


def lost_reason(ident: str) -> str:
    """The :data:`LOST_TAIL` reason as the writer named ``ident`` words it (``mcpd-access``: the
    access log; any other: the audit log)."""
    return LOST_TAIL.replace("audit log", "access log") if ident == "mcpd-access" else LOST_TAIL


def file_number(first: bytes) -> int | None:
    """The number of the log file whose first line is ``first`` (see :data:`ROTATE`): its
    ``file_number`` when it is a rotate record, 1 when it is the chain's first record (seq 1),
    else None (unknown)."""
    try:
        rec = json.loads(first)
    except ValueError:
        return None
    if not isinstance(rec, dict):
        return None
    number = rec.get("file_number") if rec.get("event") == ROTATE else 1 if rec.get("seq") == 1 else None
    return number if type(number) is int and number >= 1 else None


def first_line(fd: int, block: int = 65536) -> bytes:
    """The first line (newline included) of the open file ``fd``, read from offset 0 (``b""``
    when empty; the whole first ``block`` bytes when no newline ends them)."""
    data = os.pread(fd, block, 0)
    end = data.find(b"\n")
    return data if end < 0 else data[:end + 1]
HEAD_FILE = "audit.head"  # the writer's head state, in its own state folder


@dataclasses.dataclass(frozen=True)
class Head:
    """Where a log ended when its writer last wrote (the chain's head, kept outside the log):
    ``seq`` and ``hash`` (SHA-256 hex of its bytes) of that record, ``log`` the log's path,
    ``dev``/``ino`` the file it is in, ``end`` the offset just past it and ``length`` its size in
    bytes (0: no record yet)."""

    log: str
    seq: int
    hash: str
    dev: int
    ino: int
    end: int
    length: int

    def encode(self) -> bytes:
        """One JSON line padded with spaces to a width fixed by ``log`` alone, so every update
        of one log's head is one ``pwrite`` of the same size at offset 0."""
        return _head_line(self.log, self.seq, self.hash, self.dev, self.ino, self.end, self.length)

    @classmethod
    def decode(cls, data: bytes) -> "Head":
        """The head :meth:`encode` wrote.

        Raises:
            ValueError: not such a line (torn, edited or empty).
        """
        obj = json.loads(data)
        if not isinstance(obj, dict) or set(obj) != {f.name for f in dataclasses.fields(cls)}:
            raise ValueError("not an audit head")
        head = cls(**obj)
        if not isinstance(head.log, str) or not isinstance(head.hash, str) or not all(
                type(getattr(head, k)) is int and getattr(head, k) >= 0 for k in ("seq", "dev", "ino", "end", "length")):
            raise ValueError("not an audit head")
        return head


def _head_line(log: str, seq: int, digest: str, dev: int, ino: int, end: int, length: int) -> bytes:
    """A head as :meth:`Head.encode` writes it (written for every record: formatted, not encoded)."""
    name, width = _head_log(log)
    line = f'{{"log":{name},"seq":{seq},"hash":"{digest}","dev":{dev},"ino":{ino},"end":{end},"length":{length}}}'
    return line.encode("ascii").ljust(width - 1) + b"\n"


@functools.lru_cache(maxsize=8)
def _head_log(log: str) -> tuple[str, int]:
    """``log`` as a JSON string, and the width of every head line of it (the widest numbers, a newline)."""
    name, big = _string(log), 10 ** 19  # wider than any seq, device, inode or offset
    return name, len(f'{{"log":{name},"seq":{big},"hash":"{GENESIS}","dev":{big},"ino":{big},"end":{big},'
                     f'"length":{big}}}') + 1


def read_head(dirfd: int, name: str = HEAD_FILE) -> Head | None:
    """The head state in the folder ``dirfd`` (``None`` when there is none), read a few times
    over while its writer may be updating it.

    Raises:
        OSError: not a 0600 regular file of the folder's owner (:func:`mcpd.common.folders.read_file`).
        ValueError: it holds no head.
    """
    for attempt in range(3):
        data = read_file(dirfd, name)
        if data is None:
            return None
        try:
            return Head.decode(data)
        except ValueError:
            if attempt == 2:
                raise
            time.sleep(0.01)  # a pwrite under way (a read may see it half done)
    raise AssertionError("unreachable")


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
        head_dir: a descriptor of the writer's own state folder (0700), to keep the chain's head
            in (the file ``head_name``; see the module docstring), or None to keep it in memory
            only.

    On start, a log that does not end where the head says is one ``alert`` record, written at
    once.

    Raises:
        OSError: the folder or file cannot be created or opened (the helper must not run blind),
            the folder is writable by other accounts (it is never chmodded: it may be ``/tmp``),
            or the head file is not a 0600 regular file of this account.
    """

    def __init__(self, path: str, syslog: bool = True, clock: Callable[[], float] = time.monotonic,
                 ident: str = "mcpd-audit", journal: str = JOURNAL_SOCKET, head_dir: int | None = None,
                 head_name: str = HEAD_FILE) -> None:
        self.path, self._clock, self._abspath = path, clock, os.path.abspath(path)
        self._alerts: dict[str, list[float]] = {}  # reason -> [window start, written, suppressed]
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, mode=0o700, exist_ok=True)  # a folder it makes is its own alone
        if stat.S_IMODE(os.stat(folder).st_mode) & 0o022:  # never chmod a folder others use (/tmp)
            raise OSError(errno.EPERM, f"the log's folder {folder} is writable by other accounts")
        self._fd = self._open()
        self._lock = threading.Lock()
        self._pending: list[str] = []  # alerts (encoded bodies) to write before the next record
        self._number: int | None = None  # the number of the log file _fd is (ROTATE)
        self._ident = ident
        self.started_fresh = False  # no head state, no record in the log or FILE.1: a new log
        self._head_fd = -1
        self._journal: tuple[socket.socket, str] | None = None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._start(head_dir, head_name)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            if self._pending:
                self._write([])
        except BaseException:
            os.close(self._fd)
            if self._head_fd >= 0:
                os.close(self._head_fd)
            raise
        if syslog and stat.S_ISSOCK(os.stat(journal).st_mode if os.path.exists(journal) else 0):
            self._journal = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC), journal

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

    # -- where the chain goes on ------------------------------------------------------------------
    #
    # ``_seq``/``_prev``: the record the next one follows. ``_mark``: (dev, ino, end, length) of the
    # record hashing to ``_prev`` in the file ``_fd`` (length 0: none there, as in a new file after a
    # rotation). A file whose (dev, ino, size) is the mark's ends where this writer left it; any other
    # is looked at (:meth:`_reconcile`) before the next record.

    def _set_mark(self, fst: os.stat_result, end: int, length: int) -> None:
        self._mark = (fst.st_dev, fst.st_ino, end, length)

    def _start(self, head_dir: int | None, head_name: str) -> None:
        """The chain position on start: the log's last whole line, or, when it has none, the last
        line of ``FILE.1`` (the file logrotate just renamed); with ``head_dir``, checked against the
        head this writer left there, and the head file (re)written."""
        fst = os.fstat(self._fd)
        line, partial = tail_of(self._fd, fst.st_size)
        self._set_mark(fst, fst.st_size - len(partial), len(line))
        self._seq, self._prev = chain_after(line)
        where = self._mark  # the file and place of the record the chain goes on from
        older = None
        if fst.st_size:
            self._number = file_number(first_line(self._fd))
        elif (older := self._read_end(self.path + ".1")) is not None and older[1]:
            ost, oline, oend, ofirst = older  # rotated while stopped: this empty file is the next one
            self._seq, self._prev = chain_after(oline)
            where = (ost.st_dev, ost.st_ino, oend, len(oline))
            self._new_file(file_number(ofirst))
        else:
            self._number = 1
        if head_dir is None:
            return
        try:
            stored = read_head(head_dir, head_name)
        except ValueError:
            self._alert("the audit log's head state was unreadable; it is written anew")
        else:
            if stored is not None:
                self._check_head(stored)
            elif self._seq:  # a log older than its head (an upgrade), or a head removed
                self._alert("the audit log's head state was missing; it is written anew")
            else:
                self.started_fresh = True
        if self._seq and not fst.st_size and not (older and older[1]):
            self._number = None  # its earlier files are gone: which number this file is, is not known
        if self._pending:  # the start's alerts come next, in this file: the head names their place
            where = self._mark
        write_file(head_dir, head_name, Head(self._abspath, self._seq, self._prev, *where).encode())
        fd = os.open(head_name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY, dir_fd=head_dir)
        hst = os.fstat(fd)
        if not stat.S_ISREG(hst.st_mode) or hst.st_uid != os.geteuid() or hst.st_nlink != 1 or hst.st_mode & 0o077:
            os.close(fd)
            raise OSError(f"{head_name}: the audit head must be a 0600 regular file of this account")
        self._head_fd = fd

    def _read_end(self, path: str) -> tuple[os.stat_result, bytes, int, bytes] | None:
        """``(fstat, last whole line, its end offset, first line)`` of the regular file ``path``, or
        None when it cannot be read (missing, not a regular file)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            return None
        try:
            fst = os.fstat(fd)
            if not stat.S_ISREG(fst.st_mode):
                return None
            line, partial = tail_of(fd, fst.st_size)
            return fst, line, fst.st_size - len(partial), first_line(fd)
        finally:
            os.close(fd)

    def _check_head(self, stored: Head) -> None:
        """Compare the log as found on start with the head this writer left: the record it wrote
        last must still be where it wrote it (in the log, or in ``FILE.1`` after a rotation), else
        one alert names what is gone and the chain goes on after it (numbers are never reused)."""
        if stored.log != self._abspath:
            self._alert("the audit log is not where its writer last wrote", log_file=stored.log,
                        missing_to=stored.seq)
            self._go_on(stored.seq, stored.hash, lost=True)
            return
        if stored.length == 0 or (self._seq, self._prev) == (stored.seq, stored.hash) or self._holds(stored):
            return  # (length 0: the log was empty; the same last record: a copy of the file is no loss)
        now = self._seq
        if now < stored.seq:
            self._alert(lost_reason(self._ident), log_file=self.path, missing_from=now + 1 if now else None,
                        missing_to=stored.seq, found_seq=now)
        else:
            self._alert(lost_reason(self._ident), log_file=self.path, missing_from=stored.seq, missing_to=stored.seq,
                        found_seq=now)
        self._go_on(stored.seq, stored.hash, lost=True)

    def _holds(self, stored: Head) -> bool:
        """Whether the record ``stored`` names is still in its file (the log, else ``FILE.1``),
        byte for byte, at the offset it was written to."""
        for path in (self.path, self.path + ".1"):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
            except OSError:
                continue
            try:
                fst = os.fstat(fd)
                if (fst.st_dev, fst.st_ino) == (stored.dev, stored.ino):
                    return stat.S_ISREG(fst.st_mode) and fst.st_size >= stored.end and hashlib.sha256(
                        os.pread(fd, stored.length, stored.end - stored.length)).hexdigest() == stored.hash
            finally:
                os.close(fd)
        return False

    def _go_on(self, seq: int, prev: str, lost: bool) -> None:
        """Continue the chain after the record ``(seq, prev)`` when it is the later one: never
        reuse a number. ``lost``: that record is gone, so its hash is still the right ``prev``
        (the gap stays visible to ``verify``)."""
        if seq > self._seq or (lost and seq == self._seq):
            self._seq, self._prev = seq, prev

    def _alert(self, reason: str, **fields: Any) -> None:
        """Queue an alert to write before the next record (never rate-limited: each is one event)."""
        self._pending.append(_body("alert", dict(reason=reason, **fields)))

    def _new_file(self, before: int | None) -> None:
        """``_fd`` is a new, empty file of the log, after the file numbered ``before``: queue its
        :data:`ROTATE` record first, ahead of any alert (it is the file's first line)."""
        self._number = None if before is None else before + 1
        self._pending.insert(0, _body(ROTATE, {"reason": "the log goes on in a new file", "log_file": self.path,
                                               "file_number": self._number, "previous_seq": self._seq}))

    def _gone(self) -> None:
        """The file ``_fd`` was removed, not renamed (no name is left): the records in it are lost
        with it. Queue the alert naming them (its first record's seq to the last written)."""
        try:
            first, _ = chain_after(first_line(self._fd))
        except OSError:
            first = 0
        self._alert(lost_reason(self._ident), log_file=self.path, missing_from=first or None, missing_to=self._seq,
                    found_seq=0, detail="its file was deleted while its writer had it open")

    def _reconcile(self, fst: os.stat_result) -> bytes:
        """The file ``_fd`` (its ``fstat`` ``fst``, taken under the lock) does not end where this
        writer left it: find where the chain goes on. When its last record is still in place,
        another writer appended: go on from the file's last whole line. When it is not (the file was
        cut, emptied in place or rewritten), queue an alert naming the records gone and go on after
        the last one written (its hash stays ``prev``, so ``verify`` shows the gap too). Returns the
        newline that ends a torn last line (``b""`` when there is none)."""
        line, partial = tail_of(self._fd, fst.st_size)
        seq, digest = chain_after(line)
        dev, ino, end, length = self._mark
        mine = (fst.st_dev, fst.st_ino) == (dev, ino) and (length == 0 or fst.st_size >= end and hashlib.sha256(
            os.pread(self._fd, length, end - length)).hexdigest() == self._prev)
        if mine:
            if line:
                self._seq, self._prev = max(seq, self._seq), digest
        else:
            if seq < self._seq:
                self._alert(lost_reason(self._ident), log_file=self.path, missing_from=seq + 1 if seq else None,
                            missing_to=self._seq, found_seq=seq)
            else:
                self._alert(lost_reason(self._ident), log_file=self.path, missing_from=self._seq,
                            missing_to=self._seq, found_seq=seq)
                self._seq, self._prev = seq, digest
        self._set_mark(fst, fst.st_size - len(partial), len(line))
        return b"\n" if partial else b""

    def _lock_current(self) -> os.stat_result:
        """``flock`` our file, first reopening the path while it no longer names it (renamed by
        logrotate, or removed), and return the file's ``fstat`` taken under the lock. Writers
        check the path under the lock, so once we hold the old file's lock nobody writes to it
        again: its end is where the chain goes on (checked first: a file cut before it was renamed
        is an alert in the new one). When anything fails (the path cannot be opened again) the
        lock is released before the error is raised: other writers never wait on a record that
        was not written."""
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
                if (fst.st_dev, fst.st_ino, fst.st_size) != self._mark[:3]:
                    self._reconcile(fst)
                if fst.st_nlink == 0 and self._seq:
                    self._gone()
                fd = self._open()
                nst = os.fstat(fd)
                self._set_mark(nst, 0, 0)
            except BaseException:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                raise
            os.close(self._fd)  # drops the old file's lock
            self._fd = fd
            if nst.st_size == 0:
                self._new_file(self._number)
            else:  # another writer went on here first: its rotate record says which file this is
                self._number = file_number(first_line(fd))

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

    def record_set(self, event: str, records: list[dict[str, Any]]) -> None:
        """Append one record of ``event`` for each field mapping in ``records``, adjacent (one
        ``write``: no other record comes between them), as the next links of the chain. Not for
        alerts.

        Raises:
            AuditError: a record :meth:`record` refuses (nothing is written).
            OSError: the write failed.
        """
        if event == "alert":
            raise AuditError("alerts are written with record()")
        bodies = [_body(event, fields) for fields in records]
        with self._lock:
            self._write_due(self._clock())
            self._write(bodies)

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

    def _write(self, bodies: str | list[str]) -> None:
        """Append the records of encoded ``bodies`` (see :func:`_body`; one, or several written at
        once, adjacent), after any alert queued, each with the next ``seq``/``prev``, in one
        ``write``; then the head state, when kept, names the last."""
        fst = self._lock_current()
        try:
            torn = self._reconcile(fst) if (fst.st_dev, fst.st_ino, fst.st_size) != self._mark[:3] else b""
            todo = self._pending + ([bodies] if isinstance(bodies, str) else bodies)
            lines, seq, prev = [], self._seq, self._prev
            for body in todo:
                seq += 1
                data = (_line(body, seq, prev) + "\n").encode("ascii")
                prev = hashlib.sha256(data).hexdigest()
                lines.append(data)
            if not lines:
                return
            out = torn + b"".join(lines)
            if os.write(self._fd, out) != len(out):
                raise OSError(f"{self.path}: short audit write")
            self._seq, self._prev, self._pending = seq, prev, []
            self._set_mark(fst, fst.st_size + len(out), len(lines[-1]))
            if self._head_fd >= 0:
                os.pwrite(self._head_fd, _head_line(self._abspath, seq, prev, *self._mark), 0)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        if self._journal is not None:
            for data in lines:
                try:
                    self._journal[0].sendto(journal_entry(data.decode("ascii").rstrip("\n"), self._ident),
                                            socket.MSG_DONTWAIT, self._journal[1])
                except OSError:
                    pass  # journald busy or gone: the file has the record

    def close(self) -> None:
        """Write the counts of alerts still held back, then close the file (idempotent)."""
        with self._lock:
            if self._fd >= 0:
                self._write_due(None)
                os.close(self._fd)
                self._fd = -1
            if self._head_fd >= 0:
                os.close(self._head_fd)
                self._head_fd = -1
            if self._journal is not None:
                self._journal[0].close()

    def __enter__(self) -> "AuditLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
