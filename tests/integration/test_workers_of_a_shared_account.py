"""Principals bound to one OS account are each served with their own worker quota: four of
them holding their idle workers do not lock out a fifth of the same account (docs/REFERENCE.md
§1.4, §5), through the real privilege-separated daemon."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.principals import parallel_reads, share_account
from tests.support.privsep_fixture import PrivsepDaemon, running_privsep
from tests.support.shared_folder import shared_folder  # noqa: F401  (fixture)

PER_ACCOUNT = 4


@pytest.fixture(scope="module")
def per_account_daemon() -> Iterator[PrivsepDaemon]:
    """The privsep daemon (root helper, policy process, front as the service user)."""
    with running_privsep(workers={"per_account": PER_ACCOUNT, "timeout_seconds": 20}) as d:
        yield d


@pytest.fixture
def readable_file(shared_folder: Path) -> Path:
    """A small file every account may read."""
    target = shared_folder / "f.txt"
    target.write_text("line\n" * 100)
    target.chmod(0o644)
    return target


@pytest.mark.root
def test_principals_sharing_an_account_do_not_lock_out_another_one(
        per_account_daemon: PrivsepDaemon, readable_file: Path) -> None:
    """docs/REFERENCE.md §1.4/§5 (several principals may be bound to one OS account, each served with its own
    quotas) and "a legitimate client is never locked out in normal use", medium: the policy
    process refused a new worker once the *account* had 4 x per_account workers alive, but the
    front keeps up to per_account idle workers per *principal* for ever. Four principals of one
    account that each once made per_account calls at once left 16 idle workers, and every other
    principal of that account (a fifth static one, or the account's password logins) got
    HELPER_UNAVAILABLE "this account has too many workers" on each call, for as long as the front
    ran. Fixed: the bound counts the principal's own workers."""
    d = per_account_daemon
    os_user = d.accounts["alice"].name
    names = [f"share{i}" for i in range(5)]
    tokens = share_account(d, names, os_user)
    for name in names[:4]:
        results = asyncio.run(parallel_reads(d, tokens[name], readable_file, PER_ACCOUNT))
        assert not any(r.get("isError") for r in results), results
    last = asyncio.run(parallel_reads(d, tokens[names[4]], readable_file, 1))[0]
    assert not last.get("isError"), last
