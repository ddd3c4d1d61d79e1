"""Attacks on MCP tasks (docs/REFERENCE.md §2.6), on the real daemon over TLS: reaching another
principal's task, hostile ``task``/``ttl``/``taskId``/``cursor`` values, outliving the bounds,
cancel and result races, holding slots with ``tasks/result``, and a token revoked while its
tasks work. Each test names the behaviour it holds the daemon to."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mcpd.common import identity
from tests.conftest import Daemon, tree_rss_kib
from tests.support.streamable import Rpc, client, hdrs, post, request
from tests.support.tasks import EXT_META, hole, slow_daemon, slow_grep, small_tree, wait_gone, wait_worker
from tests.support.workers import worker_pids

pytestmark = pytest.mark.anyio

TASKS = "2025-11-25"


def find(tree: Path, **task: Any) -> dict[str, Any]:
    return {"name": "files/find", "arguments": {"root": str(tree)}, "task": task}


async def raw(rpc: Rpc, text: str) -> dict[str, Any]:
    """POST ``text`` as it is (JSON the client library would not write) on ``rpc``'s session; its
    reply (a body that is not JSON is ``400`` with the parse error)."""
    r = await rpc.c.post("/mcp", content=text.encode(), headers=hdrs(rpc.d, rpc.sid, token=rpc.token,
                                                                      **{"MCP-Protocol-Version": rpc.version}))
    reply: dict[str, Any] = r.json()
    assert r.status_code == (400 if reply.get("error", {}).get("code") == -32700 else 200), r.text
    return reply


# -- another principal's task --------------------------------------------------------------------


async def test_another_principal_can_neither_cancel_nor_wait_on_nor_see_a_running_task(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = slow_daemon(daemon_factory)
    path = hole(tmp_path)
    async with client(d) as c:
        alice = await Rpc.open(c, d)
        bob = await Rpc.open(c, d, token=d.other_token)
        bob2 = await Rpc.open(c, d, token=d.other_token)
        before = worker_pids(d.pid)
        task_id = (await alice.ok("tools/call", {**slow_grep(path), "task": {"ttl": 60000}}))["task"]["taskId"]
        await wait_worker(d, before)
        never = "f" * 32
        for who in (bob, bob2):
            for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                theirs = await who.err(method, {"taskId": task_id})
                unknown = await who.err(method, {"taskId": never})
                assert theirs == unknown  # "someone else's" reads exactly as "never existed"
            assert (await who.ok("tasks/list"))["tasks"] == []
        # the stateless era, bob declaring the extension: not found, not cancelled
        for method in ("tasks/get", "tasks/cancel", "tasks/update"):
            params: dict[str, Any] = {"taskId": task_id}
            if method == "tasks/update":
                params["inputResponses"] = {}
            body = request(method, params, meta=EXT_META)
            r = await post(c, d, body, Authorization=f"Bearer {d.other_token}")
            assert r.json()["error"]["code"] == -32602, r.text
        # alice's task still works, untouched by every attempt
        assert (await alice.ok("tasks/get", {"taskId": task_id}))["status"] == "working"
        assert (await alice.ok("tasks/cancel", {"taskId": task_id}))["status"] == "cancelled"


async def test_the_other_revision_of_the_same_principal_cannot_cancel_a_task(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    daemon = daemon_factory()  # (its own: the shared daemon's alice keeps her tasks from other tests)
    tree = small_tree(tmp_path / "t")
    async with client(daemon) as c:
        alice = await Rpc.open(c, daemon)
        r = await post(c, daemon, request("tools/call", {"name": "files/find", "arguments": {"root": str(tree)}},
                                          meta=EXT_META))
        modern_id = r.json()["result"]["taskId"]
        # a 2025-11-25 session of the same principal does not reach the stateless task
        assert (await alice.err("tasks/cancel", {"taskId": modern_id}))["code"] == -32602
        assert (await alice.err("tasks/result", {"taskId": modern_id}))["code"] == -32602
        assert modern_id not in [t["taskId"] for t in (await alice.ok("tasks/list"))["tasks"]]


# -- hostile values ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cursor", ["²", "١٢", "１", "-1", " 1", "1 ", "", "9" * 21, "1e3"])
async def test_a_cursor_of_non_ascii_digits_or_not_a_number_is_invalid_params(daemon: Daemon, cursor: str) -> None:
    async with client(daemon) as c:
        rpc = await Rpc.open(c, daemon)
        err = await rpc.err("tasks/list", {"cursor": cursor})
        assert err["code"] == -32602 and err["message"] == "invalid cursor", err


@pytest.mark.parametrize("text", [
    '{"ttl": NaN}', '{"ttl": Infinity}', '{"ttl": -Infinity}', '{"ttl": 1e400}', '{"ttl": 5.0}', '{"ttl": -0}',
    '{"ttl": 0}', '{"ttl": true}', '{"ttl": "5000"}', '{"ttl": null}', '{"ttl": [1]}', '[]', 'null', '"x"', '7',
])
async def test_a_hostile_task_value_is_invalid_params_and_starts_nothing(daemon: Daemon, tmp_path: Path,
                                                                          text: str) -> None:
    tree = small_tree(tmp_path / "t")
    async with client(daemon) as c:
        rpc = await Rpc.open(c, daemon)
        kept = (await rpc.ok("tasks/list"))["tasks"]
        body = ('{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "files/find", '
                f'"arguments": {{"root": "{tree}"}}, "task": {text}}}}}')
        reply = await raw(rpc, body)
        assert reply["error"]["code"] in (-32602, -32700), reply  # (NaN, Infinity: not JSON)
        assert (await rpc.ok("tasks/list"))["tasks"] == kept
        assert await rpc.ok("ping") == {}


async def test_a_ttl_of_thousands_of_digits_is_cut_to_the_maximum(daemon_factory: Callable[..., Daemon],
                                                                  tmp_path: Path) -> None:
    daemon = daemon_factory()
    tree = small_tree(tmp_path / "t")
    async with client(daemon) as c:
        rpc = await Rpc.open(c, daemon)
        for digits in (40, 400):
            reply = await raw(rpc, '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": '
                              f'"files/find", "arguments": {{"root": "{tree}"}}, "task": {{"ttl": 1{"0" * digits}}}}}}}')
            assert reply["result"]["task"]["ttl"] == 3_600_000, reply
        # thousands of digits: the request is refused as a whole, a parse error, never a crash
        for digits in (4000, 5000):
            reply = await raw(rpc, '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": '
                              f'"files/find", "arguments": {{"root": "{tree}"}}, "task": {{"ttl": 1{"0" * digits}}}}}}}')
            assert "error" in reply or reply["result"]["task"]["ttl"] == 3_600_000, reply
        assert len((await rpc.ok("tasks/list"))["tasks"]) <= 4
        assert await rpc.ok("ping") == {}


@pytest.mark.parametrize("task_id", [None, 7, 7.5, True, [], {}, "", "x" * 129, "é" * 129, "\u0000",
                                     "🙂" * 40, "../" * 10, "0" * 32])
async def test_a_hostile_task_id_is_invalid_params(daemon: Daemon, task_id: Any) -> None:
    async with client(daemon) as c:
        rpc = await Rpc.open(c, daemon)
        for method in ("tasks/get", "tasks/result", "tasks/cancel"):
            err = await rpc.err(method, {"taskId": task_id})
            assert err["code"] == -32602, err
        assert await rpc.ok("ping") == {}


async def test_a_lone_surrogate_task_id_in_raw_json_is_answered(daemon: Daemon) -> None:
    async with client(daemon) as c:
        rpc = await Rpc.open(c, daemon)
        reply = await raw(rpc, '{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": "\\ud800"}}')
        assert reply["error"]["code"] == -32602, reply
        reply = await raw(rpc, '{"jsonrpc": "2.0", "id": 2, "method": "tasks/list", "params": {"cursor": "\\udfff"}}')
        assert reply["error"]["code"] == -32602, reply
        assert await rpc.ok("ping") == {}


# -- bounds -------------------------------------------------------------------------------------------


async def test_tasks_never_polled_are_freed_by_their_ttl_and_free_their_places(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = daemon_factory(tasks={"max_per_principal": 3, "default_ttl_seconds": 1, "max_ttl_seconds": 1})
    tree = small_tree(tmp_path / "t")
    async with client(d) as c:
        rpc = await Rpc.open(c, d)
        for _ in range(3):  # asks for an hour, gets the maximum: one second
            assert (await rpc.ok("tools/call", find(tree, ttl=3_600_000)))["task"]["ttl"] == 1000
        assert (await rpc.err("tools/call", find(tree)))["code"] == -32000
        await asyncio.sleep(1.5)
        assert (await rpc.ok("tasks/list"))["tasks"] == []
        assert "task" in await rpc.ok("tools/call", find(tree))  # the places came back


async def test_tasks_created_faster_than_they_end_stop_at_the_bound_and_others_are_served(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = slow_daemon(daemon_factory, tasks={"max_per_principal": 6})
    path = hole(tmp_path)
    tree = small_tree(tmp_path / "t")
    async with client(d) as c:
        alice = await Rpc.open(c, d)
        replies = await asyncio.gather(*(alice("tools/call", {**slow_grep(path), "task": {}}) for _ in range(20)))
        made = [r["result"]["task"]["taskId"] for r in replies if "result" in r]
        assert len(made) == 6 and all(r["error"]["code"] == -32000 for r in replies if "error" in r)
        # bob (the same OS account here) is served at once: alice's tasks hold her workers, not his
        bob = await Rpc.open(c, d, token=d.other_token)
        started = time.monotonic()
        got = await bob.ok("tools/call", {"name": "files/find", "arguments": {"root": str(tree), "name": "*.conf"}})
        assert len(got["structuredContent"]["matches"]) == 2 and time.monotonic() - started < 2.5
        for task_id in made:
            await alice.ok("tasks/cancel", {"taskId": task_id})


async def test_waiting_tasks_results_hold_no_slot_of_other_sessions_or_principals(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = slow_daemon(daemon_factory, max_in_flight=4)
    path = hole(tmp_path)
    tree = small_tree(tmp_path / "t")
    async with client(d) as c:
        alice = await Rpc.open(c, d)
        ids = [(await alice.ok("tools/call", {**slow_grep(path), "task": {}}))["task"]["taskId"] for _ in range(2)]
        # alice's session fills its requests in flight with waits on her two tasks
        waits = [asyncio.ensure_future(alice("tasks/result", {"taskId": ids[i % 2]})) for i in range(4)]
        await asyncio.sleep(0.5)
        other = await Rpc.open(c, d)  # her other session, and bob, are not held by them
        bob = await Rpc.open(c, d, token=d.other_token)
        for rpc in (other, bob):
            got = await asyncio.wait_for(rpc.ok("tools/call", {"name": "files/find",
                                                               "arguments": {"root": str(tree)}}), 5)
            assert "isError" not in got
        assert (await asyncio.wait_for(other.ok("tasks/cancel", {"taskId": ids[0]}), 5))["status"] == "cancelled"
        await other.ok("tasks/cancel", {"taskId": ids[1]})
        for reply in await asyncio.wait_for(asyncio.gather(*waits), 10):
            assert reply["error"]["code"] == -32602 and "cancelled" in reply["error"]["message"]


# -- races ----------------------------------------------------------------------------------------------


async def test_racing_cancels_and_results_agree_on_one_outcome(daemon_factory: Callable[..., Daemon],
                                                              tmp_path: Path) -> None:
    d = slow_daemon(daemon_factory)
    path = hole(tmp_path)
    async with client(d) as c:
        rpc = await Rpc.open(c, d)
        before = worker_pids(d.pid)
        task_id = (await rpc.ok("tools/call", {**slow_grep(path), "task": {}}))["task"]["taskId"]
        busy = await wait_worker(d, before)
        results = [asyncio.ensure_future(rpc("tasks/result", {"taskId": task_id})) for _ in range(3)]
        cancels = await asyncio.gather(*(rpc("tasks/cancel", {"taskId": task_id}) for _ in range(8)))
        assert sum("result" in r for r in cancels) == 1, cancels  # one cancel wins, the others find it ended
        assert all(r["error"]["code"] == -32602 and "terminal" in r["error"]["message"]
                   for r in cancels if "error" in r)
        for reply in await asyncio.wait_for(asyncio.gather(*results), 10):
            assert reply["error"]["code"] == -32602 and "cancelled" in reply["error"]["message"]
        await wait_gone(d, busy)
        assert (await rpc.ok("tasks/get", {"taskId": task_id}))["status"] == "cancelled"


async def test_a_closed_session_leaves_its_task_running_for_its_principal_only(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = slow_daemon(daemon_factory)
    path = hole(tmp_path)
    async with client(d) as c:
        rpc = await Rpc.open(c, d)
        before = worker_pids(d.pid)
        task_id = (await rpc.ok("tools/call", {**slow_grep(path), "task": {}}))["task"]["taskId"]
        busy = await wait_worker(d, before)
        assert (await c.delete("/mcp", headers=hdrs(d, rpc.sid))).status_code == 200
        again = await Rpc.open(c, d)
        assert (await again.ok("tasks/get", {"taskId": task_id}))["status"] == "working"
        assert busy & worker_pids(d.pid)
        bob = await Rpc.open(c, d, token=d.other_token)
        assert (await bob.err("tasks/get", {"taskId": task_id}))["code"] == -32602
        await again.ok("tasks/cancel", {"taskId": task_id})
        await wait_gone(d, busy)


# -- revocation -----------------------------------------------------------------------------------------


async def test_revoking_the_token_stops_the_work_of_its_tasks(daemon_factory: Callable[..., Daemon],
                                                              tmp_path: Path) -> None:
    d = slow_daemon(daemon_factory)
    path = hole(tmp_path)
    async with client(d) as c:
        rpc = await Rpc.open(c, d)
        before = worker_pids(d.pid)
        task_id = (await rpc.ok("tools/call", {**slow_grep(path), "task": {"ttl": 60000}}))["task"]["taskId"]
        busy = await wait_worker(d, before)
        users_file = d.state_dir / "users.yaml"
        users = identity.load_users(users_file)
        plain, rec = identity.new_token()
        users["alice"] = identity.UserRecord(name="alice", os_user=users["alice"].os_user, tokens=[rec])
        identity.save_users(users_file, users)  # alice's token is rotated: the old one is revoked
        # its session is closed within a second or two, and so must its task's work end (the
        # grep's own deadline is 30 s away)
        await wait_gone(d, busy, 6)
        fresh = Rpc(c, d, (await Rpc.open(c, d, token=plain)).sid, plain, TASKS)
        ended = await fresh.ok("tasks/get", {"taskId": task_id})  # the principal's new token reads it
        assert ended["status"] == "cancelled" and "revoked" in ended["statusMessage"], ended


def rotate_alice(d: Daemon) -> str:
    """Give alice a new token in ``users.yaml``, revoking her old one; the new one's plain text."""
    users_file = d.state_dir / "users.yaml"
    users = identity.load_users(users_file)
    plain, rec = identity.new_token()
    users["alice"] = identity.UserRecord(name="alice", os_user=users["alice"].os_user, tokens=[rec])
    identity.save_users(users_file, users)
    return plain


