"""Root state that root owns, tried by a compromised front (docs/REFERENCE.md §4.5a).

The front runs as the service user ``mcpd``, whose state folder it owns and may write, as in
production (``/var/lib/mcpd``). An attacker running code as ``mcpd`` plants, in every folder that
account can write, a symlink named like every file the root helper writes (its token store, the
store's lock and temporary files, the audit log, its socket) pointing at a root-owned canary, and an
old copy of the token store taken while a since-revoked login token was live. The helper is then
driven through everything that writes state (logins, a logout, privileged calls, a SIGHUP reload,
a restart). Root must never write, chmod or chown the canary nor create anything beside it, and the
revoked token must stay revoked.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mcpd.client import login as login_client
from mcpd.client.api import AuthError
from mcpd.common import identity
from tests.support.osaccounts import AccountFactory, ensure_user, pam_service
from tests.support.pam_login import status_of_sse
from tests.support.privsep_calls import read_once
from tests.support.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep

pytestmark = pytest.mark.root

def writable_by(account: pwd.struct_passwd, top: Path) -> list[Path]:
    """Every folder under ``top`` (itself included) that ``account`` may create entries in, as the
    kernel decides it (``test -w`` run as the account)."""
    found = []
    for folder, dirs, _ in os.walk(top):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
        probe = subprocess.run(["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
                                "--clear-groups", "test", "-w", folder, "-a", "-x", folder], timeout=30)
        if probe.returncode == 0:
            found.append(Path(folder))
    return found


def as_account(account: pwd.struct_passwd, *argv: str) -> None:
    subprocess.run(["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups",
                    *argv], check=True, timeout=30)


@pytest.fixture()
def front_owned_daemon() -> Iterator[tuple[PrivsepDaemon, Path, AccountFactory, str]]:
    """A daemon whose front state folder belongs to ``mcpd`` (0750), with a test PAM service."""
    if os.geteuid() != 0:
        pytest.skip("needs root: PAM service, OS accounts, root helper")
    front_state = Path(tempfile.mkdtemp(prefix="mcpd-front-state-", dir="/tmp"))
    factory = AccountFactory()
    d: PrivsepDaemon | None = None
    with pam_service() as service_name:
        try:
            d = start_privsep(factory, state_dir=str(front_state),
                              login={"pam_service": service_name, "answer_seconds": 0.3})
            os.chown(front_state, d.service.pw_uid, d.service.pw_gid)
            os.chmod(front_state, 0o750)
            yield d, front_state, factory, service_name
        finally:
            if d is not None:
                stop_privsep(d)
            factory.cleanup()
            shutil.rmtree(front_state, ignore_errors=True)


def enrolled_login(d: PrivsepDaemon, factory: AccountFactory) -> tuple[str, str, Callable[[], str]]:
    """A fresh account with a password, bound to a principal in ``users.yaml``; returns
    ``(name, password, login)`` where ``login()`` returns a new login token."""
    password = secrets.token_urlsafe(12)
    acct = factory.user(password=password)
    ensure_user(acct.name, password=password)
    users = identity.load_users(d.state_dir / "users.yaml")
    users[acct.name] = identity.UserRecord(name=acct.name, os_user=acct.name, tokens=[identity.new_token()[1]])
    identity.save_users(d.state_dir / "users.yaml", users)
    return acct.name, password, lambda: str(login_client.login(d.url, acct.name, password, d.cacert)["token"])


def test_planted_symlinks_and_an_old_token_store_change_nothing_of_roots(
        front_owned_daemon: tuple[PrivsepDaemon, Path, AccountFactory, str]) -> None:
    d, front_state, factory, _ = front_owned_daemon
    service = d.service
    helper_state = d.state_dir / "helper"
    name, password, login = enrolled_login(d, factory)

    revoked, kept = login(), login()
    assert status_of_sse(d, revoked) == 200
    old_store = {p.name: p.read_bytes() for p in helper_state.iterdir() if p.is_file()}
    assert old_store, "the helper's store holds the live login tokens"
    login_client.logout(d.url, revoked, d.cacert)
    assert status_of_sse(d, revoked) == 401

    # the canary: a root-owned file the attacker wants root to overwrite, chmod or chown
    canary_dir = Path(tempfile.mkdtemp(prefix="mcpd-canary-", dir="/tmp"))
    canary = canary_dir / "root-file"
    canary.write_bytes(b"root's own bytes\n")
    os.chmod(canary, 0o600)
    before = os.stat(canary)
    try:
        folders = writable_by(service, d.state_dir) + writable_by(service, front_state)
        assert front_state in folders, "the front's own state folder is the service user's to write"
        assert not [f for f in folders if f == helper_state or helper_state in f.parents], \
            "the service user can write into the helper's state"
        names = set(old_store) | {n + suffix for n in old_store for suffix in (".lock", ".tmp", "~")}
        names |= {"issued-tokens.json", "issued-tokens.json.lock", "helper", os.path.basename(d.audit_path),
                  os.path.basename(d.socket_path), "lockout.json"}
        for folder in folders:
            for name in names:
                target = folder / name
                if os.path.lexists(target):
                    continue
                as_account(service, "ln", "-s", str(canary), str(target))
            copy = folder / "helper-copy"
            copy.mkdir(exist_ok=True)
            os.chown(copy, service.pw_uid, service.pw_gid)
            for name, data in old_store.items():  # an old store: the revoked token still in it
                (copy / name).write_bytes(data)
                os.chown(copy / name, service.pw_uid, service.pw_gid)

        # drive the helper through everything that writes state
        third = login()
        with pytest.raises(AuthError):
            login_client.login(d.url, name, "wrong password", d.cacert)
        login_client.logout(d.url, third, d.cacert)
        assert read_once(d, d.log_file, privileged=True)[1] == {}
        d.helper.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        time.sleep(1.0)
        d.restart_helper()
        assert read_once(d, d.log_file, privileged=True)[1] == {}

        after = os.stat(canary)
        assert canary.read_bytes() == b"root's own bytes\n"
        assert (after.st_uid, after.st_gid, stat.S_IMODE(after.st_mode), after.st_mtime_ns, after.st_ino) == \
            (before.st_uid, before.st_gid, 0o600, before.st_mtime_ns, before.st_ino)
        assert sorted(p.name for p in canary_dir.iterdir()) == ["root-file"]
        assert status_of_sse(d, revoked) == 401 and status_of_sse(d, third) == 401
        assert status_of_sse(d, kept) == 200
    finally:
        shutil.rmtree(canary_dir, ignore_errors=True)


@pytest.mark.parametrize("owner, mode", [("service", 0o640), ("root", 0o660), ("root", 0o646)])
def test_helper_refuses_a_config_file_another_account_can_change(
        front_owned_daemon: tuple[PrivsepDaemon, Path, AccountFactory, str], owner: str, mode: int) -> None:
    """``mcpd.yaml`` names the files root trusts (grants, users, its state): the helper reads it
    only when root owns it and neither group nor others may write it, like the grants file."""
    import sys

    d = front_owned_daemon[0]
    bad = d.state_dir / f"bad-{secrets.token_hex(3)}.yaml"
    bad.write_bytes(d.config_path.read_bytes())
    uid = d.service.pw_uid if owner == "service" else 0
    os.chown(bad, uid, d.service.pw_gid)
    os.chmod(bad, mode)
    try:
        res = subprocess.run([sys.executable, "-I", "-m", "mcpd.helper", "--config", str(bad)],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 78, res.stderr
        assert "cannot start" in res.stderr and str(bad) in res.stderr, res.stderr
    finally:
        bad.unlink()


def run_helper(config: Path, listener: socket.socket | None) -> subprocess.CompletedProcess[str]:
    """``python -I -m mcpd.helper --config CONFIG`` as root, handed ``listener`` as fd 3 the way
    systemd's socket unit hands it (``LISTEN_PID``, ``LISTEN_FDS=1``), or nothing."""
    import sys

    argv = [sys.executable, "-I", "-m", "mcpd.helper", "--config", str(config)]
    if listener is None:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)
    hand_over = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.environ.update(LISTEN_PID=str(os.getpid()), "
                 "LISTEN_FDS='1'); os.execv(sys.argv[2], sys.argv[2:])")
    return subprocess.run([sys.executable, "-c", hand_over, str(listener.fileno()), *argv],
                          capture_output=True, text=True, timeout=60, pass_fds=(listener.fileno(),))


