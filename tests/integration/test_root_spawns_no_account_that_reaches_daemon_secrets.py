"""Root's spawn guard judges what an account can reach, not its name (docs/PRIVSEP.md section 3).

A worker runs with its account's uid and groups. Refusing the accounts *named* ``mcpd``,
``mcpd-policy`` and ``mcpd-walk`` is not enough:

- a member of group ``mcpd`` reads what the shipped modes give that group: the TLS key (``0640
  root:mcpd``) and ``mcpd.yaml``;
- a second name for the service user's uid (an alias entry, ``useradd -o``) is the front for the
  kernel: its worker may read the front's ``/proc/PID/maps``;
- a member of a group that one of the daemon's secrets lets read now (a key ``0640
  root:ssl-cert``) reads that secret.

So root refuses (reason ``daemon account``) an account with the uid of any daemon account, or in
the primary group of any of them, or in a group that one of the secrets on root's list (or its
folder) grants access to when the spawn is asked. The accounts exist only in the root helper's
own mount namespace (a copy of ``/etc``, :mod:`tests.support.rootns`); the attacker is code
as ``mcpd-policy`` on root's channel.
"""

from __future__ import annotations

import os

import pytest

from tests.support.osaccounts import Account
from tests.support.privsep_fixture import PrivsepDaemon
from tests.support.secrets_layout import ALIAS, _through_worker, layout  # noqa: F401  (fixture)

pytestmark = pytest.mark.root


def test_no_worker_for_a_member_of_the_service_group(layout: tuple[PrivsepDaemon, Account, Account]) -> None:
    d, member, _ = layout
    got = _through_worker(d, member.name, [str(d.state_dir / "tls" / "server.key"), str(d.config_path)])
    assert got is None, f"root spawned a worker for a member of group mcpd, which read: {got}"


def test_no_worker_with_the_service_users_uid_under_another_name(layout: tuple[PrivsepDaemon, Account, Account]) -> None:
    d, _, _ = layout
    got = _through_worker(d, ALIAS, [str(d.state_dir / "tls" / "server.key"), f"/proc/{d.front_pid}/maps"])
    assert got is None, f"root spawned a worker with the service user's uid, which read: {got}"


def test_no_worker_for_a_group_a_secret_lets_read_now(layout: tuple[PrivsepDaemon, Account, Account]) -> None:
    """The CA key beside the TLS key is given, while the daemon runs, to the key reader's own
    group (``0640``): root refuses that account from then on, and takes it again once the key is
    ``0600`` once more. An ordinary account is served throughout."""
    d, _, reader = layout
    ca_key = d.state_dir / "tls" / "ca.key"
    st = os.stat(ca_key)
    other = d.accounts["bob"].name
    try:
        os.chown(ca_key, 0, reader.gid)
        os.chmod(ca_key, 0o640)
        assert _through_worker(d, reader.name, []) is None, "a worker for a group that may read the CA key"
        assert _through_worker(d, other, []) is not None
    finally:
        os.chown(ca_key, st.st_uid, st.st_gid)
        os.chmod(ca_key, st.st_mode & 0o7777)
    assert _through_worker(d, reader.name, []) is not None