@pytest.mark.parametrize("made", ["closed session", "stateless request"])
async def test_revoking_the_token_stops_its_tasks_without_an_open_session(
        daemon_factory: Callable[..., Daemon], tmp_path: Path, made: str) -> None:
    d = slow_daemon(daemon_factory)
    path = hole(tmp_path)
    async with client(d) as c:
        before = worker_pids(d.pid)
        if made == "closed session":
            rpc = await Rpc.open(c, d)
            task_id = (await rpc.ok("tools/call", {**slow_grep(path), "task": {"ttl": 60000}}))["task"]["taskId"]
            assert (await c.delete("/mcp", headers=hdrs(d, rpc.sid))).status_code == 200
        else:
            r = await post(c, d, request("tools/call", slow_grep(path), meta=EXT_META))
            task_id = r.json()["result"]["taskId"]
        busy = await wait_worker(d, before)
        plain = rotate_alice(d)
        await wait_gone(d, busy, 6)  # no session holds the token: the task's own must be checked
        if made == "closed session":
            fresh = await Rpc.open(c, d, token=plain)
            ended = await fresh.ok("tasks/get", {"taskId": task_id})
        else:
            body = request("tasks/get", {"taskId": task_id}, meta=EXT_META)
            ended = (await post(c, d, body, Authorization=f"Bearer {plain}")).json()["result"]
        assert ended["status"] == "cancelled" and "revoked" in ended["statusMessage"], ended


