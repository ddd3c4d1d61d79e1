"""The root helper's request table: what root does for the policy process, and nothing else.

Like OpenSSH's monitor (``monitor.c``): root serves one peer, the policy process it started
(:mod:`mcpd.policy`, account ``mcpd-policy``), over a socketpair nobody else holds. Each request
type has a strict schema (unknown, missing or wrongly typed keys end the channel, and with it the
daemon) and a handler. Root decides no grant and verifies no token: the policy process does both
before it asks. Root only does what needs root, with its own limits:

``config {path}``
    Open (``O_NOFOLLOW``, passed by SCM_RIGHTS) ``mcpd.yaml``, the users file or the grants file:
    those three paths only. The policy checks the descriptor (owner, mode), parses it, and looks
    at it (``fstat``) to see whether the file changed.
``open {path, follow, want}``
    The privileged opener (:mod:`mcpd.helper.opener`): devices, FIFOs and sockets are never
    opened; the daemon's own secrets (:meth:`RootSettings.private`) are refused whatever it is told.
``spawn {user, limits}`` / ``walk {}`` / ``kill {pid}``
    A worker as that OS account (never uid or gid 0), a walker (``mcpd-walk``), both from the fork
    server; kill only a child made here, through its pidfd.
``pam {user, password}`` / ``account {user}``
    PAM authentication and account check (never for uid 0); whether ``/etc/shadow`` still lets an
    account use its login tokens (not locked, not expired).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import pwd
import select
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

from mcpd.common import frames
from mcpd.common.errors import HELPER_UNAVAILABLE, PERMISSION_DENIED, ToolError
from mcpd.common.pamauth import pam_check
from mcpd.common.rootconf import POLICY_USER, WALK_USER, RootSettings
from mcpd.common.shadow import usable
from mcpd.helper import opener
from mcpd.helper.forkserver import ForkServer

log = logging.getLogger("mcpd.helper")


class Broken(Exception):
    """The policy process broke the protocol: the helper stops (and the daemon with it)."""


def _account_ids(user: str, daemon: frozenset[str]) -> pwd.struct_passwd:
    """The account, unless it is root, in group 0, or one of the ``daemon``'s own accounts."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise ToolError(PERMISSION_DENIED, "no such OS account", reason="unknown OS account") from None
    if 0 in (pw.pw_uid, *os.getgrouplist(pw.pw_name, pw.pw_gid)):
        raise ToolError(PERMISSION_DENIED, "never for root", reason="root account")
    if pw.pw_name in daemon:
        raise ToolError(PERMISSION_DENIED, "never as the daemon's own accounts", reason="daemon account")
    return pw


def _pair() -> tuple[int, int]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return a.detach(), b.detach()


