"""The policy process's channels to the root helper (:mod:`mcpd.helper.monitor`): thread-safe.

Root hands the policy process several socketpairs (fds 4, 5, ...), each served by a root thread
of its own. A request takes a free channel, sends, and reads its own reply on it: no thread
hands a reply to another. When root goes away the policy process has nothing left to stand on:
the kernel kills it (parent-death signal), and a channel that ends makes it exit at once.

A request root does not answer in time (an ``open`` on a file system that stopped answering, a
PAM module that hangs) holds its channel and its root thread, and nothing else:

* the first :data:`RESERVED` channels serve only the kinds that must never wait behind an open or
  a login (:data:`RESERVED_KINDS`: the configuration files, whether an account is usable, new
  workers and walkers, kills), the others everything else;
* privileged opens hold at most :data:`OPENS` channels at once in all, and :data:`OPENS_EACH` for
  one principal, counted until root answers, however late: a principal whose opens hang waits for
  its own, and the logins keep channels of their own;
* a channel whose reply came too late is not lost: the caller gives up on it after
  :data:`ROOT_SECONDS`, and once root's late reply arrives (the file system answers again, or
  fails) it is read and dropped, with any descriptor in it, and the channel is free again.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import socket
import threading
from typing import Any

from mcpd.common import frames
from mcpd.common.filesig import Signature
from mcpd.common.inflight import InFlight
from mcpd.helper.wire.errors import HELPER_UNAVAILABLE, INTERNAL_ERROR, ToolError

log = logging.getLogger("mcpd.policy")

MAX_FDS = 4
ROOT_SECONDS = 60.0  # the longest root takes: PAM (10 s at most, the policy's wait) or a kill (5 s)
RESERVED = 6  # channels kept for RESERVED_KINDS
RESERVED_KINDS = frozenset({"config", "account", "spawn", "walk", "kill"})
OPENS = 12  # privileged opens in flight at once (of the channels not reserved: 18 of 24)
OPENS_EACH = 4  # privileged opens of one principal in flight at once: a worker pool's worth
OPEN_WAIT_SECONDS = 10.0  # how long an open waits for one of OPENS_EACH (or OPENS) to be free


class RootClient:
    """Ask root for what needs root; each method blocks until root answers.

    Args:
        channels: the policy's ends of the socketpairs (blocking sockets), more than
            :data:`RESERVED` of them (``ValueError`` otherwise).

    Every method raises :class:`ToolError` when root refuses (its code and reason), or
    ``HELPER_UNAVAILABLE`` (reason ``busy``) when no channel is free within :data:`ROOT_SECONDS`
    (for an open: none of the principal's opens, or of all, within :data:`OPEN_WAIT_SECONDS`), or
    root does not answer within :data:`ROOT_SECONDS`.
    """

    def __init__(self, channels: list[socket.socket]) -> None:
        if len(channels) <= RESERVED:
            raise ValueError(f"root must give more than {RESERVED} channels")
        self._ids = itertools.count(1)
        # last in, first out: the channel (and root thread) used last is taken again, still warm
        self._free: tuple[queue.LifoQueue[socket.socket], ...] = (queue.LifoQueue(), queue.LifoQueue())
        for n, sock in enumerate(channels):
            frames.limit_sends(sock, frames.SEND_SECONDS)  # root reads each request at once
            self._free[n < RESERVED].put(sock)
        self._opens = InFlight(OPENS_EACH, OPENS)  # opens in flight, per principal and in all
        self._slots = threading.Condition()
        #: channels whose reply is late: fd -> (channel, request id, its pool, the principal of an open)
        self._late: dict[int, tuple[socket.socket, int, queue.LifoQueue[socket.socket], str | None]] = {}
        self._wake = threading.Event()
        threading.Thread(target=self._reclaim, name="root-late-replies", daemon=True).start()

    def _take_open(self, who: str) -> None:
        """Count an open for principal ``who`` in flight, waiting (at most :data:`OPEN_WAIT_SECONDS`)
        while it or everyone has as many as allowed."""
        with self._slots:
            if not self._slots.wait_for(lambda: self._opens.over(who) is None, OPEN_WAIT_SECONDS):
                raise ToolError(HELPER_UNAVAILABLE, "too many privileged opens in flight", reason="busy")
            self._opens.add(who)

    def _open_done(self, who: str | None) -> None:
        if who is not None:
            with self._slots:
                self._opens.release(who)
                self._slots.notify_all()

    def _reclaim(self) -> None:
        """Read each late reply when it comes (closing its descriptors), then free its channel and
        its open (runs on a thread of its own)."""
        while self._wake.wait():
            self._wake.clear()
            while self._late:
                for fd in frames.ready(list(self._late), 1.0):
                    sock, rid, pool, who = self._late.pop(fd)
                    reply, fds = frames.recv_frame_fds(sock, frames.reply_cap(1 << 20), MAX_FDS)
                    for got in fds:
                        os.close(got)
                    if reply is None or reply.get("id") != rid:
                        log.error("the root helper is gone; the policy process stops")
                        os._exit(1)
                    log.info("root answered a request late; its channel is free again")
                    pool.put(sock)
                    self._open_done(who)

    def call(self, kind: str, who: str | None = None, **fields: Any) -> tuple[dict[str, Any], list[int]]:
        """Send one request and wait for its reply: ``(reply, descriptors)`` (the caller closes
        them). ``who``: the principal an ``open`` is for (counted against :data:`OPENS_EACH` and
        :data:`OPENS` until root answers). Raises :class:`ToolError` as the class says."""
        pool = self._free[kind in RESERVED_KINDS]
        if who is not None:
            self._take_open(who)
        late = False
        try:
            try:
                sock = pool.get(timeout=ROOT_SECONDS)
            except queue.Empty:
                raise ToolError(HELPER_UNAVAILABLE, "the root helper is busy", reason="busy") from None
            rid = next(self._ids)
            frames.send_frame(sock, dict(fields, type=kind, id=rid))
            if not frames.ready([sock.fileno()], ROOT_SECONDS):
                late = True  # its reply, when it comes, frees the channel and the open (_reclaim)
                self._late[sock.fileno()] = (sock, rid, pool, who)
                self._wake.set()
                raise ToolError(HELPER_UNAVAILABLE, "the root helper did not answer", reason="busy")
            reply, fds = frames.recv_frame_fds(sock, frames.reply_cap(1 << 20), MAX_FDS)
            if reply is None or reply.get("id") != rid:
                log.error("the root helper is gone; the policy process stops")
                os._exit(1)
            pool.put(sock)  # (a channel whose send or receive failed is not used again)
        finally:
            if not late:
                self._open_done(who)
        if not reply.get("ok"):
            for fd in fds:
                os.close(fd)
            raise frames.reply_error(reply.get("error"))
        return reply, fds

    def open(self, path: str, follow: bool, want: str, who: str) -> tuple[int, str]:
        """A descriptor of ``path`` opened by root's checked opener (``want``: ``"file"`` or
        ``"any"``, see :func:`mcpd.helper.wire.opener.open_checked`) and its real path as root saw it,
        for principal ``who`` (at most :data:`OPENS_EACH` of its opens in flight at once)."""
        reply, fds = self.call("open", who, path=path, follow=follow, want=want)
        real = reply.get("real")
        if not isinstance(real, str) or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise ToolError(INTERNAL_ERROR, "the root helper answered an open without its descriptor and path")
        return fds[0], real

    def config_fd(self, path: str) -> int:
        """A read descriptor of ``mcpd.yaml``, the users or the grants file (the caller checks it)."""
        return self.call("config", path=path)[1][0]

    def signature(self, path: str) -> Signature:
        """The :func:`mcpd.common.filesig.stat_signature` of one of those files, from the
        descriptor root opens. Raises :class:`ToolError` when root cannot open it."""
        fd = self.config_fd(path)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def spawn(self, user: str, limits: str) -> tuple[int, socket.socket, socket.socket, int]:
        """A new worker as OS account ``user``: ``(pid, front end, control end, pidfd)``."""
        reply, fds = self.call("spawn", user=user, limits=limits)
        return reply["pid"], socket.socket(fileno=fds[0]), socket.socket(fileno=fds[1]), fds[2]

    def walk(self) -> tuple[int, socket.socket, int]:
        """A new walker: ``(pid, its channel, pidfd)``."""
        reply, fds = self.call("walk")
        return reply["pid"], socket.socket(fileno=fds[0]), fds[1]

    def kill(self, pid: int) -> None:
        """SIGKILL a worker or walker root made, and wait (at most 5 s) until it is gone."""
        self.call("kill", pid=pid)

    def pam(self, user: str, password: str) -> tuple[bool, int, str]:
        """PAM authentication and account check of ``user``: ``(ok, PAM code, reason)``."""
        reply = self.call("pam", user=user, password=password)[0]
        return bool(reply["pass"]), int(reply["code"]), str(reply["reason"])

    def usable(self, user: str) -> bool:
        """Whether ``user`` may still use its login tokens (``/etc/shadow``: not locked, not expired)."""
        return bool(self.call("account", user=user)[0]["usable"])
