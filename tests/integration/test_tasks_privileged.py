"""Privileged calls run as MCP tasks (docs/REFERENCE.md §2.6) go the privileged route of a direct
call (§4.1): the policy process decides them against the grants and writes their audit record,
naming the session that made the task; a call no grant covers is refused as a direct one is."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.audit import wait_for_record
from tests.support.privsep_fixture import PrivsepDaemon, privsep_daemon  # noqa: F401  (fixture)
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


async def run_task(rpc: Rpc, args: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ended task of a privileged files/find, and its result."""
    created = (await rpc.ok("tools/call", {"name": "files/find", "arguments": {**args, "privileged": True},
                                           "task": {"ttl": 60000}}))["task"]
    ended = await rpc.until_done(created["taskId"])
    return ended, await rpc.ok("tasks/result", {"taskId": created["taskId"]})


async def test_a_privileged_find_task_is_decided_and_audited(find_granted: PrivsepDaemon) -> None:
    d = find_granted
    view = as_daemon(d)
    before = len(d.audit())
    async with client(view) as c:
        alice = await Rpc.open(c, view)
        ended, result = await run_task(alice, {"root": str(d.app), "name": d.log_file.name})
        assert ended["status"] == "completed", ended
        assert [m["path"] for m in result["structuredContent"]["matches"]] == [str(d.log_file)]  # a root-only file
        rec = wait_for_record(d, lambda r: r.get("tool") == "files/find" and r.get("user") == "alice"
                              and r.get("seq", 0) > before)
        assert rec["decision"] == "accept" and rec["route"] == "privileged" and rec["session"] == alice.sid
        # bob has no grant: his task ends as his direct call would, refused, and audited so.
        bob = await Rpc.open(c, view, token=d.tokens["bob"])
        ended, result = await run_task(bob, {"root": str(d.app)})
        assert ended["status"] == "failed" and result["isError"] is True
        assert result["structuredContent"]["error"]["code"] == "PERMISSION_DENIED"
        rec = wait_for_record(d, lambda r: r.get("tool") == "files/find" and r.get("user") == "bob"
                              and r.get("seq", 0) > before)
        assert rec["decision"] == "reject" and rec["session"] == bob.sid
