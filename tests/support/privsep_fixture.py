"""The real privilege-separated daemon for root-only tests (docs/REFERENCE.md §4, §5.1; docs/PRIVSEP.md).

:func:`privsep_daemon` (module scope) creates the service user ``mcpd`` when missing, two test
accounts, a state folder under ``/tmp`` that the service user may enter, a grants tree under
``/srv/mcpd-test-<hex>``, and starts ``mcpd helper`` (root) and ``mcpd serve`` (as ``mcpd``, no
supplementary groups) on a free 127.0.0.1 port. Teardown stops both, kills any process left
running as the test accounts (by pid), removes the accounts, the tree and the folder; every
wait is bounded.

Principals: ``alice`` → account A (granted ``files/read`` and ``files/list`` on ``app``),
``bob`` → account B (no grant), ``rooty`` → ``root`` (workers must be refused for it).
Tree (all root-owned)::

    /srv/mcpd-test-<hex>/          0755
      app/          0700           the granted folder; app/log.txt 0600 (the root-only file)
      app-evil/x    0700 / 0600    a sibling that shares the prefix
      secret        0600           outside the grant

Every daemon on the machine runs its front, policy process and walkers as the same system
accounts (``mcpd``, ``mcpd-policy``, ``mcpd-walk``), and several test sessions run at once: a
test acts on the processes of its own daemon only, found as children of its helper
(:meth:`PrivsepDaemon.workers`, :meth:`PrivsepDaemon.walkers`, :class:`HungWalks`), never on
every process of one of those accounts.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import resource
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from mcpd.admin import certs, devroot
from mcpd.common import identity
from mcpd.common.config import POLICY_USER, WALK_USER
from tests.support.net import free_port
from tests.support.osaccounts import Account, AccountFactory, require_root

START_SECONDS = 30.0
STOP_SECONDS = 10.0
LOG_TEXT = "app log line 1\napp log line 2\n"
SECRET_TEXT = "root secret: do not leak\n"


def proc_status(pid: int) -> dict[str, str]:
    """``/proc/PID/status`` as a mapping of field → value (raises ``OSError`` when gone)."""
    out: dict[str, str] = {}
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def children(ppid: int, uid: int | None = None) -> list[int]:
    """Pids whose parent is ``ppid`` (and real uid is ``uid`` when given)."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = proc_status(int(entry))
        except OSError:
            continue
        if st.get("PPid") == str(ppid) and (uid is None or st["Uid"].split()[0] == str(uid)):
            found.append(int(entry))
    return found


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_SECONDS)