@pytest.mark.parametrize("broken", ["duplicate key", "not valid YAML"])
def test_helper_starts_nothing_from_a_config_the_strict_loader_refuses(
        front_owned_daemon: tuple[PrivsepDaemon, Path, AccountFactory, str], tmp_path: Path, broken: str) -> None:
    """Root reads its own keys of ``mcpd.yaml`` with PyYAML's safe loader, which takes the last of two
    equal keys; the policy process holds the whole file to the strict loader. A file with a key
    twice (here the helper's socket) or one that is not YAML ends the helper with 78, and the
    message quotes nothing of the file."""
    d = front_owned_daemon[0]
    folder = tmp_path / "conf"
    folder.mkdir()
    os.chmod(tmp_path, 0o755)
    text = d.config_path.read_text()
    assert "\nhelper_socket:" in "\n" + text
    text += f"helper_socket: {folder}/helper.sock\n" if broken == "duplicate key" else "tls: [unclosed-SECRET-TEXT\n"
    bad = folder / "mcpd.yaml"
    bad.write_text(text)
    os.chmod(bad, 0o640)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(folder / "helper.sock"))
        listener.listen(1)
        res = run_helper(bad, listener)
    assert res.returncode == 78, res.stderr
    assert broken in res.stderr and "SECRET-TEXT" not in res.stderr, res.stderr
    assert stat.S_ISSOCK(os.lstat(d.socket_path).st_mode)  # the running helper's socket is untouched


