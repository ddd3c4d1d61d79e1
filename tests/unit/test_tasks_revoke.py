"""``TaskStore.revoke`` and ``TaskStore.working`` (docs/REFERENCE.md §2.6): a refused token stops
the working tasks it made, and only those; any token text is compared without raising."""

from __future__ import annotations

import asyncio

from mcpd.front.mcp.tasks import Task, TaskStore


def test_revoke_stops_only_the_working_tasks_of_that_owner_and_token() -> None:
    async def go() -> None:
        store = TaskStore(run=None)  # type: ignore[arg-type]  (no call is made here)
        loop = asyncio.get_running_loop()
        tasks = {
            "mine": Task("mine", "alice", False, 1, 0.0, 60000, token="tök-1", token_id="a1"),
            "other token": Task("other token", "alice", False, 2, 0.0, 60000, token="tok-2", token_id="a2"),
            "other owner": Task("other owner", "bob", False, 3, 0.0, 60000, token="tök-1", token_id="b1"),
            "ended": Task("ended", "alice", False, 4, 0.0, 60000, status="completed", token="tök-1", token_id="a1"),
        }
        for task in tasks.values():
            task.runner = loop.create_task(asyncio.sleep(60))
            store._tasks[task.task_id] = task
        assert sorted(store.working()) == [("tok-2", "alice", "a2"), ("tök-1", "alice", "a1"),
                                           ("tök-1", "bob", "b1")]
        assert store.revoke("alice", "x\udc80") == 0  # (not a token anyone holds: nothing, no error)
        assert store.revoke("alice", "tök-1") == 1
        await asyncio.sleep(0)
        assert tasks["mine"].status == "cancelled" and "revoked" in (tasks["mine"].message or "")
        assert tasks["mine"].runner is not None and tasks["mine"].runner.cancelled()
        assert [t.status for k, t in tasks.items() if k != "mine"] == ["working", "working", "completed"]
        assert ("tök-1", "alice", "a1") not in store.working()
        for task in tasks.values():
            assert task.runner is not None
            task.runner.cancel()

    asyncio.run(go())
