"""The audit log: one JSON line per privileged decision or reload (SPEC §4.5).

Each record is one ``write`` on a descriptor opened with ``O_APPEND`` (mode 0600, in a 0700
folder), so records from several processes never interleave and each reaches the kernel at once.
Each line is also sent to syslog (the journal picks it up) when ``/dev/log`` exists.

Record fields (all optional but ``time`` and ``event``): ``time`` (ISO 8601 UTC), ``event``
(``accept``, ``reject``, ``reload``, ``reload_failed``, ``alert`` ...), ``user`` (principal),
``os_user``, ``peer``, ``session``, ``tool``, ``requested_path``, ``resolved_path``, ``rule``,
``decision``, ``reason``, ``bytes``. Keys that name secrets or contents (``token``, ``password``,
``content`` ...) are refused, and values must be scalars, so nothing larger can slip in.
"""

from __future__ import annotations

import datetime
import json
import logging
import logging.handlers
import os
import re
import stat
import threading
from collections import deque
from typing import Any

FORBIDDEN_KEYS = frozenset({"token", "password", "passwd", "secret", "content", "contents"})
_EVENT_RE = re.compile(r"^[a-z][a-z_]{0,31}$")
_KEY_RE = re.compile(r"^[a-z][a-z_]{0,31}$")
MAX_VALUE_CHARS = 4096  # longer strings are cut (a path is at most 4096 bytes anyway)


class AuditError(ValueError):
    """A record that must not be written (forbidden key, bad event name or value type)."""


def _forbidden(key: str) -> bool:
    return key in FORBIDDEN_KEYS or any(key.endswith("_" + word) for word in FORBIDDEN_KEYS)


def _clean(value: Any, key: str) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value[:MAX_VALUE_CHARS]
    raise AuditError(f"audit field {key!r} must be a string, number, boolean or null")


def format_record(event: str, fields: dict[str, Any], now: datetime.datetime | None = None) -> str:
    """Build one audit line (JSON, no trailing newline), validating it.

    Raises:
        AuditError: bad event name, a key naming a secret or contents, or a non-scalar value.
    """
    if not _EVENT_RE.match(event):
        raise AuditError(f"bad audit event {event!r}")
    when = now or datetime.datetime.now(datetime.timezone.utc)
    record: dict[str, Any] = {"time": when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "event": event}
    for key, value in fields.items():
        if not _KEY_RE.match(key) or key in ("time", "event"):
            raise AuditError(f"bad audit field name {key!r}")
        if _forbidden(key):
            raise AuditError(f"audit field {key!r} is never logged")
        record[key] = _clean(value, key)
    return json.dumps(record, ensure_ascii=True, separators=(",", ":"))


def _syslog_logger() -> logging.Logger | None:
    if not os.path.exists("/dev/log"):
        return None
    try:
        handler = logging.handlers.SysLogHandler(
            address="/dev/log", facility=logging.handlers.SysLogHandler.LOG_AUTHPRIV
        )
    except OSError:
        return None
    handler.ident = "mcpd-audit: "
    logger = logging.getLogger("mcpd.audit.syslog")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    if not logger.handlers:
        logger.addHandler(handler)
    else:
        handler.close()
    return logger


class AuditLog:
    """An append-only JSON-lines audit log (SPEC §4.5).

    Args:
        path: the log file; its folder is created with mode 0700 when missing, the file with 0600.
        syslog: also send each line to syslog when ``/dev/log`` exists.

    Raises:
        OSError: the folder or file cannot be created or opened (the helper must not run blind).
    """

    def __init__(self, path: str, syslog: bool = True) -> None:
        self.path = path
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(folder)
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(folder, 0o700)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NOCTTY
        self._fd = os.open(path, flags, 0o600)
        fst = os.fstat(self._fd)
        if not stat.S_ISREG(fst.st_mode):
            os.close(self._fd)
            raise OSError(f"{path}: audit log is not a regular file")
        if stat.S_IMODE(fst.st_mode) != 0o600 and fst.st_uid == os.geteuid():
            os.fchmod(self._fd, 0o600)
        self._lock = threading.Lock()
        self._syslog = _syslog_logger() if syslog else None

    def record(self, event: str, **fields: Any) -> None:
        """Append one record (see the module docstring for the fields).

        Raises:
            AuditError: the record breaks the rules (nothing is written).
            OSError: the write failed.
        """
        line = format_record(event, fields)
        data = (line + "\n").encode("ascii")
        with self._lock:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"{self.path}: short audit write")
        if self._syslog is not None:
            self._syslog.info("%s", line)

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> "AuditLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tail_lines(path: str, count: int, block: int = 65536, end: int | None = None) -> list[str]:
    """The last ``count`` lines of ``path`` (read backwards in ``block``-byte steps, memory ~ answer).

    ``end`` (bytes) stops at that offset instead of the current size, so a follower can go on from
    exactly there.

    Raises:
        OSError: cannot open the file.
    """
    if count <= 0:
        return []
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        size = os.fstat(fd).st_size
        end = size if end is None else min(end, size)
        found: deque[bytes] = deque()
        rest = b""
        pos = end
        while pos > 0 and len(found) <= count:
            step = min(block, pos)
            pos -= step
            chunk = os.pread(fd, step, pos) + rest
            pieces = chunk.split(b"\n")
            rest = pieces[0]
            for piece in reversed(pieces[1:]):
                found.appendleft(piece)
        if pos == 0:
            found.appendleft(rest)
    finally:
        os.close(fd)
    lines = [p.decode("utf-8", "replace") for p in found]
    if lines and lines[-1] == "":
        lines.pop()
    return [line for line in lines if line][-count:]
