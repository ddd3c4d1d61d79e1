"""The audit writer: an append-only, hash-chained JSON-lines log (docs/REFERENCE.md §7).

Two logs use it: the policy process's audit log (privileged calls, logins, workers, grants
loads, alerts) and the front's access log (every call that does not reach the policy process).
Each record is one ``write`` on a descriptor opened with ``O_APPEND`` (mode 0600, in a folder
others cannot write), under an exclusive ``flock``, so records never interleave; several
adjacent records go in one ``write`` (:meth:`AuditLog.record_set`). Records are built by
:mod:`~mcpd.common.audit.records`, chained by :mod:`~mcpd.common.audit.chain`, copied to the
journal by :mod:`~mcpd.common.audit.journal`, checkpointed off the host by
:mod:`~mcpd.common.audit.checkpoint`; alerts are limited by :mod:`~mcpd.common.audit.alerts`.

The checks this module holds: on start the chain resumes from the file's last line, or, when the
file is empty, from the last line of ``FILE.1`` (the file logrotate just renamed), and the
head file (:mod:`~mcpd.common.audit.head`) must name a record still in place. Before each record,
holding the lock, the writer checks that the path still names its file (else: renamed by
logrotate, or removed, and it opens the new one, whose first record is a ``rotate`` record) and
that the file ends where it left it (same device, inode, size: the usual case, nothing more to
read). Another size is looked at: its last record still in place means another writer appended;
gone (cut, emptied in place, rewritten) is a lost-tail ``alert`` naming the records gone, and
the chain goes on after the last record written, numbers never reused. A file found deleted (no
name left) rather than renamed is an alert naming the records it held. ``copytruncate`` cannot
be told from a cut and is reported as one. Each log has one writer process in the daemon; two
writers stay chained except across two rotations between two records of one of them.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

from mcpd.common.audit.alerts import AlertLimit
from mcpd.common.audit.chain import (
    ROTATE,
    chain_after,
    file_number,
    first_line,
    holds_record,
    lost_reason,
    record_hash,
    tail_of,
)
from mcpd.common.audit.checkpoint import SYSLOG_SOCKET, Checkpoints
from mcpd.common.audit.head import HEAD_FILE, Head, head_line, read_head
from mcpd.common.audit.journal import JOURNAL_SOCKET, Journal
from mcpd.common.audit.records import (
    AuditError,
    Fields,
    Prepared,
    field_members,
    record_body,
    record_line,
    refuse_twice,
)
from mcpd.common.folders import write_file


class AuditLog:
    """An append-only, hash-chained JSON-lines audit log (docs/REFERENCE.md §7; see the module docstring).

    Args:
        path: the log file; its folder is created with mode 0700 when missing, the file with 0600.
        syslog: also send each record to the system log: the journal (native protocol, at
            ``journal``), when that socket exists at start.
        ident: the journal's ``SYSLOG_IDENTIFIER`` (``mcpd-audit``; the front's access log:
            ``mcpd-access``).
        journal: the journal socket (a namespaced journald's, in tests).
        head_dir: a descriptor of the writer's own state folder (0700), to keep the chain's head
            in (the file ``head_name``; :mod:`mcpd.common.audit.head`), or None to keep it in memory
            only.
        checkpoints: ``(records, seconds)``, how often a checkpoint of the chain goes to the
            journal and to syslog at ``syslog_socket`` (:mod:`mcpd.common.audit.checkpoint`; with
            ``syslog`` only).

    On start, a log that does not end where the head says is one ``alert`` record, written at
    once.

    Raises:
        OSError: the folder or file cannot be created or opened (the writer must not run blind),
            the folder is writable by other accounts (it is never chmodded: it may be ``/tmp``),
            or the head file is not a 0600 regular file of this account.
    """

    def __init__(self, path: str, syslog: bool = True, clock: Callable[[], float] = time.monotonic,
                 ident: str = "mcpd-audit", journal: str = JOURNAL_SOCKET, head_dir: int | None = None,
                 head_name: str = HEAD_FILE, checkpoints: tuple[int, float] = (100, 60.0),
                 syslog_socket: str = SYSLOG_SOCKET) -> None:
        self.path, self._clock, self._abspath = path, clock, os.path.abspath(path)
        self._limit = AlertLimit(clock)
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
        self._journal = Journal.at(journal) if syslog else None
        self._checkpoints = Checkpoints(ident, self._abspath, *checkpoints, journal=self._journal,
                                        syslog=syslog_socket) if syslog else None
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
            if self._checkpoints is not None:
                self._checkpoints.close()
            if self._journal is not None:
                self._journal.close()
            raise

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
                    return stat.S_ISREG(fst.st_mode) and holds_record(fd, fst.st_size, stored.end, stored.length,
                                                                      stored.hash)
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
        self._pending.append(record_body("alert", dict(reason=reason, **fields)))

    def _new_file(self, before: int | None) -> None:
        """``_fd`` is a new, empty file of the log, after the file numbered ``before``: queue its
        :data:`ROTATE` record first, ahead of any alert (it is the file's first line)."""
        self._number = None if before is None else before + 1
        self._pending.insert(0, record_body(ROTATE, {"reason": "the log goes on in a new file", "log_file": self.path,
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
        mine = (fst.st_dev, fst.st_ino) == (dev, ino) and (
            length == 0 or holds_record(self._fd, fst.st_size, end, length, self._prev))
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
        """Append one record (the fields: :mod:`mcpd.common.audit.records`), next link of the chain.

        Raises:
            AuditError: the record breaks the rules (nothing is written).
            OSError: the write failed.
        """
        with self._lock:
            self._write_due(self._clock())
            if event == "alert" and not self._limit.admit(fields):
                return
            self._write(record_body(event, fields))

    def record_with(self, event: str, first: Fields, **fields: Any) -> None:
        """Append the record :meth:`record` would write for ``first``'s fields followed by
        ``fields``, without checking and encoding ``first``'s again. Not for alerts.

        Raises:
            AuditError: a field in both, or one :meth:`record` refuses.
            OSError: the write failed.
        """
        if event == "alert":
            raise AuditError("alerts are written with record()")
        refuse_twice(first.keys, fields)
        self._append(record_body(event, fields, first=first.text))

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
        bodies = [record_body(event, fields) for fields in records]
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
        return Prepared(record_body(event, fields), frozenset(fields))

    def finish(self, prepared: Prepared, **fields: Any) -> None:
        """Append a record from :meth:`prepare` with ``fields`` after the ones it has, as the next
        link of the chain.

        Raises:
            AuditError: a field the record already has, or one :meth:`record` refuses.
            OSError: the write failed.
        """
        refuse_twice(prepared.keys, fields)
        self._append(",".join(p for p in (prepared.body, field_members(fields)) if p))

    def _append(self, body: str) -> None:
        """Write the record of encoded ``body`` (not an alert), after the alert counts now due."""
        with self._lock:
            self._write_due(self._clock())
            self._write(body)

    def _write_due(self, now: float | None) -> None:
        """Write the count of each alert reason whose window is over (all when ``now`` is None)."""
        for reason, dropped in self._limit.due(now):
            self._write(record_body("alert", {"reason": reason, "suppressed": dropped}))

    def _write(self, bodies: str | list[str]) -> None:
        """Append the records of encoded ``bodies`` (see
        :func:`~mcpd.common.audit.records.record_body`; one, or several written at once, adjacent),
        after any alert queued, each with the next ``seq``/``prev``, in one ``write``; then the head
        state, when kept, names the last."""
        fst = self._lock_current()
        try:
            torn = self._reconcile(fst) if (fst.st_dev, fst.st_ino, fst.st_size) != self._mark[:3] else b""
            todo = self._pending + ([bodies] if isinstance(bodies, str) else bodies)
            lines, seq, prev = [], self._seq, self._prev
            for body in todo:
                seq += 1
                data = (record_line(body, seq, prev) + "\n").encode("ascii")
                prev = record_hash(data)
                lines.append(data)
            if not lines:
                return
            out = torn + b"".join(lines)
            if os.write(self._fd, out) != len(out):
                raise OSError(f"{self.path}: short audit write")
            self._seq, self._prev, self._pending = seq, prev, []
            self._set_mark(fst, fst.st_size + len(out), len(lines[-1]))
            if self._head_fd >= 0:
                os.pwrite(self._head_fd, head_line(self._abspath, seq, prev, *self._mark), 0)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        if self._journal is not None:
            for data in lines:
                self._journal.send(data.decode("ascii").rstrip("\n"), self._ident)
        if self._checkpoints is not None:
            self._checkpoints.wrote(len(lines), seq, prev)

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
            if self._checkpoints is not None:
                self._checkpoints.close()
                self._checkpoints = None
            if self._journal is not None:
                self._journal.close()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
