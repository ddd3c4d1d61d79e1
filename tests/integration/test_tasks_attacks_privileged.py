"""Attacks on privileged calls run as MCP tasks (docs/REFERENCE.md §2.6, §4.1), on the real
privilege-separated daemon: a hung privileged find run as a task is stopped by ``tasks/cancel``
and by revoking the token that made it, leaves its record under the identity and session that
made it, and another principal can neither see nor stop it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mcpd.common import identity
from tests.support.audit import wait_for_record
from tests.support.privsep_fixture import HungWalks, PrivsepDaemon, privsep_daemon  # noqa: F401  (fixture)
from tests.support.streamable import Rpc, as_daemon, client

pytestmark = [pytest.mark.root, pytest.mark.anyio]


@pytest.fixture
def find_granted(privsep_daemon: PrivsepDaemon) -> Iterator[PrivsepDaemon]:  # noqa: F811
    """alice may also find in ``app`` (restored to the fixture's grants afterwards)."""
    d = privsep_daemon
    tools = {t: {"allowed": True, "paths": [str(d.app)]} for t in ("files/read", "files/list", "files/find")}
    d.write_grants({"users": {d.accounts["alice"].name: {"privileged": {"tools": tools}}}})
    time.sleep(1.0)  # the helper re-reads the grants file when it changes
    try:
        yield d
    finally:
        d.write_grants(d.default_grants())
        time.sleep(1.0)


def access(d: PrivsepDaemon) -> list[dict[str, Any]]:
    if not d.access_path.exists():
        return []
    return [json.loads(line) for line in d.access_path.read_text().splitlines() if line.strip()]


async def until(check: Any, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the condition never held")


HUNG = {"name": "files/find", "task": {"ttl": 120000}}
#: the hung finds' time budget (s): root kills a hung walker at its call's deadline, cancelled or
#: not (a direct call's too), so that is how long it may outlive its task
BUDGET = 4


async def test_a_hung_privileged_task_is_stopped_by_cancel_and_recorded_as_its_maker(
        find_granted: PrivsepDaemon) -> None:
    d = find_granted
    view = as_daemon(d)
    with HungWalks(d):
        async with client(view) as c:
            alice = await Rpc.open(c, view)
            bob = await Rpc.open(c, view, token=d.tokens["bob"])
            before = set(d.walkers())
            task_id = (await alice.ok("tools/call", {**HUNG, "arguments": {
                "root": str(d.app), "privileged": True, "time_budget_seconds": BUDGET}}))["task"]["taskId"]
            await until(lambda: set(d.walkers()) - before)
            walker = set(d.walkers()) - before
            for method in ("tasks/cancel", "tasks/result"):  # bob neither stops nor reads it
                assert (await bob.err(method, {"taskId": task_id}))["code"] == -32602
            assert (await alice.ok("tasks/get", {"taskId": task_id}))["status"] == "working"
            seen = len(d.audit())
            assert (await alice.ok("tasks/cancel", {"taskId": task_id}))["status"] == "cancelled"
            await until(lambda: not walker & set(d.walkers()), BUDGET + 8)  # by its deadline at the latest
            # the policy process recorded the call as alice's, from the session that made the task
            rec = wait_for_record(d, lambda r: r.get("tool") == "files/find" and r.get("session") == alice.sid
                                  and r.get("seq", 0) > seen)
            assert (rec["user"], rec["route"], rec["decision"]) == ("alice", "privileged", "accept"), rec
            assert not [r for r in access(d) if r.get("session") == bob.sid and r.get("tool") == "files/find"]


async def test_revoking_the_token_stops_its_hung_privileged_task(find_granted: PrivsepDaemon) -> None:
    d = find_granted
    view = as_daemon(d)
    users_file = d.state_dir / "users.yaml"
    with HungWalks(d):
        async with client(view) as c:
            alice = await Rpc.open(c, view)
            before = set(d.walkers())
            task_id = (await alice.ok("tools/call", {**HUNG, "arguments": {
                "root": str(d.app), "privileged": True, "time_budget_seconds": BUDGET}}))["task"]["taskId"]
            await until(lambda: set(d.walkers()) - before)
            walker = set(d.walkers()) - before
            users = identity.load_users(users_file)
            plain, rec = identity.new_token()
            old = users["alice"]
            users["alice"] = identity.UserRecord(name="alice", os_user=old.os_user, tokens=[rec])
            try:
                identity.save_users(users_file, users)
                fresh = await Rpc.open(c, view, token=plain)
                for _ in range(100):  # the front may take the old token for 2 s more (its cache)
                    ended = await fresh.ok("tasks/get", {"taskId": task_id})
                    if ended["status"] != "working":
                        break
                    await asyncio.sleep(0.1)
                assert ended["status"] == "cancelled" and "revoked" in ended["statusMessage"], ended
                await until(lambda: not walker & set(d.walkers()), BUDGET + 8)
            finally:
                users["alice"] = old
                identity.save_users(users_file, users)