def test_helper_started_without_its_socket_starts_nothing(
        front_owned_daemon: tuple[PrivsepDaemon, Path, AccountFactory, str]) -> None:
    """Root binds no socket: started by hand without one handed over (neither systemd's socket
    unit nor ``mcpd helper``), it ends with 78 before it starts anything, and says how to start it."""
    d = front_owned_daemon[0]
    res = run_helper(d.config_path, None)
    assert res.returncode == 78, res.stderr
    assert "no listening socket was handed over" in res.stderr and "mcpd helper" in res.stderr, res.stderr
    assert "started the policy process" not in res.stderr
    assert stat.S_ISSOCK(os.lstat(d.socket_path).st_mode)  # the running helper's socket is untouched


def test_a_grant_covering_root_still_refuses_every_secret_of_the_daemon(
        front_owned_daemon: tuple[PrivsepDaemon, Path, AccountFactory, str]) -> None:
    """The fixed deny: with ``paths: ["/"]`` for every tool, the daemon's own secrets are refused
    by name and through a symlink, and a listing or search never shows them."""
    import asyncio

    from tests.support.privsep_calls import client

    d, _, factory, _ = front_owned_daemon
    enrolled_login(d, factory)[2]()  # the helper's state now holds a login token
    everything = {"allowed": True, "paths": ["/"]}
    d.write_grants({"users": {d.accounts["alice"].name: {"privileged": {"tools": {
        tool: dict(everything) for tool in ("files/read", "files/list", "files/find", "files/filetype")}}}}})
    time.sleep(1.0)
    helper_files = [p for p in (d.state_dir / "helper").iterdir()]
    secrets_ = [d.config_path, d.state_dir / "users.yaml", d.grants_path, d.audit_path,
                d.state_dir / "tls" / "server.key", d.state_dir / "tls" / "ca.key", *helper_files]
    assert helper_files, "the helper keeps state"
    link = d.app / "innocent.txt"
    os.symlink(d.state_dir / "users.yaml", link)

    async def go() -> None:
        async with client(d) as c:
            assert not (await c.call_tool("files/read", {"path": str(d.log_file), "privileged": True})).get("isError")
            for path in [*secrets_, link]:
                for tool in ("files/read", "files/filetype"):
                    res = await c.call_tool(tool, {"path": str(path), "privileged": True}, check=False)
                    assert res.get("isError"), (tool, path)
                    assert res["structuredContent"]["error"]["code"] == "PERMISSION_DENIED", (tool, path, res)
            names = {p.name for p in secrets_}
            for folder in {p.parent for p in secrets_}:
                res = await c.call_tool("files/list", {"path": str(folder), "privileged": True}, check=False)
                listed = res["structuredContent"]
                assert not res.get("isError") or listed["error"]["code"] == "PERMISSION_DENIED", res
                shown = {e["name"] for e in listed.get("entries", [])}
                assert not shown & names, (folder, shown & names)
            res = await c.call_tool("files/find", {"root": str(d.state_dir), "privileged": True}, check=False)
            found = res["structuredContent"]
            assert not res.get("isError"), found
            paths = {m["path"] for m in found["matches"]}
            assert str(d.state_dir / "helper.log") in paths, paths  # the search does show what is not secret
            assert not paths & {str(p) for p in secrets_}, paths & {str(p) for p in secrets_}

    try:
        asyncio.run(go())
    finally:
        link.unlink()


def test_one_principal_cannot_take_every_privileged_slot() -> None:
    """``max_privileged_per_principal``: with one slow privileged call of alice's in flight, her next
    one is refused RATE_LIMITED at once (on any session), and the slot is hers again afterwards."""
    import asyncio

    from tests.support.privsep_calls import client, read

    if os.geteuid() != 0:
        pytest.skip("needs root: OS accounts, root helper")
    factory = AccountFactory()
    d = start_privsep(factory, max_privileged_per_principal=1)
    huge = d.app / "huge.log"
    try:
        with open(huge, "wb") as f:
            f.write(b"a\n" * 8192)
            f.truncate(16 * 1024 ** 3)  # a hole: counting its lines takes seconds

        async def go() -> None:
            async with client(d) as first, client(d) as second:
                slow = asyncio.create_task(read(first, huge, privileged=True, start_line=10 ** 9))
                await asyncio.sleep(1.0)
                text, err = await read(second, d.log_file, privileged=True)
                assert text is None and err["code"] == "RATE_LIMITED", err
                slow.cancel()
                await asyncio.sleep(1.0)
                text, err = await read(second, d.log_file, privileged=True)
                assert err == {}, err

        asyncio.run(go())
    finally:
        huge.unlink(missing_ok=True)
        stop_privsep(d)
        factory.cleanup()


