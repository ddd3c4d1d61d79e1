"""The policy process's channels to the root helper (:mod:`mcpd.helper.monitor`): thread-safe.

Root hands the policy process several socketpairs (fds 4, 5, ...), each served by a root thread
of its own. A request takes a free channel, sends, and reads its own reply on it: no thread
hands a reply to another. When root goes away the policy process has nothing left to stand on:
the kernel kills it (parent-death signal), and a channel that ends makes it exit at once.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import socket
from typing import Any

from mcpd.helper.wire import frames
from mcpd.helper.wire.errors import HELPER_UNAVAILABLE, INTERNAL_ERROR, ToolError
from mcpd.common.filesig import Signature

log = logging.getLogger("mcpd.policy")

MAX_FDS = 4
ROOT_SECONDS = 60.0  # the longest root takes: PAM (10 s at most, the policy's wait) or a kill (5 s)


class RootClient:
    """Ask root for what needs root; each method blocks until root answers.

    Args:
        channels: the policy's ends of the socketpairs (blocking sockets).

    Every method raises :class:`ToolError` when root refuses (its code and reason), or
    ``HELPER_UNAVAILABLE`` when no channel is free or root does not answer within
    :data:`ROOT_SECONDS`.
    """

    def __init__(self, channels: list[socket.socket]) -> None:
        self._ids = itertools.count(1)
        # last in, first out: the channel (and root thread) used last is taken again, still warm
        self._free: queue.LifoQueue[socket.socket] = queue.LifoQueue()
        for sock in channels:
            frames.limit_sends(sock, frames.SEND_SECONDS)  # root reads each request at once
            self._free.put(sock)

    def call(self, kind: str, **fields: Any) -> tuple[dict[str, Any], list[int]]:
        """Send one request and wait for its reply: ``(reply, descriptors)`` (the caller closes
        them). Raises :class:`ToolError` as the class says."""
        try:
            sock = self._free.get(timeout=ROOT_SECONDS)
        except queue.Empty:
            raise ToolError(HELPER_UNAVAILABLE, "the root helper is busy", reason="busy") from None
        rid, healthy = next(self._ids), False
        try:
            frames.send_frame(sock, dict(fields, type=kind, id=rid))
            if not frames.ready([sock.fileno()], ROOT_SECONDS):
                raise ToolError(HELPER_UNAVAILABLE, "the root helper did not answer", reason="busy")
            reply, fds = frames.recv_frame_fds(sock, frames.reply_cap(1 << 20), MAX_FDS)
            if reply is None or reply.get("id") != rid:
                log.error("the root helper is gone; the policy process stops")
                os._exit(1)
            healthy = True
        finally:
            if healthy:
                self._free.put(sock)  # a channel that timed out keeps its late reply: never reused
        if not reply.get("ok"):
            for fd in fds:
                os.close(fd)
            raise ToolError.from_dict(reply.get("error"))
        return reply, fds

    def open(self, path: str, follow: bool, want: str) -> tuple[int, str]:
        """A descriptor of ``path`` opened by root's checked opener (``want``: ``"file"`` or
        ``"any"``, see :func:`mcpd.helper.opener.open_checked`) and its real path as root saw it."""
        reply, fds = self.call("open", path=path, follow=follow, want=want)
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