class Monitor:
    """Serves the policy process's requests on ``sock`` (see the module docstring).

    Args:
        sock: root's end of the socketpair whose other end the policy process holds.
        forks: the fork server.
        settings: root's settings; ``config_path``: the ``mcpd.yaml`` root read.
    """

    def __init__(self, sock: socket.socket, forks: ForkServer, settings: RootSettings, config_path: str) -> None:
        self.sock, self.forks, self.settings = sock, forks, settings
        self.files = frozenset({config_path, settings.users_file, settings.grants_file})
        self.private = tuple({q for p in settings.private(config_path) if p for q in (p, os.path.realpath(p))})
        self.daemon = frozenset({settings.service_user, POLICY_USER, WALK_USER})
        self.pam_users: set[str] = set()  # one PAM conversation per account at a time
        self.children: dict[int, int] = {}  # pid -> pidfd of every worker and walker made here
        self._lock, self._send = threading.Lock(), threading.Lock()
        self.pools = {slow: (concurrent.futures.ThreadPoolExecutor(n), threading.Semaphore(4 * n))
                      for slow, n in ((False, 8), (True, 12))}  # in flight or queued: 4 per thread

    # ------------------------------------------------------------ handlers

    def config(self, req: dict[str, Any]) -> dict[str, Any]:
        if req["path"] not in self.files:
            raise ToolError(PERMISSION_DENIED, "not a configuration file", reason="not a configuration file")
        return {"_fds": [os.open(req["path"], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)]}

    def open(self, req: dict[str, Any]) -> dict[str, Any]:
        if req["want"] not in ("file", "any"):
            raise Broken("open: bad want")
        fd, _ = opener.open_checked(req["path"], req["follow"], req["want"])
        if opener.fd_path(fd).startswith(self.private):
            os.close(fd)
            raise ToolError(PERMISSION_DENIED, f"permission denied: {req['path']}", reason="daemon secret")
        return {"_fds": [fd]}

    def _fork(self, req: dict[str, Any], mine: list[int], theirs: list[int]) -> dict[str, Any]:
        """A child from the fork server holding ``theirs``; the reply carries ``mine`` and a pidfd."""
        try:
            pid, pidfd = self.forks.request(req, theirs)
        except BaseException:
            for fd in mine:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        with self._lock:
            self.children[pid] = pidfd
        return {"pid": pid, "_fds": [*mine, os.dup(pidfd)]}

    def spawn(self, req: dict[str, Any]) -> dict[str, Any]:
        pw = _account_ids(req["user"], self.daemon)
        (front, back), (ctl, wctl) = _pair(), _pair()
        return self._fork({"type": "spawn", "uid": pw.pw_uid, "gid": pw.pw_gid, "user": pw.pw_name, "home": pw.pw_dir,
                           "groups": os.getgrouplist(pw.pw_name, pw.pw_gid), "limits": req["limits"]},
                          [front, ctl], [back, wctl])

    def walk(self, req: dict[str, Any]) -> dict[str, Any]:
        ours, theirs = _pair()
        return self._fork({"type": "walk"}, [ours], [theirs])

    def kill(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            pidfd = self.children.pop(req["pid"], None)
        if pidfd is None:
            raise ToolError(PERMISSION_DENIED, "not a child of the helper", reason="unknown pid")
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            select.select([pidfd], [], [], 5.0)  # readable once the process has exited
        except ProcessLookupError:
            pass
        os.close(pidfd)
        return {}

    def pam(self, req: dict[str, Any]) -> dict[str, Any]:
        user = _account_ids(req["user"], self.daemon).pw_name
        with self._lock:
            if user in self.pam_users:
                raise ToolError(HELPER_UNAVAILABLE, "a login for this account is in flight", reason="busy")
            self.pam_users.add(user)
        try:
            ok, code, reason = pam_check(self.settings.pam_service, user, req["password"])
        finally:
            with self._lock:
                self.pam_users.discard(user)
        return {"pass": ok, "code": code, "reason": reason}

    def account(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"usable": usable(req["user"])}

    # ------------------------------------------------------------ channel

    def table(self) -> dict[str, tuple[bool, dict[str, type], Callable[[dict[str, Any]], dict[str, Any]]]]:
        """type -> (slow: run in the slow pool, else the fast one; schema {key: exact type}; handler)."""
        return {
            "config": (False, {"path": str}, self.config),
            "open": (False, {"path": str, "follow": bool, "want": str}, self.open),
            "account": (False, {"user": str}, self.account),
            "spawn": (True, {"user": str, "limits": str}, self.spawn), "walk": (True, {}, self.walk),
            "kill": (True, {"pid": int}, self.kill), "pam": (True, {"user": str, "password": str}, self.pam),
        }

    def reply(self, rid: int, body: dict[str, Any]) -> None:
        """Send one reply frame (and its descriptors, then closed here)."""
        fds = body.pop("_fds", [])
        try:
            with self._send:
                frames.send_frame(self.sock, dict(body, id=rid), fds)
        except OSError:
            pass
        finally:
            for fd in fds:
                os.close(fd)

    def run(self, handler: Callable[[dict[str, Any]], dict[str, Any]], req: dict[str, Any], slow: bool) -> None:
        """Run one handler and reply: ``ok`` and its fields, or the refusal (any failure but
        :class:`Broken` is a refusal; the reason goes to the policy, the traceback to the log)."""
        try:
            body = dict(handler(req), ok=True)
        except ToolError as exc:
            body = {"ok": False, "error": exc.to_dict()}
        except Broken:
            self.sock.shutdown(socket.SHUT_RDWR)
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the policy, never kills the helper
            log.warning("%s failed: %s", req["type"], exc)
            body = {"ok": False, "error": ToolError(PERMISSION_DENIED, "refused by the helper", reason=str(exc)[:200]).to_dict()}
        finally:
            self.pools[slow][1].release()
        self.reply(req["id"], body)

    def handle(self, req: dict[str, Any]) -> None:
        """Check one request against the table, then run it in its pool (``HELPER_UNAVAILABLE``,
        reason ``busy``, when that is full): nothing runs on the reading thread, so a file system
        that hangs an ``open`` stops no other request. Raises :class:`Broken` on a schema break."""
        entry = self.table().get(req.get("type"))  # type: ignore[arg-type]
        if entry is None:
            raise Broken("unknown request type")
        slow, schema, handler = entry
        if set(req) != {"type", "id", *schema} or type(req["id"]) is not int or any(
                type(req[k]) is not t or t is str and len(req[k]) > 4096 for k, t in schema.items()):
            raise Broken(f"{req['type']}: malformed request")
        pool, slots = self.pools[slow]
        if not slots.acquire(blocking=False):
            return self.reply(req["id"], {"ok": False, "error": ToolError(HELPER_UNAVAILABLE, "busy", reason="busy").to_dict()})
        pool.submit(self.run, handler, req, slow)
        return None

    def reap(self) -> None:
        """Forget children that have exited (their pidfd is readable)."""
        with self._lock:
            done = select.select(list(self.children.values()), [], [], 0)[0] if self.children else []
            for pid, pidfd in [(p, f) for p, f in self.children.items() if f in done]:
                del self.children[pid]
                os.close(pidfd)

    def close(self) -> None:
        """SIGKILL every child still alive."""
        with self._lock:
            kids, self.children = list(self.children.values()), {}
        for pidfd in kids:
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(pidfd)
        for pool, _ in self.pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
