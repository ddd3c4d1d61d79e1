"""Principals added to a running daemon's users.yaml, as ``mcpd users add`` does."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from mcpd.client.api import Client
from tests.conftest import Daemon
from tests.support.privsep_fixture import PrivsepDaemon


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


def add_dev_principals(d: Daemon, names: list[str]) -> dict[str, str]:
    """Add principals ``names`` (the daemon's own account, as alice and bob) to its users file
    (seen within a second): their tokens by name."""
    from mcpd.common import identity

    path = d.state_dir / "users.yaml"
    users = identity.load_users(path)
    tokens = {}
    for name in names:
        tokens[name], rec = identity.new_token()
        users[name] = identity.UserRecord(name=name, os_user=users["alice"].os_user, tokens=[rec])
    identity.save_users(path, users)
    time.sleep(1.5)
    return tokens


async def parallel_reads(d: PrivsepDaemon, token: str, path: Path, n: int) -> list[dict[str, Any]]:
    """``n`` reads of ``path`` at once in one session (each needs a worker of its own while the
    first ones start): their results."""
    async with Client(d.url, token, d.cacert, timeout=60) as c:
        return list(await asyncio.gather(*(c.call_tool("files/read", {"path": str(path)}, check=False)
                                           for _ in range(n))))