@dataclass
class PrivsepDaemon:
    """A running helper + front pair and everything a test needs to reach and inspect it."""

    url: str
    cacert: str
    state_dir: Path
    config_path: Path
    socket_path: Path
    audit_path: Path
    access_path: Path
    grants_path: Path
    tokens: dict[str, str]
    accounts: dict[str, Account]
    service: pwd.struct_passwd
    srv: Path
    helper: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    front: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    #: the helper's soft RLIMIT_NOFILE (the policy process, workers and walkers inherit it), e.g.
    #: 1024 as systemd's default; None: the test runner's own
    nofile: int | None = None
    #: a command the helper is started under (e.g. ``unshare --mount ...``: a mount namespace of its
    #: own, which the policy process, fork server, workers and walkers share); [] for none
    helper_wrap: list[str] = field(default_factory=list)

    @property
    def app(self) -> Path:
        return self.srv / "app"

    @property
    def log_file(self) -> Path:
        return self.srv / "app" / "log.txt"

    @property
    def secret(self) -> Path:
        return self.srv / "secret"

    @property
    def helper_pid(self) -> int:
        if self.helper is None:
            raise RuntimeError("the helper is not running")
        return self.helper.pid

    @property
    def front_pid(self) -> int:
        if self.front is None:
            raise RuntimeError("the front is not running")
        return self.front.pid

    # -- processes ------------------------------------------------------------------------------

    def policy_starts(self) -> set[tuple[Any, Any]]:
        """The starts of this daemon's policy processes in its audit log: ``(seq, time)`` of each
        grants ``load: start`` record (a set, so a log rotated meanwhile does not hide a new one)."""
        return {(r.get("seq"), r.get("time")) for r in self.audit()
                if r.get("event") == "reload" and r.get("load") == "start" and r.get("part", 1) == 1}

    def start_helper(self) -> None:
        """Start ``mcpd helper`` as root and wait (bounded) until its socket is in place and its
        policy process has started (loaded the grants): ``mcpd helper`` makes the socket before the
        helper runs, as systemd's socket unit does, so the socket alone says nothing of it."""
        self.socket_path.unlink(missing_ok=True)  # a killed helper's socket must not look ready
        starts = self.policy_starts()
        nofile = self.nofile

        def limits() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

        with open(self.state_dir / "helper.log", "ab") as log:
            self.helper = subprocess.Popen(
                [*self.helper_wrap, sys.executable, "-m", "mcpd.admin.cli", "helper", "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.state_dir, preexec_fn=limits,
            )
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                st = os.lstat(self.socket_path)
                if stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660 and self.policy_starts() - starts:
                    return
            except FileNotFoundError:
                pass
            if self.helper.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"helper did not start:\n{self.log('helper.log')}")
            time.sleep(0.05)

    def kill_helper(self, sig: int = signal.SIGKILL) -> None:
        """Signal the helper and reap it (bounded)."""
        if self.helper is not None and self.helper.poll() is None:
            self.helper.send_signal(sig)
            self.helper.wait(timeout=STOP_SECONDS)

    def restart_helper(self) -> None:
        """SIGKILL the helper if it runs, then start a fresh one."""
        self.kill_helper()
        self.start_helper()

    def start_front(self) -> None:
        """Start ``mcpd serve`` as the service user and wait (bounded) for its TLS port."""
        port = int(self.url.rsplit(":", 1)[1])
        with open(self.state_dir / "front.log", "ab") as log:
            self.front = subprocess.Popen(
                [sys.executable, "-m", "mcpd.front.server", "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.state_dir,
                user=self.service.pw_uid, group=self.service.pw_gid, extra_groups=[],
                env={"PATH": os.defpath, "LANG": "C.UTF-8", "HOME": "/"},
            )
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                pass
            if self.front.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"front did not start:\n{self.log('front.log')}")
            time.sleep(0.05)

    def workers(self, principal: str) -> list[int]:
        """Pids of the root side's workers running as ``principal``'s account (children of the
        helper's fork server)."""
        uid = self.accounts[principal].uid
        return [pid for fs in children(self.helper_pid, 0) for pid in children(fs, uid)]

    def walkers(self) -> list[int]:
        """Pids of this daemon's walkers: the children of its helper's fork server running as
        ``mcpd-walk`` (the account every daemon's walkers share)."""
        uid = pwd.getpwnam(WALK_USER).pw_uid
        return [pid for fs in children(self.helper_pid, 0) for pid in children(fs, uid)]

    # -- files ----------------------------------------------------------------------------------

    def write_grants(self, data: dict[str, Any] | str, hup: bool = True) -> None:
        """Replace ``mcp-sudo.yaml`` (root 0644, atomically) and SIGHUP the helper when ``hup``."""
        text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
        tmp = self.grants_path.with_name(f".grants.{secrets.token_hex(4)}")
        tmp.write_text(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.grants_path)
        if hup and self.helper is not None and self.helper.poll() is None:
            self.helper.send_signal(signal.SIGHUP)

    def default_grants(self) -> dict[str, Any]:
        rule = {"allowed": True, "paths": [str(self.app)]}
        return {"users": {self.accounts["alice"].name: {"privileged": {"tools": {
            "files/read": rule, "files/list": dict(rule)}}}}}

    def audit(self) -> list[dict[str, Any]]:
        """Every audit record written whole so far (a last line the writer is still writing,
        without its newline yet, is left for the next look)."""
        try:
            text = self.audit_path.read_text()
        except FileNotFoundError:
            return []
        whole = text[:text.rfind("\n") + 1]
        return [json.loads(line) for line in whole.splitlines() if line.strip()]

    def audit_text(self) -> str:
        return self.audit_path.read_text() if self.audit_path.exists() else ""

    def log(self, name: str) -> str:
        path = self.state_dir / name
        return path.read_text(errors="replace") if path.exists() else ""


