"""Checkpoints of a log's hash chain sent off the host: the journal and syslog, best effort.

A checkpoint names a log (its writer's identifier, ``mcpd-audit`` or ``mcpd-access``), the
``seq`` of a record and that record's hash (:func:`mcpd.common.audit.chain.record_hash`: SHA-256
hex of its bytes, newline included). :class:`Checkpoints` sends one after the record that makes
``records`` records since the last checkpoint, and otherwise at most ``seconds`` after the first
record not yet covered (a timer thread), and on close. Each goes to the journal (native protocol,
:data:`CHECKPOINT_IDENT`, :data:`MESSAGE_ID`, ``MCPD_LOG``, ``MCPD_CHECKPOINT_SEQ``,
``MCPD_CHECKPOINT_HASH``) and to syslog (one RFC 3164 line on the local socket, as glibc's
``syslog()`` writes it), never into the log itself: a copy whoever rewrites the log cannot reach
(docs/REFERENCE.md §7.3). Sending never waits and never fails a record.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import threading
import time
from collections.abc import Callable

from mcpd.common.audit.journal import Journal, native_entry

SYSLOG_SOCKET = "/dev/log"
CHECKPOINT_IDENT = "mcpd-checkpoint"  # SYSLOG_IDENTIFIER and syslog tag of every checkpoint
MESSAGE_ID = "5eecdda929584052b84814f7ec89843d"  # the journal's MESSAGE_ID of every checkpoint
SYSLOG_PRI = 3 * 8 + 5  # daemon.notice
MARK = "mcpd checkpoint"  # how every checkpoint's message begins
_MESSAGE = re.compile(r"mcpd checkpoint log=([A-Za-z0-9._-]{1,64}) seq=([0-9]{1,19}) hash=([0-9a-f]{64})(?=\s|$)",
                      re.ASCII)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """Record ``seq`` of the log ``log`` hashes to ``hash`` (64 lowercase hex)."""

    log: str
    seq: int
    hash: str

    def message(self) -> str:
        """The text of the checkpoint: ``mcpd checkpoint log=L seq=N hash=H``."""
        return f"{MARK} log={self.log} seq={self.seq} hash={self.hash}"

    def journal_entry(self, path: str) -> bytes:
        """The checkpoint in the journal's native protocol; ``path``: the log file (``MCPD_LOG_FILE``)."""
        return native_entry({"MESSAGE": self.message(), "MESSAGE_ID": MESSAGE_ID, "SYSLOG_IDENTIFIER": CHECKPOINT_IDENT,
                             "PRIORITY": 5, "MCPD_LOG": self.log, "MCPD_CHECKPOINT_SEQ": self.seq,
                             "MCPD_CHECKPOINT_HASH": self.hash, "MCPD_LOG_FILE": path})

    def syslog_line(self, when: float) -> bytes:
        """The checkpoint as one local syslog line (RFC 3164: ``<29>Mmm dd hh:mm:ss
        mcpd-checkpoint[PID]: message``), ``when`` in seconds since the epoch (local time)."""
        stamp = time.strftime("%b %e %H:%M:%S", time.localtime(when))
        return f"<{SYSLOG_PRI}>{stamp} {CHECKPOINT_IDENT}[{os.getpid()}]: {self.message()}".encode("ascii")


def parse_message(text: str) -> Checkpoint | None:
    """The checkpoint :meth:`Checkpoint.message` wrote somewhere in ``text`` (a syslog line as a
    collector keeps it, or a journal ``MESSAGE``); None when ``text`` holds no :data:`MARK`.

    Raises:
        ValueError: ``text`` holds the mark but no well-formed checkpoint after it.
    """
    if MARK not in text:
        return None
    found = _MESSAGE.search(text)
    if found is None:
        raise ValueError(f"'{MARK}' is not followed by log=NAME seq=N hash=64-hex")
    return Checkpoint(found[1], int(found[2]), found[3])


class Checkpoints:
    """The checkpoints of one log's chain (see the module docstring).

    Args:
        log: the log's name (its writer's identifier). path: the log file, named in the journal.
        records: at most this many records between checkpoints (>= 1).
        seconds: a record is covered by a checkpoint at most this long after it was written (> 0).
        journal: the journal to send to (the writer's own; None: none); syslog: the syslog socket
            (a datagram socket, tried at each checkpoint; ``""``: none).
        clock: monotonic seconds. timer: run the thread that sends a checkpoint when ``seconds``
            pass with no record (off: only :meth:`poll` and the next record look at the time).
    """

    def __init__(self, log: str, path: str, records: int = 100, seconds: float = 60.0, journal: Journal | None = None,
                 syslog: str = SYSLOG_SOCKET, clock: Callable[[], float] = time.monotonic, timer: bool = True) -> None:
        self.log, self.path, self.records, self.seconds = log, path, records, seconds
        self._clock, self._timer, self._syslog_path = clock, timer, syslog
        self._journal = journal
        self._syslog: socket.socket | None = None  # made at the first checkpoint
        self._cond = threading.Condition()
        self._last: tuple[int, str] | None = None  # (seq, hash) of the last record written
        self._uncovered = 0  # records written since the last checkpoint
        self._since = 0.0  # when the first of them was written (clock)
        self._thread: threading.Thread | None = None
        self._closed = False

    def wrote(self, count: int, seq: int, digest: str) -> None:
        """``count`` records were written, the last numbered ``seq`` with hash ``digest``: send a
        checkpoint now when one is due, else make sure the timer will. Never raises."""
        with self._cond:
            now, first = self._clock(), not self._uncovered
            if first:
                self._since = now
            self._last, self._uncovered = (seq, digest), self._uncovered + count
            if self._uncovered >= self.records or now - self._since >= self.seconds:
                self._emit()
            elif first and self._timer and not self._closed:
                self._arm()  # (a new deadline: later records keep it, and wake nobody)

    def poll(self) -> None:
        """Send a checkpoint when the oldest record not covered was written ``seconds`` ago or more."""
        with self._cond:
            if self._uncovered and self._clock() - self._since >= self.seconds:
                self._emit()

    def close(self) -> None:
        """Send a checkpoint of the records not covered yet, stop the timer, close the syslog
        socket (idempotent; the journal is its owner's to close)."""
        with self._cond:
            if self._uncovered:
                self._emit()
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        if self._syslog is not None:
            self._syslog.close()

    def _emit(self) -> None:
        """Send the checkpoint of the last record (holding the lock; sends never wait)."""
        assert self._last is not None
        point = Checkpoint(self.log, *self._last)
        self._uncovered = 0
        if self._journal is not None:
            self._journal.send_entry(point.journal_entry(self.path))
        if self._syslog_path:
            try:
                if self._syslog is None:
                    self._syslog = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._syslog.sendto(point.syslog_line(time.time()), socket.MSG_DONTWAIT, self._syslog_path)
            except OSError:
                pass  # no syslog daemon, or busy: best effort

    def _arm(self) -> None:
        """Start the timer thread when it is not running, and wake it (holding the lock)."""
        if self._thread is None:
            thread = threading.Thread(target=self._run, name=f"checkpoints {self.log}", daemon=True)
            try:
                thread.start()
            except RuntimeError:
                return  # no thread to be had: the next record looks at the time
            self._thread = thread
        self._cond.notify_all()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                left = self._since + self.seconds - self._clock() if self._uncovered else None
                if left is not None and left <= 0:
                    self._emit()
                else:
                    self._cond.wait(left)
