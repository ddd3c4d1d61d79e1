"""``mcpd helper``: the root helper, the only privileged code (SPEC §4, §5.1; docs/PRIVSEP.md).

It listens on a Unix stream socket (passed by systemd socket activation, or created here in the
development mode), accepts only the service user's uid (``SO_PEERCRED``), and speaks
:mod:`mcpd.common.frames` with a 64 KiB cap on what it receives. Each connection may send any number of
requests from the fixed table :data:`REQUESTS`; an unknown, malformed or oversized request ends
the connection and leaves an audit ``alert`` record (OpenSSH's monitor does the same).

The helper trusts nothing the front says: it verifies the caller's bearer token against
``users.yaml`` itself, loads ``mcp-sudo.yaml`` itself, re-validates the tool arguments, decides the
grant (:func:`mcpd.helper.grants.decide`), and runs a granted call in a forked child with a
deadline through the opener of SPEC §4.4 and the same reading core as the workers. Every
privileged decision and every reload is one audit record.

Threads: the main thread accepts and handles signals (handlers only set flags); each connection
is served by its own thread, at most :data:`MAX_CONNECTIONS` at once.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import pwd
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from mcpd.common import frames
from mcpd.common import identity
from mcpd.core import ops
from mcpd.common import sdnotify
from mcpd.common.config import Config, ReadLimits
from mcpd.common.errors import INTERNAL_ERROR, PERMISSION_DENIED, TIMEOUT, ToolError
from mcpd.common.filesig import Signature, signature
from mcpd.helper import grants, opener
from mcpd.helper.audit import AuditLog
from mcpd.helper.grants_reload import PolicyHolder
from mcpd.helper.issued import Issued, IssuedStore, store_path
from mcpd.helper.lockout import Lockout, LockoutPolicy
from mcpd.helper.pam_login import PamLogin
from mcpd.common.strictyaml import ConfigFileError, parse_strict_yaml, read_secure_file
from mcpd.core.tools import TOOLS, deadline_seconds

log = logging.getLogger("mcpd.helper")

MAX_CONNECTIONS = 256
_PEERCRED = struct.Struct("3i")


class UsersHolder:
    """``users.yaml`` as the helper sees it: loaded like sudo (root-owned, mode without group/world
    write, strict YAML), re-read when it changes on disk, last good version kept (SPEC §4.5, §5.1).

    Args:
        path: the users file.
        audit: where reload outcomes are recorded.
    """

    def __init__(self, path: str, audit: AuditLog) -> None:
        self.path = path
        self._audit = audit
        self._key: Signature | None = None
        self._users: dict[str, identity.UserRecord] = {}
        self._lock = threading.Lock()
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> None:
        """Re-read the file when its (dev, ino, size, mtime) changed, or always with ``force``."""
        try:
            key = signature(self.path)
        except OSError:
            key = None
        with self._lock:
            if key == self._key and not force:
                return
            self._key = key
            try:
                text = read_secure_file(self.path)
                users = identity.parse_users(parse_strict_yaml(text, self.path), self.path)
            except (ConfigFileError, identity.UsersFileError) as exc:
                errors = exc.errors if isinstance(exc, ConfigFileError) else [str(exc)]
                self._audit.record("reload", file=self.path, decision="reject", reason="; ".join(errors)[:2000])
                log.error("users file not loaded, keeping the last good one: %s", "; ".join(errors))
                return
            self._users = users
        self._audit.record("reload", file=self.path, decision="accept", reason=f"{len(users)} principals")

    def verify(self, token: str) -> identity.Principal | None:
        """The principal of a plain ``token`` (constant-time compare), or ``None``."""
        self.refresh()
        with self._lock:
            users = self._users
        return identity.verify(users, token)

    def os_users(self) -> set[str]:
        """The OS accounts some principal maps to (the only accounts workers may run as)."""
        self.refresh()
        with self._lock:
            return {u.os_user for u in self._users.values()}


@dataclasses.dataclass
class HelperState:
    """Everything the request handlers share."""

    cfg: Config
    audit: AuditLog
    users: UsersHolder
    policy: PolicyHolder
    workers: dict[int, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    issued: IssuedStore | None = None
    login: PamLogin | None = None

    def authenticate(self, token: str) -> tuple[identity.Principal, Issued | None] | None:
        """The principal of a ``users.yaml`` token, or of a login token (named after its OS
        account, with its :class:`Issued` record); ``None`` when neither knows it (SPEC §5)."""
        principal = self.users.verify(token)
        if principal is not None:
            return principal, None
        rec = self.issued.verify(token) if self.issued is not None else None
        if rec is None:
            return None
        return identity.Principal(name=rec.os_user, os_user=rec.os_user, token_id=rec.id), rec


class Refused(Exception):
    """A request that must end the connection with an audit ``alert`` (reason in the message)."""


# ------------------------------------------------------------------ request handlers


def _str_field(req: dict[str, Any], name: str, limit: int = 4096) -> str:
    value = req.get(name)
    if not isinstance(value, str) or len(value) > limit:
        raise Refused(f"field {name!r} missing or malformed")
    return value


def handle_authenticate(state: HelperState, req: dict[str, Any], conn: socket.socket) -> dict[str, Any]:
    """``{"type": "authenticate", "token"}`` → ``{"ok": true, "principal": {name, os_user, token_id}}``
    or ``{"ok": false}`` (SPEC §5.1). The token never leaves this process again."""
    found = state.authenticate(_str_field(req, "token"))
    if found is None:
        return {"ok": False}
    return {"ok": True, "principal": dataclasses.asdict(found[0])}


def _account(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise ToolError(PERMISSION_DENIED, f"no OS account {name}", reason="unknown OS account") from None


def handle_spawn_worker(state: HelperState, req: dict[str, Any], conn: socket.socket) -> dict[str, Any]:
    """``{"type": "spawn_worker", "os_user"}`` → a worker running with exactly that account's uid,
    gid and supplementary groups and no capabilities; its socket end travels back by SCM_RIGHTS.

    Only accounts that some principal in ``users.yaml`` maps to are allowed, never uid 0.
    """
    os_user = _str_field(req, "os_user", 64)
    if os_user not in state.users.os_users():
        raise ToolError(PERMISSION_DENIED, "no principal maps to that account", reason="unknown OS account")
    pw = _account(os_user)
    if pw.pw_uid == 0:
        raise ToolError(PERMISSION_DENIED, "workers never run as root", reason="root account")
    groups = [g for g in os.getgrouplist(pw.pw_name, pw.pw_gid) if g != pw.pw_gid]
    front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    limits = json.dumps(dataclasses.asdict(state.cfg.read))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-m", "mcpd.worker", "--limits", limits, "--fd", str(back.fileno())],
            pass_fds=(back.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd="/",
            env={"PATH": os.defpath, "LANG": "C.UTF-8", "HOME": pw.pw_dir, "USER": pw.pw_name},
            user=pw.pw_uid, group=pw.pw_gid, extra_groups=groups, start_new_session=True,
        )
    except BaseException:
        front.close()
        raise
    finally:
        back.close()
    with state.lock:
        state.workers[proc.pid] = proc
    reply = frames.encode({"ok": True, "pid": proc.pid})
    try:
        socket.send_fds(conn, [reply], [front.fileno()])
    finally:
        front.close()
    return {}


def handle_kill_worker(state: HelperState, req: dict[str, Any], conn: socket.socket) -> dict[str, Any]:
    """``{"type": "kill_worker", "pid"}``: SIGKILL a worker this helper spawned and reap it; other
    pids are refused (the front cannot signal processes of other accounts itself)."""
    pid = req.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise Refused("field 'pid' missing or malformed")
    with state.lock:
        proc = state.workers.pop(pid, None)
    if proc is None:
        return {"ok": False}
    proc.kill()
    proc.wait()
    return {"ok": True}


def _request_path(args: dict[str, Any]) -> str:
    value = args.get("path", args.get("root"))
    return value if isinstance(value, str) else ""


def handle_privileged_call(state: HelperState, req: dict[str, Any], conn: socket.socket) -> dict[str, Any]:
    """``{"type": "privileged_call", "token", "session", "peer", "op", "args"}`` (SPEC §4.1-4.5).

    Verifies the token, re-validates ``args`` with the tool's own ``parse_args``, decides the grant
    for the principal's OS account and groups, and runs a granted op in a forked child. Exactly one
    audit record (``accept`` or ``reject``) per call. Returns ``{"ok": true, "result"}`` or
    ``{"ok": false, "error": ToolError.to_dict()}``.
    """
    token = _str_field(req, "token")
    who = {"session": req.get("session") if isinstance(req.get("session"), str) else None,
           "peer": req.get("peer") if isinstance(req.get("peer"), str) else None}
    op = _str_field(req, "op", 64)
    tool = TOOLS.get(op)
    found = state.authenticate(token)
    principal, login = found if found is not None else (None, None)
    if principal is None or tool is None:
        reason = "invalid token" if principal is None else "unknown tool"
        state.audit.record("reject", tool=op, decision="reject", reason=reason, **who)
        return _error(ToolError(PERMISSION_DENIED, "permission denied", reason=reason))
    who.update(user=principal.name, os_user=principal.os_user, tool=op)
    try:
        args = tool.parse_args(req.get("args"))
    except ToolError as exc:
        state.audit.record("reject", decision="reject", reason=exc.message, **who)
        return _error(exc)
    requested = _request_path(args)
    groups = grants.os_groups(principal.os_user)
    policy = state.policy.policy
    login_time = None if login is None else datetime.datetime.fromtimestamp(login.login_time, datetime.timezone.utc)
    decision = grants.decide(policy, principal.os_user, groups, op, requested, grants.utcnow(),
                             login_time=login_time, login_used=login is not None and login.reauth_used)
    record = dict(who, requested_path=requested, resolved_path=decision.resolved_path, grant=decision.rule)
    if decision.reason == grants.REAUTH:
        state.audit.record("reject", decision="reject", reason=decision.reason, **record)
        return _error(ToolError(PERMISSION_DENIED, f"permission denied: {requested}: reauthentication required"
                                f" by the grant; run: linuxctl login, then use the new token",
                                path=requested, reason=grants.REAUTH))
    if not decision.allowed or decision.resolved_path is None:
        state.audit.record("reject", decision="reject", reason=decision.reason, **record)
        return _error(ToolError(PERMISSION_DENIED, f"permission denied: {requested}: {decision.reason}",
                                path=requested, reason=decision.reason))
    key = "path" if "path" in args else "root"
    args[key] = decision.resolved_path

    def allow(path: str) -> bool:  # the call is decided: its login counts as fresh for this call's filter
        return grants.decide(policy, principal.os_user, groups, op, path, grants.utcnow(),
                             login_time=login_time, login_used=False).allowed

    if decision.reauth_after == 0 and login is not None and state.issued is not None:
        state.issued.mark_reauth_used(login.id)  # reauth_after: 0 — one login, one call
    cap = req.get("cap")
    limits = state.cfg.read
    if isinstance(cap, int) and not isinstance(cap, bool) and 0 < cap < limits.response_cap:
        limits = dataclasses.replace(limits, response_cap=cap)  # the principal's max_file_bytes
    reply = run_in_child(state, op, args, decision.covers_root, allow, limits)
    if reply.get("ok"):
        result = reply.get("result") or {}
        text = result.get("text") if isinstance(result, dict) else None  # files/filetype's "text" is a bool
        size = len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else 0
        state.audit.record("accept", decision="accept", reason="granted", bytes=size, **record)
        return {"ok": True, "result": result}
    error = ToolError.from_dict(reply.get("error"))
    state.audit.record("accept", decision="accept", reason="granted", outcome=error.code, bytes=0,
                       **dict(record, reason_detail=error.details.get("reason")))
    return _error(error)


def _error(exc: ToolError) -> dict[str, Any]:
    return {"ok": False, "error": exc.to_dict()}


def run_in_child(
    state: HelperState, op: str, args: dict[str, Any], follow: bool, allow: Callable[[str], bool],
    limits: ReadLimits | None = None,
) -> dict[str, Any]:
    """Run one granted op in a forked child with the workers' deadline (seconds; for an op with
    ``time_budget_seconds``, that budget plus a margin); return its reply frame. A child past the
    deadline is killed and the call answers ``TIMEOUT``. No progress is reported on this route."""
    limit = deadline_seconds(args, state.cfg.workers.timeout_seconds)
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # child: no logging, no threads, exit without cleanup handlers
        status = 0
        try:
            parent.close()
            ctx = ops.OpContext(
                limits=limits or state.cfg.read,
                open_file=lambda p: opener.open_checked(p, follow_symlinks=follow),
                open_dir=lambda p: opener.open_checked_dir(p, follow_symlinks=follow),
                allow=allow,
            )
            frames.send_frame(child, ops.run({"id": 0, "op": op, "args": args}, ctx))
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    child.close()
    try:
        parent.settimeout(limit)
        reply = frames.recv_frame(parent, frames.reply_cap(state.cfg.read.response_cap))
        if reply is None:
            raise frames.FrameError("child ended without a reply")
        return reply
    except (socket.timeout, TimeoutError):
        return _error(ToolError(TIMEOUT, "the call did not finish in time", seconds=limit))
    except (frames.FrameError, OSError):
        return _error(ToolError(INTERNAL_ERROR, "internal error"))
    finally:
        parent.close()
        try:  # a finished child is only a zombie now; a hung one must not outlive its deadline
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)


def handle_pam_login(state: HelperState, req: dict[str, Any], conn: socket.socket) -> dict[str, Any]:
    """``{"type": "pam_login", "user", "password", "peer"}`` (SPEC §5.2): PAM auth + account check
    off the main loop, lockout, then a login token. ``{"ok": true, "token", "expires", "os_user"}``
    once, or ``{"ok": false}`` whatever went wrong (the reason is in the audit record only)."""
    user = _str_field(req, "user", 64)
    password = _str_field(req, "password", 4096)
    peer = _str_field(req, "peer", 100)
    if state.login is None:
        return {"ok": False}
    outcome = state.login.login(user, password, peer)
    if outcome.token is None:
        return {"ok": False}
    return {"ok": True, "token": outcome.token, "expires": outcome.expires, "os_user": outcome.os_user}


def handle_revoke(state: HelperState, req: dict[str, Any], conn: socket.socket) -> dict[str, Any]:
    """``{"type": "revoke", "token"}``: delete the login token itself (``linuxctl logout``).
    ``{"ok": true}`` when it was a live login token, else ``{"ok": false}``."""
    rec = state.issued.verify(_str_field(req, "token")) if state.issued is not None else None
    if rec is None or state.issued is None:
        return {"ok": False}
    state.issued.revoke(rec.id)
    state.audit.record("logout", tool="login", os_user=rec.os_user, token_id=rec.id, decision="accept",
                       reason="revoked by its holder")
    return {"ok": True}


Handler = Callable[[HelperState, dict[str, Any], socket.socket], dict[str, Any]]

#: The fixed request table (DESIGN.md: OpenSSH's monitor dispatch). Anything else is an alert.
REQUESTS: dict[str, Handler] = {
    "authenticate": handle_authenticate,
    "spawn_worker": handle_spawn_worker,
    "kill_worker": handle_kill_worker,
    "privileged_call": handle_privileged_call,
    "pam_login": handle_pam_login,
    "revoke": handle_revoke,
}


# ------------------------------------------------------------------ connections


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the peer from ``SO_PEERCRED`` (Linux)."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, gid = _PEERCRED.unpack(raw)
    return pid, uid, gid


def serve_connection(state: HelperState, conn: socket.socket, allowed_uid: int) -> None:
    """Serve one front connection until it closes or misbehaves (then an ``alert`` record)."""
    with conn:
        pid, uid, _ = peer_credentials(conn)
        peer = f"pid={pid} uid={uid}"
        if uid != allowed_uid:
            state.audit.record("alert", peer=peer, reason="connection from a uid other than the service user")
            return
        while True:
            try:
                req = frames.recv_frame(conn, frames.HELPER_REQUEST_CAP)
            except frames.FrameError as exc:
                state.audit.record("alert", peer=peer, reason=f"malformed frame: {exc}")
                return
            except OSError:
                return
            if req is None:
                return
            kind = req.get("type")
            handler = REQUESTS.get(kind) if isinstance(kind, str) else None
            if handler is None:
                state.audit.record("alert", peer=peer, reason="unknown request type")
                return
            try:
                reply = handler(state, req, conn)
            except Refused as exc:
                state.audit.record("alert", peer=peer, reason=f"{kind}: {exc}")
                return
            except ToolError as exc:
                reply = _error(exc)
            except Exception:
                log.exception("request %s failed", kind)
                reply = _error(ToolError(INTERNAL_ERROR, "internal error"))
            if reply:
                try:
                    frames.send_frame(conn, reply)
                except OSError:
                    return


def listening_socket(cfg: Config, service_gid: int) -> socket.socket:
    """The socket from systemd (``LISTEN_FDS``, fd 3), or a new one at ``cfg.helper_socket`` with
    mode 0660, owner root and group ``service_gid``."""
    if os.environ.get("LISTEN_PID") == str(os.getpid()) and os.environ.get("LISTEN_FDS") == "1":
        return socket.socket(fileno=3)
    path = cfg.helper_socket
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chown(path, 0, service_gid)
    os.chmod(path, 0o660)
    sock.listen(128)
    return sock


def _reap_workers(state: HelperState) -> None:
    with state.lock:
        done = [pid for pid, p in state.workers.items() if p.poll() is not None]
        for pid in done:
            del state.workers[pid]


def run(cfg: Config) -> int:
    """Run the helper until SIGTERM/SIGINT; SIGHUP reloads ``users.yaml`` and ``mcp-sudo.yaml``
    (both are also re-read when they change on disk; a failed reload keeps the last good one).

    Returns the exit status: 0 after a clean stop, 78 when it is not root, the service user is
    unknown, or the first grants load fails (fail closed: no helper without a policy).
    """
    if os.geteuid() != 0:
        log.error("the root helper must run as root")
        return 78
    try:
        service = pwd.getpwnam(cfg.service_user)
    except KeyError:
        log.error("service user %s does not exist", cfg.service_user)
        return 78
    audit = AuditLog(cfg.audit_log)
    holder = PolicyHolder(cfg.grants_file, audit=audit)
    if holder.last_errors:
        log.error("grants file not loaded: %s", "; ".join(holder.last_errors))
        return 78
    state = HelperState(cfg=cfg, audit=audit, users=UsersHolder(cfg.users_file, audit), policy=holder)
    store = store_path(cfg.state_dir)
    os.makedirs(os.path.dirname(store), mode=0o700, exist_ok=True)
    os.chown(os.path.dirname(store), 0, 0)
    os.chmod(os.path.dirname(store), 0o700)
    state.issued = IssuedStore(store)
    lc = cfg.login
    lockout = Lockout(LockoutPolicy(lc.free_failures, lc.base_delay_seconds, lc.max_delay_seconds,
                                    lc.max_failures, lc.lockout_seconds))
    peers = Lockout(LockoutPolicy(lc.free_failures * 4, lc.base_delay_seconds, lc.max_delay_seconds,
                                  lc.max_failures * 4, lc.lockout_seconds))  # an address may hold several operators
    state.login = PamLogin(lc.pam_service, state.issued, lockout, audit, lc.token_ttl_seconds, state.users.os_users,
                           peers)
    flags = {"stop": False, "hup": False}
    signal.signal(signal.SIGTERM, lambda *_: flags.update(stop=True))
    signal.signal(signal.SIGINT, lambda *_: flags.update(stop=True))
    signal.signal(signal.SIGHUP, lambda *_: flags.update(hup=True))
    sock = listening_socket(cfg, service.pw_gid)
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
    sdnotify.notify()
    log.info("root helper listening; accepting uid %d (%s)", service.pw_uid, cfg.service_user)
    while not flags["stop"]:
        if flags["hup"]:
            flags["hup"] = False
            result = holder.reload()
            state.users.refresh(force=True)
            log.info("reload: %s", "; ".join(result.summary or result.errors))
        else:
            holder.reload_if_changed()
        _reap_workers(state)
        try:
            ready, _, _ = select.select([sock], [], [], 0.5)
        except InterruptedError:
            continue
        if not ready:
            continue
        try:
            conn, _ = sock.accept()
        except OSError:
            continue
        if not slots.acquire(blocking=False):
            audit.record("alert", reason="too many helper connections")
            conn.close()
            continue

        def worker(c: socket.socket = conn) -> None:
            try:
                serve_connection(state, c, service.pw_uid)
            finally:
                slots.release()

        threading.Thread(target=worker, daemon=True).start()
    sock.close()
    with state.lock:
        for proc in state.workers.values():
            proc.kill()
    audit.close()
    return 0