class HungWalks:
    """While active, every walker of daemon ``d`` is stopped (SIGSTOP) as it appears: its
    privileged list/find hangs as on a hung NFS or FUSE folder (no CPU used). Leaving kills the
    walkers it stopped, through pidfds taken when it stopped them (never a reused pid). Walkers
    of other daemons, which run as the same account, are left alone."""

    def __init__(self, d: PrivsepDaemon) -> None:
        self.d = d
        self.stopped: dict[int, int] = {}  # pid -> pidfd
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        end = time.monotonic() + 120
        while not self._done.is_set() and time.monotonic() < end:
            for pid in self.d.walkers():
                if pid in self.stopped:
                    continue
                try:
                    fd = os.pidfd_open(pid)
                except OSError:  # gone already
                    continue
                try:
                    signal.pidfd_send_signal(fd, signal.SIGSTOP)
                except OSError:
                    os.close(fd)
                    continue
                self.stopped[pid] = fd
            self._done.wait(0.005)

    def __enter__(self) -> HungWalks:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join(5)
        for fd in self.stopped.values():
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
            os.close(fd)
        self.stopped.clear()


def _make_tree(srv: Path) -> None:
    srv.mkdir(mode=0o755)
    os.chmod(srv, 0o755)
    for sub in ("app", "app-evil"):
        (srv / sub).mkdir(mode=0o700)
    (srv / "app" / "log.txt").write_text(LOG_TEXT)
    (srv / "app-evil" / "x").write_text(SECRET_TEXT)
    (srv / "secret").write_text(SECRET_TEXT)
    for f in (srv / "app" / "log.txt", srv / "app-evil" / "x", srv / "secret"):
        os.chmod(f, 0o600)


