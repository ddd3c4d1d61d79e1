"""Real OS accounts from tests/support/osaccounts.py, and the shipped PAM service etc/pam.d/mcpd run by
the real libpam (docs/REFERENCE.md §5.2: password checked, locked and expired accounts refused).

The service file is installed under a unique name (/etc/pam.d/mcpd-test-XXXXXX) so parallel
sessions and an installed /etc/pam.d/mcpd are never disturbed; it is removed afterwards.
"""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.osaccounts import AccountFactory, expire_user, lock_user, os_accounts, pam_service  # noqa: F401

pytestmark = pytest.mark.root

PAM_FILE = Path(__file__).resolve().parents[2] / "etc/pam.d/mcpd"


@pytest.fixture(name="pam_service")
def pam_service_fixture() -> Iterator[str]:
    """The shipped PAM service installed under a unique name; yields that name."""
    if os.geteuid() != 0:
        pytest.skip("needs root: installs a PAM service file")
    with pam_service(PAM_FILE) as name:
        yield name


def _pam_ok(service: str, user: str, password: str) -> bool:
    import pam

    return bool(pam.authenticate(user, password, service=service, resetcreds=False))


def test_os_accounts_creates_and_removes_real_login_accounts() -> None:
    """ensure_user makes a login account with home, shell and groups; cleanup removes it all."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creates real OS accounts")
    factory = AccountFactory()
    try:
        team = factory.group()
        acct = factory.user(password=secrets.token_urlsafe(12), groups=(team,))
        entry = pwd.getpwnam(acct.name)
        assert (entry.pw_uid, entry.pw_shell) == (acct.uid, "/bin/bash")
        home = os.stat(acct.home)
        assert stat.S_ISDIR(home.st_mode) and home.st_uid == acct.uid
        member_of = {grp.getgrgid(g).gr_name for g in os.getgrouplist(acct.name, acct.gid)}
        assert team in member_of
    finally:
        factory.cleanup()
    with pytest.raises(KeyError):
        pwd.getpwnam(acct.name)
    with pytest.raises(KeyError):
        grp.getgrnam(team)
    assert not os.path.exists(acct.home)


def test_pam_service_accepts_the_os_password(os_accounts: AccountFactory, pam_service: str) -> None:
    """docs/REFERENCE.md §5.2: the mcpd PAM service authenticates an operator with the OS password."""
    password = secrets.token_urlsafe(12)
    acct = os_accounts.user(password=password)
    assert _pam_ok(pam_service, acct.name, password)


def test_pam_service_refuses_a_wrong_password(os_accounts: AccountFactory, pam_service: str) -> None:
    """docs/REFERENCE.md §5.2: a wrong password is refused."""
    acct = os_accounts.user(password=secrets.token_urlsafe(12))
    assert not _pam_ok(pam_service, acct.name, "not-the-password")


def test_pam_service_refuses_locked_account(os_accounts: AccountFactory, pam_service: str) -> None:
    """docs/REFERENCE.md §5.2: a locked account is refused even with its right password."""
    password = secrets.token_urlsafe(12)
    acct = os_accounts.user(password=password)
    lock_user(acct.name)
    assert not _pam_ok(pam_service, acct.name, password)


def test_pam_service_refuses_expired_account(os_accounts: AccountFactory, pam_service: str) -> None:
    """docs/REFERENCE.md §5.2: an expired account is refused by the account stack, right password or not."""
    password = secrets.token_urlsafe(12)
    acct = os_accounts.user(password=password)
    expire_user(acct.name)
    assert not _pam_ok(pam_service, acct.name, password)
