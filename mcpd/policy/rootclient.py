"""The policy process's channel to the root helper (:mod:`mcpd.helper.monitor`): thread-safe.

One socketpair, inherited as fd 3; requests are multiplexed by ``id`` and any thread may wait on
its own reply. When root goes away the policy process has nothing left to stand on: it exits at
once (:func:`os._exit`), and the front sees ``HELPER_UNAVAILABLE`` until systemd restarts both.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
from typing import Any

from mcpd.common import frames
from mcpd.common.errors import HELPER_UNAVAILABLE, ToolError
from mcpd.common.filesig import Signature

log = logging.getLogger("mcpd.policy")

MAX_FDS = 4
ROOT_SECONDS = 60.0  # the longest root takes: PAM (10 s at most, the policy's wait) or a kill (5 s)


class RootClient:
    """Ask root for what needs root; each method blocks until root answers.

    Args:
        sock: the policy's end of the socketpair (fd 3).

    Every method raises :class:`ToolError` when root refuses (its code and reason).
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._ids = itertools.count(1)
        self._send = threading.Lock()
        self._pending: dict[int, list[Any]] = {}  # id -> [event, reply, fds]
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name="root-reader", daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                reply, fds = frames.recv_frame_fds(self.sock, frames.reply_cap(1 << 20), MAX_FDS)
                if reply is None:
                    break
                with self._lock:
                    waiter = self._pending.pop(reply.get("id"), None)  # type: ignore[arg-type]
                if waiter is None:
                    for fd in fds:
                        os.close(fd)
                    continue
                waiter[1:] = [reply, fds]
                waiter[0].set()
        except (OSError, frames.FrameError) as exc:
            log.error("channel to the root helper failed: %s", exc)
        log.error("the root helper is gone; the policy process stops")
        os._exit(1)

    def call(self, kind: str, **fields: Any) -> tuple[dict[str, Any], list[int]]:
        """Send one request and wait for its reply: ``(reply, descriptors)`` (the caller closes
        them). Raises :class:`ToolError` when root refused, or ``HELPER_UNAVAILABLE`` when it
        did not answer within :data:`ROOT_SECONDS`."""
        rid = next(self._ids)
        waiter: list[Any] = [threading.Event(), None, []]
        with self._lock:
            self._pending[rid] = waiter
        with self._send:
            frames.send_frame(self.sock, dict(fields, type=kind, id=rid))
        if not waiter[0].wait(ROOT_SECONDS):
            with self._lock:
                self._pending.pop(rid, None)
            raise ToolError(HELPER_UNAVAILABLE, "the root helper did not answer", reason="busy")
        reply, fds = waiter[1], waiter[2]
        if not reply.get("ok"):
            for fd in fds:
                os.close(fd)
            raise ToolError.from_dict(reply.get("error"))
        return reply, fds

    def open(self, path: str, follow: bool, want: str) -> int:
        """A descriptor of ``path`` opened by root's checked opener (``want``: ``"file"`` or
        ``"any"``, see :func:`mcpd.helper.opener.open_checked`)."""
        return self.call("open", path=path, follow=follow, want=want)[1][0]

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
