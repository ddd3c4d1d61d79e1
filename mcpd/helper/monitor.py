"""The root helper's request table: what root does for the policy process, and nothing else.

Like OpenSSH's monitor (``monitor.c``): root serves one peer, the policy process it started
(:mod:`mcpd.policy`, account ``mcpd-policy``), over :data:`CHANNELS` socketpairs nobody else
holds, one root thread each: a request is handled on the thread that read it and answered on its
channel (no hand-over between threads on the privileged route), and one that hangs (an ``open`` on
a dead network file system, a slow PAM module) holds only its own channel. :data:`TABLE` holds each
request type (one entry a line: its keys, handler and what it may do); a request that breaks its
schema (:func:`mcpd.helper.wire.requests.check`) ends the channel, and with it the daemon. Root
decides no grant and verifies no token: the policy process does both before it asks.

An ``open`` is refused, whatever it is told, when its object (:func:`opener.place`: its file
system and its path there, however a symlink or bind mount reached it) lies in a process's
``/proc`` folder (:func:`opener.of_a_process`), or at or below one of the daemon's own secrets
(:meth:`RootSettings.private`, each as a path prefix: taken lexically on the real path, and as
the place of the secret, or of its folder plus its name).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pwd
import select
import signal
import socket
import struct
import threading
from typing import Any

from mcpd.helper.forkserver import ForkServer
from mcpd.helper.pam import pam_check
from mcpd.helper.shadow import usable
from mcpd.helper.wire import frames, opener, requests
from mcpd.helper.wire.errors import HELPER_UNAVAILABLE, PERMISSION_DENIED, ToolError
from mcpd.helper.wire.pathmatch import clean_path
from mcpd.helper.wire.requests import Key, Request, SchemaError
from mcpd.helper.wire.rootconf import RootSettings, covered, plain_ids

log = logging.getLogger("mcpd.helper")
CHANNELS = 24  # socketpairs to the policy process: its threads that ask root (calls, logins, spawns, checks)
PAM_AT_ONCE = 12  # PAM conversations at once, whichever accounts: the width of a password oracle
CHILDREN = 512  # workers and walkers alive at once (the helper unit's TasksMax and LimitNOFILE assume it)
ACCOUNT_FACTOR = 16  # one account's workers alive at once: this many times workers.per_account (the
# policy allows 4 x per_account per principal, so 4 principals sharing an account fit whole)


def _pair() -> tuple[int, int]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return a.detach(), b.detach()


ACL_USER, ACL_GROUP = 0x02, 0x08  # the named entries of a POSIX ACL (linux/posix_acl_xattr.h)


def acl_entries(path: str) -> list[tuple[int, int, int]]:
    """(tag, permissions, uid or gid) of each named user or group entry with any permission in the
    POSIX access ACL of ``path`` (symlinks followed; none without an ACL or when it cannot be read)."""
    try:
        raw = os.getxattr(path, "system.posix_acl_access")
    except OSError:
        return []
    found = (struct.unpack_from("<HHI", raw, at) for at in range(4, len(raw) - 7, 8))
    return [(tag, perm, who) for tag, perm, who in found if tag in (ACL_USER, ACL_GROUP) and perm]


class Monitor:
    """Serves the policy process's requests on its channels (see the module docstring), one
    thread each (:meth:`serve`).

    Args:
        forks: the fork server.
        settings: root's settings; ``config_path``: the ``mcpd.yaml`` root read.
        accounts: the daemon's own accounts: the service user's, ``mcpd-policy`` and ``mcpd-walk``
            (as root looked them up at its start).
    """

    def __init__(self, forks: ForkServer, settings: RootSettings, config_path: str,
                 accounts: tuple[pwd.struct_passwd, ...]) -> None:
        self.forks, self.settings = forks, settings
        self.files = frozenset({config_path, settings.users_file, settings.grants_file})
        self.private = tuple({q for p in settings.private(config_path) for q in (p, os.path.realpath(p) + p[len(p.rstrip("/")):])})
        self.daemon = frozenset(a.pw_name for a in accounts)
        self.daemon_ids = ({a.pw_uid for a in accounts}, {a.pw_gid for a in accounts})  # uids, gids
        self.pam_users: set[str] = set()  # one PAM conversation per account at a time
        self.children: dict[int, tuple[int, int]] = {}  # pid -> (pidfd, uid; -1: a walker) of every child made here
        self._lock, self._forking, self.broken = threading.Lock(), threading.Lock(), threading.Event()
        # the mount table (none yet: read at the first open), read again when _mountinfo raises POLLPRI
        self._mounting, self._mountinfo, self._table = threading.Lock(), os.open("/proc/self/mountinfo", os.O_RDONLY), opener.Mounts()

    # ------------------------------------------------------------ handlers

    def config(self, req: dict[str, Any]) -> dict[str, Any]:
        if req["path"] not in self.files:
            raise ToolError(PERMISSION_DENIED, "not a configuration file", reason="not a configuration file")
        return {"_fds": [os.open(req["path"], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)]}

    def open(self, req: dict[str, Any]) -> dict[str, Any]:
        fd, _ = opener.open_checked(req["path"], req["follow"], req["want"], self.judge)
        real = opener.fd_path(fd) if req["follow"] else clean_path(req["path"])  # else the opener checked it is
        return {"_fds": [fd], "real": real}

    def judge(self, fd: int) -> str | None:
        """Why root refuses the object of the ``O_PATH`` descriptor ``fd`` (a process's, a secret),
        or None; raises (and so refuses) when its place cannot be told."""
        where = opener.place(fd, table := self.mounts())
        if opener.of_a_process(where):
            return opener.PROCESS
        secret = covered(opener.fd_path(fd), self.private) or self.secret(where, table, self.places(table))
        return "daemon secret" if secret else None

    def mounts(self) -> opener.Mounts:
        """The mount table (:func:`opener.mounts`), read again only once it has changed: the kernel
        raises ``POLLPRI`` once on the ``/proc/self/mountinfo`` root holds open after each change
        (a poll takes the event; the table read after it holds that change and any later one
        raises it again). Mount ids are reused, so a stale table would misname a place. Raises
        ``OSError`` (and the next call reads again)."""
        with self._mounting:
            if not self._table or select.select([], [], [self._mountinfo], 0)[2]:  # (no mount table is empty)
                self._table = {}
                self._table = opener.mounts()
            return self._table

    def places(self, table: opener.Mounts) -> set[tuple[str, str]]:
        """(file system, path prefix) of each of :attr:`private` as it resolves now (symlinks
        followed at this call): the object itself, and its folder's place plus its name (so a
        secret not created yet is covered too); for a TLS key that is a symlink, the whole folder
        of the file it leads to (a certbot archive holds the earlier and the next keys there)."""
        at = functools.cache(lambda path: opener.place_of(path, table))
        found = {(w[0], w[1].rstrip("/") + tail + p[len(p.rstrip("/")):]) for p in self.private  # (a folder keeps its "/")
                 for w, tail in ((at(p), ""), (at(os.path.dirname(p.rstrip("/"))), "/" + os.path.basename(p.rstrip("/"))))
                 if w is not None}
        key = at(self.settings.tls_key) if os.path.islink(self.settings.tls_key) else None
        return found | ({(key[0], os.path.dirname(key[1]) + "/")} if key else set())

    def secret(self, where: opener.Place, table: opener.Mounts, places: set[tuple[str, str]]) -> bool:
        """Whether the place ``where`` starts with one of ``places`` (:meth:`places`), or lies on an
        overlay one of whose layers starts with one, holds one, or cannot be found."""
        if any(where[0] == fs and covered(where[1], (prefix,)) for fs, prefix in places):
            return True
        layers = [opener.place_of(p, table) if p.startswith("/") else None for p in opener.layers(where, table)]
        return any(w is None or self.secret(w, table, places) or any(
            w[0] == fs and (prefix + "/").startswith(w[1].rstrip("/") + "/") for fs, prefix in places) for w in layers)

    def account(self, user: str) -> pwd.struct_passwd:
        """The account ``user``, unless it is unknown, has an id that is not plain (:func:`plain_ids`:
        root's, or -1) among its uid, gid and groups, or can reach what the daemon's own accounts
        can: one of their uids, or a group of theirs or one that a secret lets read now (by its group,
        or by a user or group its POSIX ACL names)."""
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise ToolError(PERMISSION_DENIED, "no such OS account", reason="unknown OS account") from None
        ids = (pw.pw_uid, *os.getgrouplist(pw.pw_name, pw.pw_gid))
        if not plain_ids(*ids):
            raise ToolError(PERMISSION_DENIED, "never for root or an id that is not plain",
                            reason="root account" if 0 in ids else "not a plain id")
        uids, gids = set(self.daemon_ids[0]), set(self.daemon_ids[1])
        for path in self.private:  # and the group a secret (or its folder) lets read or enter now
            with contextlib.suppress(OSError):
                gids |= {st.st_gid} if (st := os.stat(path)).st_mode & 0o070 else set()
            for tag, _, who in acl_entries(path):  # and the users and groups its ACL names (mask or not)
                (uids if tag == ACL_USER else gids).add(who)
        if pw.pw_name in self.daemon or pw.pw_uid in uids or gids & set(ids[1:]):
            raise ToolError(PERMISSION_DENIED, "never as the daemon's own accounts", reason="daemon account")
        return pw

    def _fork(self, req: dict[str, Any], mine: list[int], theirs: list[int], uid: int = -1) -> dict[str, Any]:
        """A child from the fork server holding ``theirs``; the reply carries ``mine`` and a pidfd.
        Refused ``busy`` when root holds :data:`CHILDREN` children, or a worker's account (``uid``)
        already has ``ACCOUNT_FACTOR x per_account`` workers."""
        try:
            with self._forking:  # the fork server makes one at a time anyway: so the bounds are exact
                uids = self.reap()  # (children that have ended count no more)
                if len(uids) >= CHILDREN or uid >= 0 and uids.count(uid) >= ACCOUNT_FACTOR * self.settings.per_account:
                    raise ToolError(HELPER_UNAVAILABLE, "the helper holds as many workers as it may", reason="busy")
                pid, pidfd = self.forks.request(req, theirs)
                with self._lock:
                    self.children[pid] = (pidfd, uid)
        except BaseException:
            for fd in mine:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        return {"pid": pid, "_fds": [*mine, os.dup(pidfd)]}

    def spawn(self, req: dict[str, Any]) -> dict[str, Any]:
        pw = self.account(req["user"])
        (front, back), (ctl, wctl) = _pair(), _pair()
        return self._fork({"type": "spawn", "uid": pw.pw_uid, "gid": pw.pw_gid, "user": pw.pw_name, "home": pw.pw_dir,
                           "groups": os.getgrouplist(pw.pw_name, pw.pw_gid), "limits": req["limits"]},
                          [front, ctl], [back, wctl], pw.pw_uid)

    def walk(self, req: dict[str, Any]) -> dict[str, Any]:
        ours, theirs = _pair()
        return self._fork({"type": "walk"}, [ours], [theirs])

    def kill(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            pidfd = self.children.pop(req["pid"], (None, 0))[0]
        if pidfd is None:
            raise ToolError(PERMISSION_DENIED, "not a child of the helper", reason="unknown pid")
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            frames.ready([pidfd], 5.0)  # readable once the process has exited
        os.close(pidfd)
        return {}

    def pam(self, req: dict[str, Any]) -> dict[str, Any]:
        user = self.account(req["user"]).pw_name
        with self._lock:
            if user in self.pam_users or len(self.pam_users) >= PAM_AT_ONCE:
                raise ToolError(HELPER_UNAVAILABLE, "a login for this account, or too many, in flight", reason="busy")
            self.pam_users.add(user)
        try:
            ok, code, reason = pam_check(self.settings.pam_service, user, req["password"])
        finally:
            with self._lock:
                self.pam_users.discard(user)
        return {"pass": ok, "code": code, "reason": reason}

    def usable(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"usable": usable(req["user"])}

    # ------------------------------------------------------------ channels

    def handle(self, sock: socket.socket, req: dict[str, Any]) -> None:
        """Check one request against :data:`TABLE`, run it and reply on ``sock``: ``ok`` and its
        fields, or the refusal (the reason goes to the policy, a traceback to the log only).

        Raises:
            SchemaError: a schema break (unknown type or key, missing key, wrong type, overlong
                string, a value not among its key's choices: an ``open`` that wants neither a file
                nor anything).
        """
        entry = requests.check(TABLE, req)
        try:
            body = dict(entry.handler(self, req), ok=True)
        except ToolError as exc:
            body = {"ok": False, "error": exc.to_dict()}
        except Exception as exc:  # noqa: BLE001 - reported to the policy, never kills the helper
            log.warning("%s failed: %s", req["type"], type(exc).__name__)  # (its text may hold a path: audit only)
            body = {"ok": False, "error": ToolError(PERMISSION_DENIED, "refused by the helper", reason=str(exc)[:200]).to_dict()}
        fds = body.pop("_fds", [])
        try:
            frames.send_frame(sock, dict(body, id=req["id"]), fds)
        finally:
            for fd in fds:
                os.close(fd)

    def serve(self, sock: socket.socket) -> None:
        """Serve one channel until the policy closes it; a broken request or frame shuts it and
        sets :attr:`broken` (the helper then stops), as does a reply the policy does not take
        within :data:`~mcpd.helper.wire.frames.SEND_SECONDS` (it reads each at once)."""
        frames.limit_sends(sock, frames.SEND_SECONDS)
        try:
            while (req := frames.recv_frame_fds(sock, frames.HELPER_REQUEST_CAP, 0)[0]) is not None:
                self.handle(sock, req)
        except (SchemaError, frames.FrameError, RecursionError, OSError) as exc:
            log.error("the policy process broke the protocol: %s", exc)
            self.broken.set()
            sock.shutdown(socket.SHUT_RDWR)

    def reap(self) -> list[int]:
        """Forget children that have exited (their pidfd is readable); the uids of those alive
        (-1: a walker)."""
        with self._lock:
            done = frames.ready([f for f, _ in self.children.values()], 0)
            for pid, pidfd in [(p, f) for p, (f, _) in self.children.items() if f in done]:
                del self.children[pid]
                os.close(pidfd)
            return [u for _, u in self.children.values()]

    def close(self) -> None:
        """SIGKILL every child still alive."""
        with self._lock:
            kids, self.children = [f for f, _ in self.children.values()], {}
        for pidfd in kids:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.close(pidfd)


STR, BOOL, INT = Key(str), Key(bool), Key(int)  # strings of at most 4096 characters
WANT = Key(str, choices=("file", "any"))  # what an open may want: root never opens a folder to read
#: request type -> its keys (each required), handler and what it may do; nothing else is served
TABLE = requests.table(
    Request("config", {"path": STR}, Monitor.config, "open mcpd.yaml, the users or the grants file (O_NOFOLLOW): no other"),
    Request("open", {"path": STR, "follow": BOOL, "want": WANT}, Monitor.open, "open once with the opener's rules (want: file, any)"),
    Request("spawn", {"user": STR, "limits": STR}, Monitor.spawn, "a worker as this account (plain ids, not the daemon's)"),
    Request("walk", {}, Monitor.walk, "a walker (mcpd-walk, CAP_DAC_READ_SEARCH) from the fork server"),
    Request("kill", {"pid": INT}, Monitor.kill, "SIGKILL a child made here, through its pidfd"),
    Request("pam", {"user": STR, "password": STR}, Monitor.pam, "PAM authentication of an account a worker may run as"),
    Request("account", {"user": STR}, Monitor.usable, "whether /etc/shadow still lets the account use its tokens"),
)