async def test_another_principal_cannot_reach_a_stateless_task(daemon_factory: Callable[..., Daemon],
                                                               tmp_path: Path) -> None:
    d = slow_daemon(daemon_factory)
    path = hole(tmp_path)
    async with client(d) as c:
        before = worker_pids(d.pid)
        r = await post(c, d, request("tools/call", slow_grep(path), meta=EXT_META))
        task_id = r.json()["result"]["taskId"]
        await wait_worker(d, before)
        bob = f"Bearer {d.other_token}"
        for method, extra in (("tasks/get", {}), ("tasks/cancel", {}), ("tasks/update", {"inputResponses": {}})):
            theirs = await post(c, d, request(method, {"taskId": task_id, **extra}, meta=EXT_META), Authorization=bob)
            unknown = await post(c, d, request(method, {"taskId": "e" * 32, **extra}, meta=EXT_META),
                                 Authorization=bob)
            assert theirs.status_code == unknown.status_code and theirs.json() == unknown.json()
            assert theirs.json()["error"]["code"] == -32602
        # the Mcp-Name header must name the task asked for: one name in the header, another in the body
        body = request("tasks/cancel", {"taskId": task_id}, meta=EXT_META)
        r = await post(c, d, body, **{"Mcp-Name": "e" * 32})
        assert r.status_code == 400 and r.json()["error"]["code"] == -32020
        r = await post(c, d, request("tasks/get", {"taskId": task_id}, meta=EXT_META))
        assert r.json()["result"]["status"] == "working"
        assert "error" not in (await post(c, d, body)).json()