def start_privsep(factory: AccountFactory, etc: bool = False, nofile: int | None = None,
                  helper_wrap: list[str] | None = None, **overrides: Any) -> PrivsepDaemon:
    """Create accounts, files and folder, and start helper and front (see the module docstring).
    ``etc``: ``mcpd.yaml``, the users and the grants files in a folder of their own, ``0750
    root:mcpd`` as the shipped ``tmpfiles.d`` makes ``/etc/mcpd``, which the policy process
    (not in group ``mcpd``) may not enter; else beside the rest in the state folder.
    ``nofile``: :attr:`PrivsepDaemon.nofile`; ``helper_wrap``: :attr:`PrivsepDaemon.helper_wrap`."""
    require_root()
    service = devroot.ensure_system_account("mcpd")
    devroot.ensure_system_account(WALK_USER)  # the helper refuses to start without them
    devroot.ensure_system_account(POLICY_USER)
    alice, bob = factory.user(), factory.user()
    state = Path(tempfile.mkdtemp(prefix="mcpd-privsep-", dir="/tmp"))
    os.chown(state, 0, service.pw_gid)
    os.chmod(state, 0o751)  # the policy process (not in group mcpd) enters to reach its helper/ and audit/
    (state / "access").mkdir(mode=0o700)  # the front's access log: the service user's own folder
    os.chown(state / "access", service.pw_uid, service.pw_gid)
    Path("/srv").mkdir(exist_ok=True)
    srv = Path(f"/srv/mcpd-test-{secrets.token_hex(4)}")
    _make_tree(srv)
    tls = state / "tls"
    pki = certs.make_pki(tls, ["localhost", "127.0.0.1"])
    os.chmod(tls, 0o750)
    os.chown(tls, 0, service.pw_gid)
    os.chown(pki.server_key, 0, service.pw_gid)
    os.chmod(pki.server_key, 0o640)
    for public in (pki.server_cert, pki.ca_cert):
        os.chmod(public, 0o644)
    tokens: dict[str, str] = {}
    users: dict[str, identity.UserRecord] = {}
    for name, os_user in (("alice", alice.name), ("bob", bob.name), ("rooty", "root")):
        tokens[name], rec = identity.new_token()
        users[name] = identity.UserRecord(name=name, os_user=os_user, tokens=[rec])
    conf = state / "etc" if etc else state
    if etc:
        conf.mkdir(mode=0o750)
        os.chown(conf, 0, service.pw_gid)
    identity.save_users(conf / "users.yaml", users)
    port = int(overrides.get("listen", {}).get("port") or free_port())  # a test may need the URL before the start
    cfg: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "tls": {"cert": str(pki.server_cert), "key": str(pki.server_key)},
        "users_file": str(conf / "users.yaml"), "grants_file": str(conf / "mcp-sudo.yaml"),
        "helper_socket": "run/helper.sock", "service_user": "mcpd",
        "audit_log": "audit/audit.jsonl", "access_log": "access/access.jsonl", "state_dir": ".",
        "helper_state_dir": "helper",
        "workers": {"per_account": 4, "timeout_seconds": 20},
    }
    cfg.update(overrides)
    if etc:  # (its relative paths are taken from its own folder)
        cfg.update({k: str(state / v) for k, v in cfg.items() if k in ("helper_socket", "audit_log", "access_log",
                                                                       "state_dir", "helper_state_dir")})
    config_path = conf / "mcpd.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    os.chown(config_path, 0, service.pw_gid)
    os.chmod(config_path, 0o640)
    d = PrivsepDaemon(
        url=f"https://127.0.0.1:{port}", cacert=str(pki.ca_cert), state_dir=state, config_path=config_path,
        socket_path=state / "run" / "helper.sock", audit_path=state / "audit" / "audit.jsonl",
        access_path=state / "access" / "access.jsonl",
        grants_path=conf / "mcp-sudo.yaml", tokens=tokens, accounts={"alice": alice, "bob": bob},
        service=service, srv=srv, nofile=nofile, helper_wrap=list(helper_wrap or []),
    )
    d.write_grants(d.default_grants(), hup=False)
    try:
        d.start_helper()
        d.start_front()
    except BaseException:  # a half-started daemon must not outlive the test run
        stop_privsep(d)
        raise
    return d


def stop_privsep(d: PrivsepDaemon) -> None:
    """Stop front and helper, kill what still runs as the test accounts, remove files (bounded)."""
    _stop(d.front)
    _stop(d.helper)
    uids = {str(a.uid) for a in d.accounts.values()}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if proc_status(int(entry))["Uid"].split()[0] in uids:
                    os.kill(int(entry), signal.SIGKILL)
            except (OSError, KeyError):
                pass
    shutil.rmtree(d.srv, ignore_errors=True)
    shutil.rmtree(str(d.srv) + "-evil", ignore_errors=True)
    shutil.rmtree(d.state_dir, ignore_errors=True)


@contextlib.contextmanager
def running_privsep(**overrides: Any) -> Iterator[PrivsepDaemon]:
    """A :class:`PrivsepDaemon` started with :func:`start_privsep` and ``overrides`` on accounts of
    its own, stopped and its accounts removed when the block ends. Root only: skips otherwise."""
    if os.geteuid() != 0:
        pytest.skip("needs root: starts the root helper and creates OS accounts")
    factory = AccountFactory()
    d: PrivsepDaemon | None = None
    try:
        d = start_privsep(factory, **overrides)
        yield d
    finally:
        if d is not None:
            stop_privsep(d)
        factory.cleanup()


@pytest.fixture(scope="module")
def privsep_daemon() -> Iterator[PrivsepDaemon]:
    """Module-scoped :class:`PrivsepDaemon` (root only; skipped otherwise)."""
    with running_privsep() as d:
        yield d
