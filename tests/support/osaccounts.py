"""Real OS accounts and groups for root-only tests (privileged reads, workers, PAM: docs/REFERENCE.md §4, §5).

The helpers call the shadow-utils commands (``useradd``, ``chpasswd``, ``usermod``, ``chage``,
``userdel``, ``groupadd``, ``groupdel``), so accounts are as real as an administrator's. Every
helper skips the calling test (``pytest.skip``) when not run as root.

Use the :func:`os_accounts` fixture, which creates uniquely named accounts and removes them,
their home folders and their groups when the test ends::

    from tests.support.osaccounts import os_accounts  # noqa: F401  (or pytest_plugins = ["tests.support.osaccounts"])

    def test_x(os_accounts: AccountFactory) -> None:
        ops = os_accounts.group()
        alice = os_accounts.user(password="pw", groups=(ops,))
        ...

Several test sessions may run at once on one machine, so names are random (``mcpdt`` + 6 hex
digits) and commands that find ``/etc/passwd`` locked by another one are retried a bounded
number of times.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PREFIX = "mcpdt"
LOGIN_SHELL = "/bin/bash"
_LOCK_RETRIES = 40  # ~10 s in total of waiting for another process's /etc/passwd lock
_LOCKED_EXIT = 10  # shadow-utils: "can't lock password file" (useradd 10, usermod 10, ...)


@dataclass(frozen=True)
class Account:
    """A real OS account made for a test.

    Attributes:
        name: the login name.
        uid, gid: its user id and primary group id.
        home: its home folder (created, owned by it).
        password: its plain password, or ``None`` if the password is locked (no password login).
        groups: supplementary group names.
    """

    name: str
    uid: int
    gid: int
    home: str
    password: str | None
    groups: tuple[str, ...]


def require_root() -> None:
    """Skip the calling test unless the process runs as root (euid 0)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creates real OS accounts")


def _run(args: Sequence[str], stdin: str | None = None) -> None:
    """Run a shadow-utils command, retrying while another process holds the passwd lock.

    Raises:
        RuntimeError: the command failed for any other reason (stderr is in the message; it
            never contains the password, which is only ever passed on stdin).
    """
    for _ in range(_LOCK_RETRIES):
        proc = subprocess.run(
            list(args), input=stdin, capture_output=True, text=True, timeout=60, check=False
        )
        if proc.returncode == 0:
            return
        locked = proc.returncode == _LOCKED_EXIT or "lock" in proc.stderr.lower()
        if not locked:
            break
        time.sleep(0.25)
    raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stderr.strip()}")


def _exists_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _exists_group(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def ensure_group(name: str) -> int:
    """Create OS group ``name`` unless it exists; return its gid.

    Raises:
        RuntimeError: ``groupadd`` failed.
    """
    require_root()
    if not _exists_group(name):
        _run(["groupadd", name])
    return grp.getgrnam(name).gr_gid


def ensure_user(name: str, password: str | None = None, groups: Sequence[str] = ()) -> Account:
    """Create (or update) a login account with a home folder and a shell.

    Args:
        name: login name (``[a-z_][a-z0-9_-]*``, at most 32 characters).
        password: set with ``chpasswd`` (on stdin) when given; otherwise the password stays
            locked, so PAM password logins fail for it.
        groups: supplementary groups, created if missing; added to existing memberships.

    Returns:
        The :class:`Account` as the system now describes it.

    Raises:
        RuntimeError: a shadow-utils command failed.
    """
    require_root()
    for group in groups:
        ensure_group(group)
    if not _exists_user(name):
        _run(["useradd", "--create-home", "--user-group", "--shell", LOGIN_SHELL, name])
    if groups:
        _run(["usermod", "--append", "--groups", ",".join(groups), name])
    if password is not None:
        _run(["chpasswd"], stdin=f"{name}:{password}\n")
    entry = pwd.getpwnam(name)
    return Account(name, entry.pw_uid, entry.pw_gid, entry.pw_dir, password, tuple(groups))


def lock_user(name: str) -> None:
    """Lock the account's password (``usermod --lock``): PAM's auth stack must refuse it."""
    require_root()
    _run(["usermod", "--lock", name])


def expire_user(name: str) -> None:
    """Expire the account (``chage -E 0``, i.e. 1970-01-01): PAM's account stack must refuse it."""
    require_root()
    _run(["chage", "--expiredate", "0", name])


def remove_user(name: str) -> None:
    """Delete the account, its home folder and mail spool; a missing account is not an error.

    Its processes are not killed first: ``userdel --force`` removes the account anyway, and
    workers that belong to the test are the test's to stop.
    """
    require_root()
    if _exists_user(name):
        _run(["userdel", "--force", "--remove", name])
    if _exists_group(name):  # the user's own group, when another member kept it alive
        _run(["groupdel", name])


def remove_group(name: str) -> None:
    """Delete OS group ``name``; a missing group is not an error."""
    require_root()
    if _exists_group(name):
        _run(["groupdel", name])


def unique_name() -> str:
    """A fresh account or group name: ``mcpdt`` and 6 random hex digits (11 characters)."""
    return PREFIX + secrets.token_hex(3)


@dataclass
class AccountFactory:
    """Creates accounts and groups for one test and removes all of them at :meth:`cleanup`."""

    users: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)

    def group(self, name: str | None = None) -> str:
        """Create a group (random name unless given); return its name."""
        name = name or unique_name()
        existed = _exists_group(name)
        ensure_group(name)
        if not existed:
            self.groups.append(name)
        return name

    def user(
        self, name: str | None = None, password: str | None = None, groups: Sequence[str] = ()
    ) -> Account:
        """Create an account (random name unless given); see :func:`ensure_user`."""
        name = name or unique_name()
        if not _exists_user(name):
            self.users.append(name)
        for group in groups:
            self.group(group)
        return ensure_user(name, password, groups)

    def cleanup(self) -> None:
        """Remove every account and group this factory created (users first, then groups)."""
        errors: list[str] = []
        for name in reversed(self.users):
            try:
                remove_user(name)
            except RuntimeError as exc:
                errors.append(str(exc))
        for name in reversed(self.groups):
            try:
                remove_group(name)
            except RuntimeError as exc:
                errors.append(str(exc))
        self.users.clear()
        self.groups.clear()
        if errors:
            raise RuntimeError("; ".join(errors))


@pytest.fixture
def os_accounts() -> Iterator[AccountFactory]:
    """Pytest fixture: an :class:`AccountFactory` whose accounts vanish after the test (root only)."""
    require_root()
    factory = AccountFactory()
    try:
        yield factory
    finally:
        factory.cleanup()


SHIPPED_PAM_FILE = Path(__file__).resolve().parents[2] / "etc/pam.d/mcpd"


@contextlib.contextmanager
def pam_service(source: Path = SHIPPED_PAM_FILE) -> Iterator[str]:
    """Install ``source`` (the shipped PAM service by default) under a unique name in
    ``/etc/pam.d`` (root only); yield the name; remove it afterwards."""
    require_root()
    name = f"mcpd-test-{secrets.token_hex(3)}"
    target = Path("/etc/pam.d") / name
    shutil.copy(source, target)
    target.chmod(0o644)
    try:
        yield name
    finally:
        target.unlink(missing_ok=True)
