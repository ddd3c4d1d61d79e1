"""Attack 13c on this morning's bounds: the worker-start bound, the outgoing byte budgets, the
revocation sweep (SPEC §1.4, §1.7, §5.3, §7; docs/PRIVSEP.md §2, §7).

Each test plays the attacker (or the honest client the bound must not hurt) for real over TLS and
checks the rule; the reproducers that print what they see are under ``attacks13c/``. Fixed flaws
are plain tests; the ones left open are strict xfails that name the rule they break and its
severity.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.client.api import Client
from tests.integration.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep
from tests.integration.test_spawn_churn import shared_folder  # noqa: F401  (fixture)
from tests.osaccounts import AccountFactory

PER_ACCOUNT = 4


@pytest.fixture(scope="module")
def privsep13c() -> Iterator[PrivsepDaemon]:
    """The privsep daemon (root helper, policy process, front as the service user)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: root helper and OS accounts")
    factory = AccountFactory()
    d: PrivsepDaemon | None = None
    try:
        d = start_privsep(factory, workers={"per_account": PER_ACCOUNT, "timeout_seconds": 20})
        yield d
    finally:
        if d is not None:
            stop_privsep(d)
        factory.cleanup()


@pytest.fixture
def readable_file(shared_folder: Path) -> Path:
    """A small file every account may read."""
    target = shared_folder / "f.txt"
    target.write_text("line\n" * 100)
    target.chmod(0o644)
    return target


def share_account(d: PrivsepDaemon, names: list[str], os_user: str) -> dict[str, str]:
    """Bind new principals ``names`` to ``os_user`` in users.yaml (seen within a second, as
    ``mcpd users add NAME --os-user OS_USER`` does): their tokens by name."""
    from mcpd.common import identity

    path = d.state_dir / "users.yaml"
    users = identity.load_users(path)
    tokens = {}
    for name in names:
        tokens[name], rec = identity.new_token()
        users[name] = identity.UserRecord(name=name, os_user=os_user, tokens=[rec])
    identity.save_users(path, users)
    time.sleep(1.5)
    return tokens


async def parallel_reads(d: PrivsepDaemon, token: str, path: Path, n: int) -> list[dict[str, Any]]:
    """``n`` reads of ``path`` at once in one session (each needs a worker of its own while the
    first ones start): their results."""
    async with Client(d.url, token, d.cacert, timeout=60) as c:
        return list(await asyncio.gather(*(c.call_tool("files/read", {"path": str(path)}, check=False)
                                           for _ in range(n))))


@pytest.mark.root
def test_principals_sharing_an_account_do_not_lock_out_another_one(
        privsep13c: PrivsepDaemon, readable_file: Path) -> None:
    """SPEC §1.4/§5 (several principals may be bound to one OS account, each served with its own
    quotas) and "a legitimate client is never locked out in normal use", medium: the policy
    process refused a new worker once the *account* had 4 x per_account workers alive, but the
    front keeps up to per_account idle workers per *principal* for ever. Four principals of one
    account that each once made per_account calls at once left 16 idle workers, and every other
    principal of that account (a fifth static one, or the account's password logins) got
    HELPER_UNAVAILABLE "this account has too many workers" on each call, for as long as the front
    ran. Fixed: the bound counts the principal's own workers."""
    d = privsep13c
    os_user = d.accounts["alice"].name
    names = [f"share{i}" for i in range(5)]
    tokens = share_account(d, names, os_user)
    for name in names[:4]:
        results = asyncio.run(parallel_reads(d, tokens[name], readable_file, PER_ACCOUNT))
        assert not any(r.get("isError") for r in results), results
    last = asyncio.run(parallel_reads(d, tokens[names[4]], readable_file, 1))[0]
    assert not last.get("isError"), last