def test_the_shipped_etc_layout_authenticates_through_root() -> None:
    """The shipped ``tmpfiles.d`` makes ``/etc/mcpd`` ``0750 root:mcpd``: the policy process (not
    in group ``mcpd``) may not enter it, and reads ``mcpd.yaml``, the users and the grants files
    through root. Every token was refused there (401) with nothing logged: the users file looked
    missing to a plain existence check, so no principal existed. Here: tokens authenticate, a
    principal added later does within seconds, the grants apply, and a users file that does not
    load is logged and fails closed."""
    if os.geteuid() != 0:
        pytest.skip("needs root: OS accounts, root helper")
    factory = AccountFactory()
    d: PrivsepDaemon | None = None
    try:
        d = start_privsep(factory, etc=True)
        conf = d.config_path.parent
        assert stat.S_IMODE(conf.stat().st_mode) == 0o750 and conf.stat().st_gid == d.service.pw_gid
        policy = pwd.getpwnam("mcpd-policy")
        assert subprocess.run(["setpriv", f"--reuid={policy.pw_uid}", f"--regid={policy.pw_gid}", "--clear-groups",
                               "test", "-x", str(conf)]).returncode == 1, "the policy process may enter the folder"
        alice = d.accounts["alice"]
        own = Path(tempfile.mkdtemp(prefix="mcpd-etc-", dir="/tmp"))
        os.chmod(own, 0o755)
        mine = own / "mine.txt"
        mine.write_text("alice's own\n")
        os.chown(mine, alice.uid, alice.uid)
        os.chmod(mine, 0o600)
        try:
            assert read_once(d, mine) == ("alice's own\n", {})
            assert read_once(d, d.log_file, privileged=True)[1] == {}
            assert read_once(d, d.secret, privileged=True)[1]["code"] == "PERMISSION_DENIED"
            users_path = conf / "users.yaml"
            users = identity.load_users(users_path)
            token, rec = identity.new_token()
            users["carol"] = identity.UserRecord(name="carol", os_user=alice.name, tokens=[rec])
            identity.save_users(users_path, users)
            d.tokens["carol"] = token
            deadline = time.monotonic() + 10
            while status_of_sse(d, token) != 200:
                assert time.monotonic() < deadline, "a principal added later was never seen"
                time.sleep(0.5)
            assert read_once(d, mine, principal="carol") == ("alice's own\n", {})
            users_path.write_text("users: [this is not a mapping\n")
            os.chmod(users_path, 0o600)
            deadline = time.monotonic() + 45  # (the front may trust a token it checked for auth_cache_seconds)
            while status_of_sse(d, d.tokens["alice"]) != 401:
                assert time.monotonic() < deadline, "a users file that does not load left the old tokens working"
                time.sleep(0.5)
            assert "users.yaml not loaded" in (d.state_dir / "helper.log").read_text()
        finally:
            shutil.rmtree(own, ignore_errors=True)
    finally:
        if d is not None:
            stop_privsep(d)
        factory.cleanup()


def test_mcpd_helper_makes_the_socket_as_the_socket_unit_does(
        front_owned_daemon: tuple[PrivsepDaemon, Path, AccountFactory, str], tmp_path: Path) -> None:
    """``mcpd helper`` binds the helper socket root does not: owner root, the service user's
    group, 0660, as ``mcpd-helper.socket`` has it. A path that holds anything but a socket is
    refused (exit 1, the file untouched) and no helper starts."""
    import sys

    d = front_owned_daemon[0]
    st = os.lstat(d.socket_path)
    assert stat.S_ISSOCK(st.st_mode) and (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, d.service.pw_gid, 0o660)
    os.chmod(tmp_path, 0o755)
    taken = tmp_path / "not-a-socket"
    taken.write_bytes(b"root's own bytes\n")
    bad = tmp_path / "mcpd.yaml"
    text = d.config_path.read_text()
    assert "\nhelper_socket:" in "\n" + text
    bad.write_text("\n".join(f"helper_socket: {taken}" if line.startswith("helper_socket:") else line
                             for line in text.splitlines()) + "\n")
    os.chmod(bad, 0o640)
    res = subprocess.run([sys.executable, "-m", "mcpd.admin.cli", "helper", "--config", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "exists and is not a socket" in res.stderr, res.stderr
    assert taken.read_bytes() == b"root's own bytes\n"
