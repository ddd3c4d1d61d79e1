"""``mcpd dev`` run as root: the root helper, the front as the service user (docs/PRIVSEP.md).

:func:`run` makes the state folder fit for privilege separation (:func:`setup_root_state`),
installs the PAM service when the host has none, then runs the helper and the front
(:mod:`mcpd.admin.devsupervisor`). The folder becomes::

    <state>/                 0751 root:mcpd   the front may enter and list; the policy enter
      mcpd.yaml              0640 root:mcpd   helper_socket run/helper.sock, audit in audit/
      server.key             0640 root:mcpd   the front's TLS key; ca.key stays 0600 root
      users.yaml             0600 root        principal ``dev`` → the unprivileged ``mcpd-dev``
      mcp-sudo.yaml          0600 root        example grant: mcpd-dev may read root-only/
      run/helper.sock        0660 root:mcpd   the helper's socket (folder 0750 root:mcpd)
      audit/audit.jsonl      0600 mcpd-policy (folder 0700 mcpd-policy, made by the helper)
      helper/                0700 mcpd-policy login tokens and lockout (made by the helper)
      root-only/secret.txt   0600 root        (folder 0700 root) the example's sample file

Missing accounts are created (system accounts, no login shell): ``mcpd`` (the service user),
``mcpd-policy`` (the policy process), ``mcpd-walk`` (privileged list/find walkers), ``mcpd-dev``.
"""

from __future__ import annotations

import os
import pwd
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any, TextIO

import yaml

from mcpd.admin.devstate import (
    DEV_ACCOUNT,
    DEV_PRINCIPAL,
    SERVICE_USER,
    DevRootError,
    DevState,
    RootSetup,
    print_exports,
    print_privileged,
    print_routes,
)
from mcpd.admin.devstop import DevStop, stop_signals
from mcpd.admin.devsupervisor import say, spawn_helper, stop_process, supervise
from mcpd.common import config, identity
from mcpd.common.strictyaml import parse_strict_yaml
from mcpd.helper.wire.securefile import ConfigFileError

NOLOGIN = "/usr/sbin/nologin"
SAMPLE_TEXT = "only root can read this file; the dev principal reads it through its grant\n"
_LOCK_RETRIES = 40


def ensure_system_account(name: str) -> pwd.struct_passwd:
    """Return account ``name``, creating it first when missing (``useradd --system``, own group,
    no home folder, shell ``/usr/sbin/nologin``). Retries while another process holds the passwd lock.

    Raises:
        DevRootError: ``useradd`` failed.
    """
    for _ in range(_LOCK_RETRIES):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
        proc = subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
             "--shell", NOLOGIN, name],
            capture_output=True, text=True, timeout=60, check=False,
        )
        if proc.returncode == 0 or "already exists" in proc.stderr:
            continue
        if "lock" not in proc.stderr.lower() and proc.returncode != 10:
            raise DevRootError(f"useradd {name} failed: {proc.stderr.strip()}")
        time.sleep(0.25)
    raise DevRootError(f"could not create account {name}: /etc/passwd stayed locked")


def _own(path: Path, uid: int, gid: int, mode: int) -> None:
    os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, mode, follow_symlinks=False)


def _folder(path: Path, gid: int, mode: int) -> None:
    path.mkdir(exist_ok=True)
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        raise DevRootError(f"{path} is not a folder")
    _own(path, 0, gid, mode)


def check_reachable(folder: Path, account: pwd.struct_passwd) -> None:
    """Check that ``account`` may enter every folder above ``folder`` (the front, running as the
    service user, must open its config and TLS files there).

    Raises:
        DevRootError: a parent folder is closed to the account (the message names it).
    """
    groups = set(os.getgrouplist(account.pw_name, account.pw_gid))
    for parent in folder.parents:
        st = os.stat(parent)
        if st.st_uid == account.pw_uid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid in groups:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
        if not ok:
            raise DevRootError(f"the account {account.pw_name} cannot enter {parent}: "
                               "choose a --state-dir whose parent folders others may enter")


def example_grants(folder: Path) -> dict[str, object]:
    """The example ``mcp-sudo.yaml`` (format: etc/mcpd/mcp-sudo.yaml): ``mcpd-dev`` may read and list ``folder``."""
    def rule() -> dict[str, object]:  # a fresh mapping per tool, so the YAML has no anchors
        return {"allowed": True, "paths": [str(folder)]}

    return {"users": {DEV_ACCOUNT: {"privileged": {"tools": {"files/read": rule(), "files/list": rule()}}}}}


