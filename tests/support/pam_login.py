"""PAM logins: enrolling accounts for the login endpoint and reading its answers."""

from __future__ import annotations

import secrets

import httpx

from mcpd.client.api import ssl_context
from mcpd.common import identity
from tests.support.osaccounts import Account, AccountFactory
from tests.support.privsep_fixture import PrivsepDaemon


def enroll(d: PrivsepDaemon, factory: AccountFactory) -> tuple[Account, str]:
    """A fresh account with a password, bound to a principal of its own name in users.yaml."""
    password = secrets.token_urlsafe(12)
    acct = factory.user(password=password)
    path = d.state_dir / "users.yaml"
    users = identity.load_users(path)
    _, rec = identity.new_token()
    users[acct.name] = identity.UserRecord(name=acct.name, os_user=acct.name, tokens=[rec])
    identity.save_users(path, users)
    return acct, password


def status_of_sse(d: PrivsepDaemon, token: str) -> int:
    with httpx.Client(verify=ssl_context(d.cacert), timeout=10) as c:
        with c.stream("GET", d.url + "/sse", headers={"Authorization": f"Bearer {token}"}) as resp:
            return resp.status_code


FAST_PAM = """\
auth     optional                    pam_faildelay.so delay=300000
auth     [success=1 default=ignore]  pam_unix.so nullok nodelay
auth     requisite                   pam_deny.so
auth     required                    pam_permit.so
account  required                    pam_unix.so
"""