async def test_tasks_list_pages_hold_each_task_once_and_only_the_callers(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = daemon_factory(tasks={"max_per_principal": 60})
    tree = small_tree(tmp_path / "t")
    async with client(d) as c:
        alice = await Rpc.open(c, d)
        bob = await Rpc.open(c, d, token=d.other_token)
        mine = [(await alice.ok("tools/call", find(tree)))["task"]["taskId"] for _ in range(55)]
        theirs = (await bob.ok("tools/call", find(tree)))["task"]["taskId"]
        first = await alice.ok("tasks/list")
        assert len(first["tasks"]) == 50 and "nextCursor" in first
        second = await alice.ok("tasks/list", {"cursor": first["nextCursor"]})
        assert "nextCursor" not in second
        listed = [t["taskId"] for t in first["tasks"] + second["tasks"]]
        assert listed == mine[::-1] and theirs not in listed  # newest first, each once
        # bob replaying alice's cursor sees only his own
        assert [t["taskId"] for t in (await bob.ok("tasks/list", {"cursor": first["nextCursor"]}))["tasks"]] == []
        assert [t["taskId"] for t in (await bob.ok("tasks/list"))["tasks"]] == [theirs]


async def test_a_wait_for_the_result_abandoned_by_its_client_leaves_the_task_working(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = slow_daemon(daemon_factory)
    path = hole(tmp_path)
    async with client(d) as c:
        rpc = await Rpc.open(c, d)
        before = worker_pids(d.pid)
        task_id = (await rpc.ok("tools/call", {**slow_grep(path), "task": {}}))["task"]["taskId"]
        busy = await wait_worker(d, before)
        for _ in range(3):  # the client gives up waiting: its connection closes, the wait is cancelled
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(rpc("tasks/result", {"taskId": task_id}), 0.5)
        await asyncio.sleep(0.5)
        assert (await rpc.ok("tasks/get", {"taskId": task_id}))["status"] == "working"
        assert busy & worker_pids(d.pid)
        await rpc.ok("tasks/cancel", {"taskId": task_id})
        await wait_gone(d, busy)


async def test_the_daemon_stops_promptly_and_cleanly_with_tasks_working(daemon_factory: Callable[..., Daemon],
                                                                        tmp_path: Path) -> None:
    d = slow_daemon(daemon_factory)
    path = hole(tmp_path)
    async with client(d) as c:
        rpc = await Rpc.open(c, d)
        before = worker_pids(d.pid)
        for _ in range(4):
            await rpc.ok("tools/call", {**slow_grep(path), "task": {}})
        waiting = asyncio.ensure_future(rpc("tasks/result", {"taskId": "0" * 32}))
        await wait_worker(d, before)
        started = time.monotonic()
        d.proc.terminate()
        assert d.proc.wait(timeout=10) in (0, -15) and time.monotonic() - started < 8  # (-15: as without tasks)
        await asyncio.gather(waiting, return_exceptions=True)
    log = d.log()
    assert "Traceback" not in log and "Task was destroyed" not in log and "never retrieved" not in log, log[-3000:]


async def test_a_task_with_bad_arguments_fails_as_its_call_would(daemon_factory: Callable[..., Daemon]) -> None:
    daemon = daemon_factory()
    async with client(daemon) as c:
        rpc = await Rpc.open(c, daemon)
        for arguments in ([], "x", {"root": 7}, {"root": "/", "max_results": 10 ** 400}, {"root": "\u0000"}):
            direct = await rpc.ok("tools/call", {"name": "files/find", "arguments": arguments})
            task = (await rpc.ok("tools/call", {"name": "files/find", "arguments": arguments, "task": {}}))["task"]
            ended = await rpc.until_done(task["taskId"])
            assert ended["status"] == "failed", (arguments, ended)
            result = await rpc.ok("tasks/result", {"taskId": task["taskId"]})
            assert result["isError"] is True and result["structuredContent"] == direct["structuredContent"]
        assert await rpc.ok("ping") == {}


@pytest.mark.parametrize("params", ["[]", '"x"', "7", "null", '{"taskId": ["a"]}'])
async def test_task_methods_with_params_not_an_object_are_answered(daemon: Daemon, params: str) -> None:
    async with client(daemon) as c:
        rpc = await Rpc.open(c, daemon)
        for method in ("tasks/get", "tasks/result", "tasks/cancel", "tasks/list"):
            if method == "tasks/list" and params.startswith("{"):
                continue  # (tasks/list takes no taskId)
            reply = await raw(rpc, f'{{"jsonrpc": "2.0", "id": 3, "method": "{method}", "params": {params}}}')
            assert reply["error"]["code"] == -32602, (method, reply)
        assert await rpc.ok("ping") == {}


async def test_a_task_of_one_millisecond_ends_cleanly(daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    daemon = daemon_factory()
    tree = small_tree(tmp_path / "t")
    async with client(daemon) as c:
        rpc = await Rpc.open(c, daemon)
        made = [(await rpc.ok("tools/call", find(tree, ttl=1)))["task"]["taskId"] for _ in range(10)]
        await asyncio.sleep(0.2)
        for task_id in made:
            assert (await rpc.err("tasks/result", {"taskId": task_id}))["code"] == -32602
        assert not set(made) & {t["taskId"] for t in (await rpc.ok("tasks/list"))["tasks"]}
    log = daemon.log()
    assert "never retrieved" not in log and "Traceback" not in log


async def test_a_hangup_neither_drops_tasks_nor_lengthens_their_ttl(daemon_factory: Callable[..., Daemon],
                                                                   tmp_path: Path) -> None:
    d = slow_daemon(daemon_factory)
    path = hole(tmp_path)
    async with client(d) as c:
        rpc = await Rpc.open(c, d)
        before = worker_pids(d.pid)
        task_id = (await rpc.ok("tools/call", {**slow_grep(path), "task": {"ttl": 2500}}))["task"]["taskId"]
        busy = await wait_worker(d, before)
        d.proc.send_signal(signal.SIGHUP)  # the certificate is reloaded; the tasks are kept as they are
        await asyncio.sleep(0.5)
        assert (await rpc.ok("tasks/get", {"taskId": task_id}))["status"] == "working"
        await asyncio.sleep(2.5)
        assert (await rpc.err("tasks/get", {"taskId": task_id}))["code"] == -32602
        await wait_gone(d, busy, 5)


async def test_a_removed_principals_tasks_stop_and_no_one_else_reads_them(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = slow_daemon(daemon_factory)
    path = hole(tmp_path)
    users_file = d.state_dir / "users.yaml"
    async with client(d) as c:
        rpc = await Rpc.open(c, d)
        before = worker_pids(d.pid)
        task_id = (await rpc.ok("tools/call", {**slow_grep(path), "task": {}}))["task"]["taskId"]
        busy = await wait_worker(d, before)
        users = identity.load_users(users_file)
        del users["alice"]
        identity.save_users(users_file, users)  # mcpd users remove alice
        await wait_gone(d, busy, 6)
        bob = await Rpc.open(c, d, token=d.other_token)
        assert (await bob.err("tasks/get", {"taskId": task_id}))["code"] == -32602


def own_rss_kib(pid: int) -> int:
    """Resident memory (KiB, ``VmRSS``) of ``pid`` alone (the front, without its workers)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def long_paths(root: Path, files: int) -> Path:
    """``files`` empty files whose paths are about 3,800 characters long: a find of them answers
    about ``files`` × 7.5 KB (each path in the text and in ``structuredContent``)."""
    deep = root
    for i in range(14):
        deep = deep / (chr(97 + i) * 250)
    deep.mkdir(parents=True)
    for i in range(files):
        (deep / (f"{i:05d}" + "x" * 200)).touch()
    return root


def assert_whole_or_no_room(replies: list[Any], matches: int) -> None:
    """Each reply is the whole answer (``matches`` matches) or a ``-32000`` refusal for no room
    (``principal_queue_bytes``: an answer that waited while nothing of its principal's was sent for
    2 s; or the principal's calls whose answers are not taken), and at least half are whole: the
    budget makes answers wait, and refuses them only when nothing moves."""
    whole = [r for r in replies if isinstance(r, dict) and "result" in r
             and len(r["result"]["structuredContent"]["matches"]) == matches]
    refused = [r for r in replies if isinstance(r, dict) and "error" in r and r["error"]["code"] == -32000
               and ("principal_queue_bytes" in r["error"]["message"]
                    or "calls whose answers are not taken" in r["error"]["message"])]
    assert len(whole) + len(refused) == len(replies), [r if not isinstance(r, dict) else r.get("error")
                                                       for r in replies if r not in whole][:3]
    assert len(whole) * 2 >= len(replies), (len(whole), len(refused))


async def test_concurrent_reads_of_one_held_result_stay_within_the_outgoing_budget(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    budget = 64 * 1024 * 1024
    d = daemon_factory(principal_queue_bytes=budget)
    tree = long_paths(tmp_path / "t", 3000)
    async with client(d) as c:
        sessions = [await Rpc.open(c, d) for _ in range(4)]
        args = {"name": "files/find", "arguments": {"root": str(tree), "type": "file", "max_results": 3000}}
        task_id = (await sessions[0].ok("tools/call", {**args, "task": {}}))["task"]["taskId"]
        assert (await sessions[0].until_done(task_id))["status"] == "completed"
        base, peak = tree_rss_kib(d.pid), 0

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, tree_rss_kib(d.pid))
                await asyncio.sleep(0.01)

        sampler = asyncio.ensure_future(sample())
        try:
            replies = await asyncio.gather(*(sessions[i % 4]("tasks/result", {"taskId": task_id})
                                             for i in range(40)), return_exceptions=True)
        finally:
            sampler.cancel()
        # what the front may hold for alice's answers, plus the result itself and its text once
        # more, and room for the allocator: about 200 MiB
        assert (peak - base) * 1024 < budget + 3 * 23 * 1024 * 1024 + 64 * 1024 * 1024, (base, peak)
        # and every reader got the whole result in its turn, or (a machine so loaded that nothing of
        # the principal's was sent for 2 s) the clear refusal for no room: never a part, never a crash
        assert_whole_or_no_room(replies, 3000)


async def test_concurrent_direct_calls_of_a_large_answer_stay_within_the_outgoing_budget(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """Direct calls answering large reserve their answer's bytes before they are made, as task
    reads do, and no more of a principal's calls are in hand than its workers run at once: 24 calls
    of a 22 MB answer over 4 sessions at once, against 64 MiB, grow the front (its workers aside)
    by the budget, those calls' answers as read from the workers and room for the allocator
    (about 266 MiB; each call holding its answer encoded grew it by about 320 MiB), and each is
    answered in its turn."""
    budget = 64 * 1024 * 1024
    d = daemon_factory(principal_queue_bytes=budget)
    tree = long_paths(tmp_path / "t", 3000)
    async with client(d) as c:
        sessions = [await Rpc.open(c, d) for _ in range(4)]
        args = {"name": "files/find", "arguments": {"root": str(tree), "type": "file", "max_results": 3000}}
        assert len((await sessions[0].ok("tools/call", args))["structuredContent"]["matches"]) == 3000
        base, peak = own_rss_kib(d.pid), 0

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, own_rss_kib(d.pid))
                await asyncio.sleep(0.01)

        sampler = asyncio.ensure_future(sample())
        try:
            replies = await asyncio.gather(*(sessions[i % 4]("tools/call", args) for i in range(24)),
                                           return_exceptions=True)
        finally:
            sampler.cancel()
        print("front grew by", (peak - base) // 1024, "MiB")
        assert (peak - base) * 1024 < budget + 6 * 23 * 1024 * 1024 + 64 * 1024 * 1024, (base, peak)
        assert_whole_or_no_room(replies, 3000)


async def test_an_answer_larger_than_the_outgoing_budget_is_refused_clearly(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """A held result that could never fit in ``principal_queue_bytes`` is answered ``-32000``
    saying so, not encoded (and the session goes on)."""
    d = daemon_factory(principal_queue_bytes=4 * 1024 * 1024)
    tree = long_paths(tmp_path / "t", 1000)
    async with client(d) as c:
        rpc = await Rpc.open(c, d)
        args = {"name": "files/find", "arguments": {"root": str(tree), "type": "file", "max_results": 1000}}
        task_id = (await rpc.ok("tools/call", {**args, "task": {}}))["task"]["taskId"]
        assert (await rpc.until_done(task_id))["status"] == "completed"
        error = await rpc.err("tasks/result", {"taskId": task_id})
        assert error["code"] == -32000 and "principal_queue_bytes" in error["message"], error
        assert error["data"]["limit"] == 4 * 1024 * 1024 and error["data"]["size"] > 4 * 1024 * 1024
        assert (await rpc.err("tools/call", args))["code"] == -32000
        assert await rpc.ok("ping") == {}