def setup_root_state(state: DevState) -> RootSetup:
    """Make ``state``'s folder fit for privilege separation (see the module docstring).

    ``users.yaml`` keeps the ``dev`` token just issued but binds it to ``mcpd-dev``; an existing
    ``mcp-sudo.yaml`` is kept (only its owner and mode are fixed), a missing one gets the example.

    Raises:
        DevRootError: an account could not be created.
        OSError: the folder cannot be changed.
        ConfigFileError: ``mcpd.yaml`` breaks the strict YAML rules (a duplicate or merge key ...).
        identity.UsersFileError: ``users.yaml`` is malformed.
    """
    folder: Path = state.state_dir
    service = ensure_system_account(SERVICE_USER)
    dev = ensure_system_account(DEV_ACCOUNT)
    ensure_system_account(config.WALK_USER)
    policy = ensure_system_account(config.POLICY_USER)
    check_reachable(folder, service)
    check_reachable(folder, policy)
    _folder(folder, service.pw_gid, 0o751)
    _folder(folder / "run", service.pw_gid, 0o750)
    for own in (folder / "audit", folder / "helper"):  # the policy's own (an older dev folder had them root's)
        if own.is_dir() and not own.is_symlink() and own.stat().st_uid == 0:
            for path in [own, *own.iterdir()]:
                os.chown(path, policy.pw_uid, policy.pw_gid, follow_symlinks=False)
    (folder / "front").mkdir(exist_ok=True)  # the front's access log: the service user's own folder
    _own(folder / "front", service.pw_uid, service.pw_gid, 0o700)
    root_only = folder / "root-only"
    _folder(root_only, 0, 0o700)
    sample = root_only / "secret.txt"
    if not sample.exists():
        sample.write_text(SAMPLE_TEXT)
    _own(sample, 0, 0, 0o600)

    cfg_data = _read_mapping(state.config_path)
    cfg_data.update(helper_socket="run/helper.sock", audit_log="audit/audit.jsonl", helper_state_dir="helper",
                    service_user=SERVICE_USER, access_log="front/access.jsonl")
    with open(state.config_path, "w", encoding="utf-8") as f:
        f.write("# mcpd development configuration, written by `mcpd dev` as root (rewritten on each run)\n")
        yaml.safe_dump(cfg_data, f, sort_keys=False)
    _own(state.config_path, 0, service.pw_gid, 0o640)
    cfg = config.load(state.config_path)
    _own(Path(cfg.tls.key), 0, service.pw_gid, 0o640)
    for public in (Path(cfg.tls.cert), state.cacert):
        _own(public, 0, 0, 0o644)

    users = identity.load_users(cfg.users_file)
    record = users[DEV_PRINCIPAL]
    users[DEV_PRINCIPAL] = identity.UserRecord(name=record.name, os_user=DEV_ACCOUNT, tokens=record.tokens,
                                                 redact=record.redact)
    identity.save_users(cfg.users_file, users)
    _own(Path(cfg.users_file), 0, 0, 0o600)
    grants = Path(cfg.grants_file)
    if not grants.exists():
        with open(grants, "w", encoding="utf-8") as f:
            f.write("# example grant written by `mcpd dev`; the format is explained in etc/mcpd/mcp-sudo.yaml.\n"
                    "# Edit it: the helper reloads it, and `mcpd grants check FILE` validates it.\n")
            yaml.safe_dump(example_grants(root_only), f, sort_keys=False)
    _own(grants, 0, 0, 0o600)
    return RootSetup(config_path=state.config_path, socket_path=Path(cfg.helper_socket),
                     helper_log=folder / "helper.log", sample_file=sample, service=service, dev_account=dev)


def _read_mapping(path: Path) -> dict[str, Any]:
    """``path``'s YAML mapping, read with the one strict loader, as plain ``dict``/``list`` values
    (what ``yaml.safe_dump`` writes back).

    Raises:
        ConfigFileError: not one YAML document, a duplicate or merge key, or not a mapping.
    """
    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return [plain(v) for v in value] if isinstance(value, list) else value

    data = parse_strict_yaml(path.read_text(encoding="utf-8"), str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigFileError([f"{path}: the top level must be a mapping"])
    return plain(data)  # type: ignore[no-any-return]


PAM_SERVICE = Path("/etc/pam.d/mcpd")
SHIPPED_PAM_SERVICE = Path(__file__).resolve().parents[2] / "etc" / "pam.d" / "mcpd"


def ensure_pam_service(err: TextIO, target: Path = PAM_SERVICE, shipped: Path = SHIPPED_PAM_SERVICE) -> bool:
    """Install the PAM service ``mcpd`` that ``linuxctl login`` needs (``target``, 0644 root),
    from the project's ``etc/pam.d/mcpd``, when the host has none; an existing one is never
    touched. Says on ``err`` what it did, or exactly how to do it. Returns whether one is there."""
    if os.path.lexists(target):
        return True
    try:
        data = shipped.read_bytes()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(target, 0o644)
    except OSError as exc:
        err.write(f"# no PAM service mcpd, so `linuxctl login` will fail ({exc.strerror}); install it with:\n"
                  f"#   install -m 0644 {shipped} {target}\n")
        return False
    err.write(f"# installed the PAM service mcpd ({target}, from {shipped}) for `linuxctl login`\n")
    return True


def run(state: DevState, out: TextIO, err: TextIO) -> int:
    """``mcpd dev`` as root, after :func:`mcpd.admin.devmode.prepare`: make the folder fit for
    privilege separation (:func:`setup_root_state`), start the root helper, print the start-up
    text on ``out`` and :func:`~mcpd.admin.devsupervisor.supervise` the helper and the front
    until a stop signal (:func:`~mcpd.admin.devstop.stop_signals`) or the front's exit. Returns
    the exit code: 78 when the setup or the helper's start fails, 0 after a stop signal, else the
    front's. Every child is started from this thread with a parent-death signal, so none
    outlives this process, whether it stops in order or is killed."""
    helper: subprocess.Popen[bytes] | None = None
    with stop_signals():
        try:
            try:
                setup = setup_root_state(state)
                ensure_pam_service(err)
                helper = spawn_helper(setup)
            except Exception as exc:  # an account, the folder, the users file, or the helper's start
                say(err, f"mcpd dev: {exc}")
                return config.EXIT_CONFIG
            print_exports(state, out)
            print_routes(state, out)
            print_privileged(True, state, out)
            return supervise(state, setup, helper, err)
        except DevStop:  # before the front ran
            return 0
        finally:
            if helper is not None and helper.returncode is None:  # supervise did not reap it
                stop_process(helper, signal.SIGTERM)

