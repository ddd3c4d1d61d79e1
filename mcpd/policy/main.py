"""The policy process: ``python -I -m mcpd.policy --config FILE``, started by the root helper.

It runs as ``mcpd-policy`` (no capability, no_new_privs) with descriptors from root: fd 3, the
helper socket the front connects to, and from fd 4 on its channels to root
(:mod:`mcpd.policy.rootclient`). It holds the tokens, the grants, the logins and the audit log, decides every
privileged request, and asks root for what only root can do (docs/PRIVSEP.md). Its state and
audit folders are its own (0700, made by systemd-tmpfiles or ``mcpd helper``), checked here with
every folder above them root's and closed to others. Exit 78 when the configuration is broken.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import pwd
import signal
import socket
import sys
import time

from mcpd.common import config, filesig, identity, sched, wirejson
from mcpd.common.audit.writer import AuditLog
from mcpd.common.filesig import Signature
from mcpd.common.folders import safe_folder
from mcpd.common.reload import Reloading
from mcpd.helper.wire import frames, securefile
from mcpd.helper.wire.errors import ToolError
from mcpd.policy.connections import serve
from mcpd.policy.grants import secret_paths
from mcpd.policy.grants_reload import PolicyHolder
from mcpd.policy.login import Login, Store
from mcpd.policy.oauth import OAuthVerifier
from mcpd.policy.rootclient import RootClient
from mcpd.policy.state import State
from mcpd.policy.workers import kill_worker

log = logging.getLogger("mcpd.policy")
ROOT_SIGNATURE_SECONDS = 1.0  # a change to a file only root may look at is seen within this (the front re-checks every second)


def enrolled(users: Reloading[dict[str, identity.UserRecord]]) -> set[str]:
    """The OS accounts bound to a principal in ``users.yaml`` as it is now (re-read on change)."""
    users.refresh()
    return {u.os_user for u in users.current.values()}


def principal_name(users: Reloading[dict[str, identity.UserRecord]], account: str) -> str | None:
    """The principal a login of OS ``account`` acts as now (:func:`mcpd.common.identity.login_principal`),
    or None when no principal is bound to it: the name its login records carry."""
    users.refresh()
    found = identity.login_principal(users.current, account, "")
    return None if found is None else found.name


def use_root_for_config(root: RootClient) -> None:
    """Read ``mcpd.yaml``, the users and the grants files through root when this process may not
    open or look at them itself (they are root's, 0600, in a folder only root and the front may
    enter): the hooks of :mod:`mcpd.helper.wire.securefile` and :mod:`mcpd.common.filesig`."""

    def open_file(path: str, flags: int) -> int:
        try:
            return os.open(path, flags)
        except PermissionError:
            try:
                return root.config_fd(path)
            except ToolError as exc:
                raise PermissionError(exc.message) from None

    seen: dict[str, tuple[float, Signature]] = {}  # path -> (reuse until, root's answer)

    def signature_of(path: str) -> Signature:
        hit = seen.get(path)  # only files this process may not look at are here
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]  # every token check asks: root is asked at most once a ROOT_SIGNATURE_SECONDS
        try:
            return filesig.stat_signature(path)
        except PermissionError:
            try:
                sig = root.signature(path)
            except ToolError as exc:
                raise PermissionError(exc.message) from None
            seen[path] = (time.monotonic() + ROOT_SIGNATURE_SECONDS, sig)
            return sig

    securefile.open_file, filesig.signature_of = open_file, signature_of


def main(argv: list[str] | None = None) -> int:
    """Serve the front on fd 3 until SIGTERM/SIGINT or until root goes away; SIGHUP reloads the
    grants and users files. Returns 0 after a clean stop, 78 when the configuration, the state
    folder or the first grants load is broken (fail closed)."""
    parser = argparse.ArgumentParser(prog="mcpd-policy", description="The mcpd policy process (started by mcpd-helper).")
    parser.add_argument("--config", required=True)
    parser.add_argument("--channels", type=int, required=True)
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="mcpd-policy: %(levelname)s %(message)s")
    if os.geteuid() == 0:
        log.error("the policy process never runs as root; start mcpd-helper")
        return config.EXIT_CONFIG
    sched.run_as_batch()  # before any thread starts (they inherit it): a call sent here does not preempt the front
    frames.use_codec(wirejson.dumps, wirejson.loads)  # orjson: every request and reply passes here
    root = RootClient([socket.socket(fileno=4 + i) for i in range(opts.channels)])
    listener = socket.socket(fileno=3)
    listener.listen(64)  # again, as this process: the front's SO_PEERCRED names mcpd-policy, not root
    use_root_for_config(root)
    try:
        cfg = config.load(opts.config, owner_uid=0)  # read through root, checked on the descriptor
        service = pwd.getpwnam(cfg.service_user)
        state_fd = safe_folder(cfg.helper_state_dir, owner=os.geteuid(), create=False)
        os.close(safe_folder(os.path.dirname(cfg.audit_log), owner=os.geteuid(), create=False))
        audit = AuditLog(cfg.audit_log, head_dir=state_fd, **cfg.audit.writer_args())  # head: its own state folder
    except (config.ConfigError, KeyError, OSError) as exc:
        log.error("cannot start: %s", exc)
        return config.EXIT_CONFIG
    holder = PolicyHolder(cfg.grants_file, audit=audit, secrets=secret_paths(cfg, opts.config), state_dir=state_fd)
    if holder.last_errors:
        log.error("grants file not loaded: %s", "; ".join(holder.last_errors))
        return config.EXIT_CONFIG
    users: Reloading[dict[str, identity.UserRecord]] = Reloading(
        cfg.users_file, functools.partial(identity.load_users, owner_uid=0), empty={}, fail_closed=True)
    issued = Store(state_fd, cfg.login.tokens_per_user)
    login = Login(cfg.login, issued, audit, lambda: enrolled(users), pam=root.pam,
                  principal_of=lambda account: principal_name(users, account))
    state = State(cfg=cfg, audit=audit, users=users, policy=holder, root=root, issued=issued, login=login)
    if cfg.oauth.enabled:
        state.oauth = OAuthVerifier(cfg.oauth, root.usable, {cfg.service_user, config.POLICY_USER, config.WALK_USER})
    flags = {"stop": False, "hup": False}
    signal.signal(signal.SIGTERM, lambda *_: flags.update(stop=True))
    signal.signal(signal.SIGINT, lambda *_: flags.update(stop=True))
    signal.signal(signal.SIGHUP, lambda *_: flags.update(hup=True))

    def tick() -> None:
        if flags["hup"]:
            flags["hup"] = False
            result = holder.reload()
            users.refresh(force=True)
            if state.oauth is not None:
                state.oauth.refresh()
            log.info("reload: %s", "; ".join(result.summary or result.errors))
        else:
            holder.reload_if_changed()
            if state.oauth is not None:
                state.oauth.refresh()

    log.info("policy process serving; accepting uid %d (%s)", service.pw_uid, cfg.service_user)
    serve(state, listener, service.pw_uid, lambda: flags["stop"], tick)
    listener.close()
    for w in list(state.workers.values()):
        kill_worker(state, w)
    audit.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
