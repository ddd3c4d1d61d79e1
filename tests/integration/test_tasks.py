"""Tool calls run as MCP tasks (docs/REFERENCE.md §2.6), on the real daemon over TLS: the
2025-11-25 session flavour (``params.task``, ``tasks/get``/``result``/``cancel``/``list``) and the
2026-07-28 extension (``io.modelcontextprotocol/tasks``: ``resultType: "task"``, ``tasks/get``
carrying the result, ``tasks/update``, ``tasks/cancel``); cancelling stops the worker's search,
the time to live ends a task, another principal's ids are not found, a principal's tasks are
bounded, and every bad input gets its JSON-RPC error."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Daemon
from tests.support.streamable import META, Rpc, client, hdrs, headers, post, request
from tests.support.tasks import (
    EXT,
    EXT_META,
    ISO,
    TASKS,
    check_task,
    hole,
    slow_daemon,
    slow_grep,
    small_tree,
    wait_gone,
    wait_worker,
)
from tests.support.workers import worker_pids

pytestmark = pytest.mark.anyio

# -- 2025-11-25 sessions ----------------------------------------------------------------------------


async def test_capabilities_and_tool_marks_by_revision(daemon: Daemon, tmp_path: Path) -> None:
    tree = small_tree(tmp_path / "t")
    async with client(daemon) as c:
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": TASKS, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
            headers=hdrs(daemon))
        caps = r.json()["result"]["capabilities"]
        assert caps["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
        rpc = Rpc(c, daemon, r.headers["mcp-session-id"], None, TASKS)
        tools = {t["name"]: t for t in (await rpc.ok("tools/list"))["tools"]}
        assert {n for n, t in tools.items() if t["execution"]["taskSupport"] == "optional"} == {"files/find",
                                                                                             "files/grep"}
        assert {t["execution"]["taskSupport"] for n, t in tools.items() if n not in ("files/find", "files/grep")} \
            == {"forbidden"}
        # Before 2025-11-25: no capability, no marks, and params.task means nothing (a plain call).
        old = await Rpc.open(c, daemon, version="2025-06-18")
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
            headers=hdrs(daemon))
        assert "tasks" not in r.json()["result"]["capabilities"]
        assert all("execution" not in t for t in (await old.ok("tools/list"))["tools"])
        plain = await old.ok("tools/call", {"name": "files/find", "arguments": {"root": str(tree), "name": "*.conf"},
                                            "task": {"ttl": 5000}})
        assert "task" not in plain and len(plain["structuredContent"]["matches"]) == 2
        assert (await old.err("tasks/get", {"taskId": "0" * 32}))["code"] == -32601


async def test_create_poll_result_list_and_failed(daemon: Daemon, tmp_path: Path) -> None:
    tree = small_tree(tmp_path / "t")
    find = {"name": "files/find", "arguments": {"root": str(tree), "name": "*.conf"}}
    async with client(daemon) as c:
        rpc = await Rpc.open(c, daemon)
        direct = await rpc.ok("tools/call", find)
        created = (await rpc.ok("tools/call", {**find, "task": {"ttl": 60000}}))["task"]
        assert created["status"] == "working"
        check_task(created, 60000)
        task_id = created["taskId"]
        done = await rpc.until_done(task_id)
        assert done["status"] == "completed" and done["taskId"] == task_id and "result" not in done
        check_task(done, 60000)
        assert done["createdAt"] == created["createdAt"]
        result = await rpc.ok("tasks/result", {"taskId": task_id})
        assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
        assert result["structuredContent"] == direct["structuredContent"]
        assert result["content"] == direct["content"]
        # tasks/result waits for a task still working: asked at once, it answers with the result.
        grep = {"name": "files/grep", "arguments": {"pattern": "port", "path": str(tree)},
                "task": {}}
        g = (await rpc.ok("tools/call", grep))["task"]
        check_task(g, 300_000)  # no ttl asked: the default
        waited = await rpc.ok("tasks/result", {"taskId": g["taskId"]})
        assert len(waited["structuredContent"]["matches"]) == 2
        # A tool error is a failed task; its result is the isError result a direct call gets.
        bad = (await rpc.ok("tools/call", {"name": "files/grep", "arguments": {"pattern": "(", "path": str(tree)},
                                           "task": {}}))["task"]
        failed = await rpc.until_done(bad["taskId"])
        assert failed["status"] == "failed" and failed["statusMessage"]
        res = await rpc.ok("tasks/result", {"taskId": bad["taskId"]})
        assert res["isError"] is True and res["structuredContent"]["error"]["code"] == "INVALID_ARGUMENT"
        # tasks/list: this principal's, newest first.
        listed = await rpc.ok("tasks/list")
        assert [t["taskId"] for t in listed["tasks"]] == [bad["taskId"], g["taskId"], task_id]
        assert "nextCursor" not in listed
        assert (await rpc.ok("tasks/list", {"cursor": "1"}))["tasks"] == []
        # Cancelling an ended task is refused.
        err = await rpc.err("tasks/cancel", {"taskId": task_id})
        assert err["code"] == -32602 and "completed" in err["message"]
        # The task is the principal's, not the session's: another session of alice reads it.
        r = await c.delete("/mcp", headers=hdrs(daemon, rpc.sid))
        assert r.status_code == 200
        again = await Rpc.open(c, daemon)
        assert (await again.ok("tasks/result", {"taskId": task_id}))["structuredContent"] == \
            direct["structuredContent"]


async def test_cancel_stops_the_workers_search(daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = slow_daemon(daemon_factory)
    path = hole(tmp_path)
    async with client(d) as c:
        rpc = await Rpc.open(c, d)
        before = worker_pids(d.pid)
        task = (await rpc.ok("tools/call", {**slow_grep(path), "task": {"ttl": 60000}}))["task"]
        busy = await wait_worker(d, before)
        await asyncio.sleep(1)  # the worker has its request and searches
        assert (await rpc.ok("tasks/get", {"taskId": task["taskId"]}))["status"] == "working"
        cancelled = await rpc.ok("tasks/cancel", {"taskId": task["taskId"]})
        assert cancelled["status"] == "cancelled" and cancelled["taskId"] == task["taskId"]
        await wait_gone(d, busy)
        assert (await rpc.ok("tasks/get", {"taskId": task["taskId"]}))["status"] == "cancelled"
        err = await rpc.err("tasks/result", {"taskId": task["taskId"]})
        assert err["code"] == -32602 and "cancelled" in err["message"]
        assert (await rpc.err("tasks/cancel", {"taskId": task["taskId"]}))["code"] == -32602
        assert (await rpc.ok("ping")) == {}


async def test_ttl_ends_the_task_and_its_work(daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = slow_daemon(daemon_factory, tasks={"max_ttl_seconds": 5, "default_ttl_seconds": 2,
                                           "poll_interval_seconds": 0.25})
    path = hole(tmp_path)
    tree = small_tree(tmp_path / "t")
    async with client(d) as c:
        rpc = await Rpc.open(c, d)
        before = worker_pids(d.pid)
        running = (await rpc.ok("tools/call", {**slow_grep(path), "task": {"ttl": 1500}}))["task"]
        check_task(running, 1500, 250)
        busy = await wait_worker(d, before)
        # tasks/result waits; the ttl ending answers it with "not found".
        waiting = asyncio.ensure_future(rpc.err("tasks/result", {"taskId": running["taskId"]}))
        quick = (await rpc.ok("tools/call", {"name": "files/find", "arguments": {"root": str(tree)},
                                             "task": {"ttl": 1000}}))["task"]
        assert (await rpc.until_done(quick["taskId"]))["status"] == "completed"
        err = await asyncio.wait_for(waiting, 10)
        assert err["code"] == -32602 and "not found" in err["message"]
        await wait_gone(d, busy, 5)  # its work stopped with it (the grep's own deadline is 30 s away)
        for task_id in (running["taskId"], quick["taskId"]):  # both freed, results and all
            assert (await rpc.err("tasks/get", {"taskId": task_id}))["code"] == -32602
        assert (await rpc.ok("tasks/list"))["tasks"] == []
        # A ttl past max_ttl_seconds is cut to it.
        long = (await rpc.ok("tools/call", {"name": "files/find", "arguments": {"root": str(tree)},
                                            "task": {"ttl": 10 ** 12}}))["task"]
        assert long["ttl"] == 5000


async def test_another_principals_task_is_not_found(daemon: Daemon, tmp_path: Path) -> None:
    tree = small_tree(tmp_path / "t")
    async with client(daemon) as c:
        alice = await Rpc.open(c, daemon)
        bob = await Rpc.open(c, daemon, token=daemon.other_token)
        task = (await alice.ok("tools/call", {"name": "files/find", "arguments": {"root": str(tree)},
                                              "task": {}}))["task"]
        await alice.until_done(task["taskId"])
        for method in ("tasks/get", "tasks/result", "tasks/cancel"):
            err = await bob.err(method, {"taskId": task["taskId"]})
            assert err["code"] == -32602 and "not found" in err["message"]
        assert (await bob.ok("tasks/list"))["tasks"] == []
        # nor is it found from the stateless era, even by alice: a task lives in its own revision
        r = await post(c, daemon, request("tasks/get", {"taskId": task["taskId"]}, meta=EXT_META))
        assert r.json()["error"]["code"] == -32602
        assert (await alice.ok("tasks/get", {"taskId": task["taskId"]}))["status"] == "completed"


async def test_tasks_per_principal_are_bounded(daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = slow_daemon(daemon_factory, tasks={"max_per_principal": 2})
    path = hole(tmp_path)
    tree = small_tree(tmp_path / "t")
    async with client(d) as c:
        rpc = await Rpc.open(c, d)
        ids = [(await rpc.ok("tools/call", {**slow_grep(path), "task": {}}))["task"]["taskId"] for _ in range(2)]
        err = await rpc.err("tools/call", {"name": "files/find", "arguments": {"root": str(tree)}, "task": {}})
        assert err["code"] == -32000 and err["data"] == {"maxTasks": 2}
        # A cancelled task still counts until its ttl ends.
        await rpc.ok("tasks/cancel", {"taskId": ids[0]})
        assert (await rpc.err("tools/call", {"name": "files/find", "arguments": {"root": str(tree)},
                                             "task": {}}))["code"] == -32000
        # A plain call is not bounded by it, and the bound is per principal.
        assert (await rpc.ok("tools/call", {"name": "files/find", "arguments": {"root": str(tree)}}))["content"]
        bob = await Rpc.open(c, d, token=d.other_token)
        assert (await bob.ok("tools/call", {"name": "files/find", "arguments": {"root": str(tree)},
                                            "task": {}}))["task"]["status"] == "working"
        # In the stateless era, past the bound the call is served as a plain one.
        call = request("tools/call", {"name": "files/find", "arguments": {"root": str(tree)}}, meta=EXT_META)
        r = await post(c, d, call)
        assert r.json()["result"]["resultType"] == "complete" and r.json()["result"]["structuredContent"]["matches"]
        await rpc.ok("tasks/cancel", {"taskId": ids[1]})


@pytest.mark.parametrize(("method", "params", "code"), [
    ("tools/call", {"name": "files/find", "arguments": {"root": "/"}, "task": "yes"}, -32602),
    ("tools/call", {"name": "files/find", "arguments": {"root": "/"}, "task": None}, -32602),
    ("tools/call", {"name": "files/find", "arguments": {"root": "/"}, "task": {"ttl": 0}}, -32602),
    ("tools/call", {"name": "files/find", "arguments": {"root": "/"}, "task": {"ttl": -5}}, -32602),
    ("tools/call", {"name": "files/find", "arguments": {"root": "/"}, "task": {"ttl": 1.5}}, -32602),
    ("tools/call", {"name": "files/find", "arguments": {"root": "/"}, "task": {"ttl": "60000"}}, -32602),
    ("tools/call", {"name": "files/find", "arguments": {"root": "/"}, "task": {"ttl": True}}, -32602),
    ("tools/call", {"name": "files/read", "arguments": {"path": "/etc/hostname"}, "task": {}}, -32601),
    ("tools/call", {"name": "files/nope", "arguments": {}, "task": {}}, -32602),
    ("tasks/get", {}, -32602),
    ("tasks/get", {"taskId": 7}, -32602),
    ("tasks/get", {"taskId": ""}, -32602),
    ("tasks/get", {"taskId": "x" * 129}, -32602),
    ("tasks/get", {"taskId": "0" * 32}, -32602),
    ("tasks/result", {"taskId": "0" * 32}, -32602),
    ("tasks/cancel", {"taskId": None}, -32602),
    ("tasks/list", {"cursor": "abc"}, -32602),
    ("tasks/list", {"cursor": 5}, -32602),
    ("tasks/update", {"taskId": "0" * 32, "inputResponses": {}}, -32601),
])
async def test_bad_input_gets_its_error(daemon: Daemon, method: str, params: dict[str, Any], code: int) -> None:
    async with client(daemon) as c:
        rpc = await Rpc.open(c, daemon)
        err = await rpc.err(method, params)
        assert err["code"] == code and err["message"]


# -- 2026-07-28: the tasks extension ---------------------------------------------------------------


async def modern(c: httpx.AsyncClient, d: Daemon, method: str, params: dict[str, Any],
                 meta: dict[str, Any] = EXT_META, **override: str | None) -> dict[str, Any]:
    body = request(method, params, meta=meta)
    r = await c.post("/mcp", json=body, headers=headers(d, body, **override))
    reply: dict[str, Any] = r.json()
    return reply


async def test_extension_task_polled_to_its_result(daemon: Daemon, tmp_path: Path) -> None:
    tree = small_tree(tmp_path / "t")
    find = {"name": "files/find", "arguments": {"root": str(tree), "name": "*.conf"}}
    async with client(daemon) as c:
        plain = (await modern(c, daemon, "tools/call", find, META))["result"]  # no extension: a plain result
        assert plain["resultType"] == "complete" and len(plain["structuredContent"]["matches"]) == 2
        created = (await modern(c, daemon, "tools/call", find))["result"]
        assert created["resultType"] == "task" and created["status"] == "working"
        assert (created["ttlMs"], created["pollIntervalMs"]) == (300_000, 1000) and "ttl" not in created
        assert ISO.fullmatch(created["createdAt"])
        task_id = created["taskId"]
        for _ in range(200):
            got = (await modern(c, daemon, "tasks/get", {"taskId": task_id}))["result"]
            if got["status"] != "working":
                break
            await asyncio.sleep(0.05)
        assert got["status"] == "completed" and got["resultType"] == "complete"
        assert got["result"]["structuredContent"] == plain["structuredContent"]
        # A tool error completes the task (this revision's rule), its result the isError one.
        bad = (await modern(c, daemon, "tools/call", {"name": "files/grep",
                                                      "arguments": {"pattern": "(", "path": str(tree)}}))["result"]
        for _ in range(200):
            got = (await modern(c, daemon, "tasks/get", {"taskId": bad["taskId"]}))["result"]
            if got["status"] != "working":
                break
            await asyncio.sleep(0.05)
        assert got["status"] == "completed" and got["result"]["isError"] is True
        # tasks/update is acknowledged (these tasks never ask for input); tasks/cancel of an ended task too.
        upd = await modern(c, daemon, "tasks/update", {"taskId": task_id, "inputResponses": {"k": {}}})
        assert upd["result"]["resultType"] == "complete" and set(upd["result"]) == {"resultType", "_meta"}
        assert (await modern(c, daemon, "tasks/cancel", {"taskId": task_id}))["result"]["resultType"] == "complete"
        assert (await modern(c, daemon, "tasks/get", {"taskId": task_id}))["result"]["status"] == "completed"
        # Other tools never become tasks.
        f = tree / "a.conf"
        read = (await modern(c, daemon, "tools/call", {"name": "files/read", "arguments": {"path": str(f)}}))
        assert read["result"]["resultType"] == "complete"
        # Bob cannot see alice's task.
        body = request("tasks/get", {"taskId": task_id}, meta=EXT_META)
        r = await c.post("/mcp", json=body, headers=headers(daemon, body, Authorization=f"Bearer {daemon.other_token}"))
        assert r.json()["error"]["code"] == -32602


async def test_extension_cancel_stops_the_work(daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = slow_daemon(daemon_factory)
    path = hole(tmp_path)
    async with client(d) as c:
        before = worker_pids(d.pid)
        created = (await modern(c, d, "tools/call", slow_grep(path)))["result"]
        assert created["resultType"] == "task"
        busy = await wait_worker(d, before)
        await asyncio.sleep(1)
        ack = await modern(c, d, "tasks/cancel", {"taskId": created["taskId"]})
        assert ack["result"]["resultType"] == "complete"
        await wait_gone(d, busy)
        got = (await modern(c, d, "tasks/get", {"taskId": created["taskId"]}))["result"]
        assert got["status"] == "cancelled" and "result" not in got and "error" not in got


@pytest.mark.parametrize(("method", "params", "meta", "override", "status", "code"), [
    ("tasks/get", {"taskId": "0" * 32}, META, {}, 200, -32021),       # the extension not declared
    ("tasks/cancel", {"taskId": "0" * 32}, META, {}, 200, -32021),
    ("tasks/update", {"taskId": "0" * 32, "inputResponses": {}}, META, {}, 200, -32021),
    ("tasks/get", {"taskId": "0" * 32}, EXT_META, {}, 200, -32602),   # unknown id
    ("tasks/get", {"taskId": 3}, EXT_META, {"Mcp_Name": "3"}, 400, -32020),  # Mcp-Name must equal a string id
    ("tasks/get", {"taskId": "0" * 32}, EXT_META, {"Mcp_Name": None}, 400, -32020),
    ("tasks/get", {"taskId": "0" * 32}, EXT_META, {"Mcp_Name": "1" * 32}, 400, -32020),
    ("tasks/update", {"taskId": "0" * 32, "inputResponses": []}, EXT_META, {}, 200, -32602),
    ("tasks/list", {}, EXT_META, {}, 404, -32601),                    # not part of this revision
    ("tasks/result", {"taskId": "0" * 32}, EXT_META, {}, 404, -32601),
])
async def test_extension_errors(daemon: Daemon, method: str, params: dict[str, Any], meta: dict[str, Any],
                                override: dict[str, str | None], status: int, code: int) -> None:
    async with client(daemon) as c:
        body = request(method, params, meta=meta)
        r = await c.post("/mcp", json=body, headers=headers(daemon, body, **override))
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["code"] == code
        if code == -32021:
            assert err["data"] == {"requiredCapabilities": {"extensions": {EXT: {}}}}


async def test_results_held_are_bounded_in_bytes(daemon: Daemon, daemon_factory: Callable[..., Daemon],
                                                 tmp_path: Path) -> None:
    from mcpd.front.mcp.jsonrpc import approx_size

    tree = small_tree(tmp_path / "t")
    find = {"name": "files/find", "arguments": {"root": str(tree)}}
    async with client(daemon) as c:
        size = approx_size(await (await Rpc.open(c, daemon)).ok("tools/call", find))
    d = daemon_factory(tasks={"max_result_bytes": size * 3 // 2})
    async with client(d) as c:
        rpc = await Rpc.open(c, d)
        first = (await rpc.ok("tools/call", {**find, "task": {"ttl": 1500}}))["task"]["taskId"]
        assert (await rpc.until_done(first))["status"] == "completed"
        second = (await rpc.ok("tools/call", {**find, "task": {}}))["task"]["taskId"]
        assert (await rpc.until_done(second))["status"] == "failed"
        err = (await rpc.ok("tasks/result", {"taskId": second}))["structuredContent"]["error"]
        assert err["code"] == "FILE_TOO_LARGE" and err["details"] == {"size": size, "limit": size * 3 // 2 - size, "suggestion": err["details"]["suggestion"]}
        await asyncio.sleep(2)  # the first task's ttl ends: its bytes are freed
        third = (await rpc.ok("tools/call", {**find, "task": {}}))["task"]["taskId"]
        assert (await rpc.until_done(third))["status"] == "completed"
