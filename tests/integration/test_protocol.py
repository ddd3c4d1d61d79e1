"""docs/REFERENCE.md §2 against the real daemon: lifecycle, envelope, batches, cancellation, tools/list and tools/call."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpd.common.identity import Principal
from mcpd.front.mcp.dispatcher import Caller, Dispatcher
from mcpd.front.mcp.session import McpSession
from mcpd.front.privileged import Unavailable
from tests.conftest import Daemon, SseSession
from tests.support.workers import slow_file, worker_pids

pytestmark = pytest.mark.anyio

VERSIONS = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]


def msg(method: str, req_id: Any = 1, params: Any = None) -> dict[str, Any]:
    m: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
    if params is not None:
        m["params"] = params
    return m


async def post_ok(s: SseSession, body: Any) -> None:
    r = await s.post(body)
    assert r.status_code == 202, r.text


async def answered_next(s: SseSession, body: Any, expect: int = 0) -> Any:
    """POST ``body`` then a ping with id "probe"; return every message that arrived before the
    probe's reply, and at least ``expect`` messages other than it (a batch's one array may be
    answered after a later single request: its members run concurrently)."""
    await post_ok(s, body)
    await post_ok(s, msg("ping", "probe"))
    seen, probed = [], False
    while not probed or len(seen) < expect:
        m = await s.next_message()
        if isinstance(m, dict) and m.get("id") == "probe":
            probed = True
        else:
            seen.append(m)
    return seen


# -- §2.1 initialize -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
async def test_initialize_echoes_supported_version(daemon: Daemon, version: str) -> None:
    async with SseSession(daemon) as s:
        r = await s.initialize(version)
        assert r["result"]["protocolVersion"] == version


@pytest.mark.parametrize("version", ["2099-01-01", "2024-01-01", "1.0"])
async def test_initialize_unsupported_version_offers_newest(daemon: Daemon, version: str) -> None:
    async with SseSession(daemon) as s:
        r = await s.initialize(version)
        assert r["result"]["protocolVersion"] == "2025-11-25"


async def test_initialize_result_capabilities_server_info_instructions(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        res = (await s.initialize())["result"]
        assert set(res["capabilities"]) >= {"tools", "resources"}
        assert res["serverInfo"]["name"] == "mcpd" and res["serverInfo"]["version"]
        assert isinstance(res["instructions"], str) and 0 < len(res["instructions"]) < 500


async def test_initialized_notification_gets_no_answer(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        await s.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
        assert await answered_next(s, {"jsonrpc": "2.0", "method": "notifications/initialized"}) == []


async def test_initialize_bad_params_32602(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        assert (await s.request("initialize", {"protocolVersion": 5}))["error"]["code"] == -32602
        await post_ok(s, {"jsonrpc": "2.0", "id": 9, "method": "initialize", "params": "x"})
        assert (await s.reply(9))["error"]["code"] == -32602


# -- §2.2 before initialize ----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["tools/list", "tools/call", "resources/list", "resources/read"])
async def test_before_initialize_only_initialize_and_ping(daemon: Daemon, method: str) -> None:
    async with SseSession(daemon) as s:
        r = await s.request(method, {"name": "files/read", "arguments": {"path": "/etc/hostname"}})
        assert r["error"]["code"] == -32600
        assert r["error"]["message"] == "session not initialized"
        assert (await s.request("ping"))["result"] == {}
        await s.initialize()
        assert "result" in await s.request("tools/list")


async def test_ping_answers_empty_object_any_time(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        assert (await s.request("ping"))["result"] == {}
        await s.initialize()
        assert (await s.request("ping", {}))["result"] == {}


async def test_server_discover_32601(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        assert (await s.request("server/discover", {}))["error"]["code"] == -32601
        await s.initialize()
        assert (await s.request("server/discover"))["error"]["code"] == -32601


# -- §2.3 envelope -------------------------------------------------------------------------------


@pytest.mark.parametrize("req_id", [0, 1, -5, 2**40, 1.5, "", "abc", "0"])
async def test_id_string_or_number_zero_valid(daemon: Daemon, req_id: Any) -> None:
    async with SseSession(daemon) as s:
        r = await s.request("ping", req_id=req_id)
        assert r == {"jsonrpc": "2.0", "id": req_id, "result": {}}


async def test_an_id_not_exactly_representable_is_an_invalid_id(daemon: Daemon) -> None:
    """A number that is not exactly representable is an invalid id (-32600, id null); never a
    reply whose id the client did not send (before: 9007199254740993.0 came back as
    9007199254740992.0). A number its reply writes back as the same number stays valid."""
    async with SseSession(daemon) as s:
        for raw in (b"9007199254740993.0", b"1.00000000000000000001", b"123456789012345678901234567890.0",
                    b"1e-400"):
            r = await s.post(None, raw=b'{"jsonrpc":"2.0","id":%s,"method":"ping"}' % raw)
            assert r.status_code == 202
            reply = await s.next_message()
            assert reply["id"] is None and reply["error"]["code"] == -32600, (raw, reply)
        r = await s.post(None, raw=b'[{"jsonrpc":"2.0","id":9007199254740993.0,"method":"ping"},'
                                   b'{"jsonrpc":"2.0","id":9007199254740992.0,"method":"ping"}]')
        assert r.status_code == 202
        assert await s.next_message() == [{"jsonrpc": "2.0", "id": None, "error": {
            "code": -32600, "message": "invalid request: id must be a string or a number (finite, and exactly as a "
                                       "reply would write it back)"}},
            {"jsonrpc": "2.0", "id": 9007199254740992.0, "result": {}}]
        for raw, echoed in ((b"0.1", b"0.1"), (b"1E2", b"100.0"), (b"2.50", b"2.5"), (b"-0.0", b"-0.0"),
                            (b"0.30000000000000004", b"0.30000000000000004"), (b"9007199254740993", b"9007199254740993"),
                            (b"123456789012345678901234567890", b"123456789012345678901234567890")):
            r = await s.post(None, raw=b'{"jsonrpc":"2.0","id":%s,"method":"ping"}' % raw)
            assert r.status_code == 202
            ev = await s.next_event()
            assert ev.data == '{"jsonrpc":"2.0","id":%s,"result":{}}' % echoed.decode(), (raw, ev.data)


@pytest.mark.parametrize("body", [
    {"jsonrpc": "2.0", "id": None, "method": "ping"},
    {"id": 1, "method": "ping"},
    {"jsonrpc": "1.0", "id": 1, "method": "ping"},
    {"jsonrpc": 2.0, "id": 1, "method": "ping"},
    {"jsonrpc": "2.0", "id": 1, "method": 5},
    {"jsonrpc": "2.0", "id": 1, "method": None},
    {"jsonrpc": "2.0", "id": True, "method": "ping"},
    {"jsonrpc": "2.0", "id": [1], "method": "ping"},
    {"jsonrpc": "2.0", "id": 1},
])
async def test_bad_envelope_32600(daemon: Daemon, body: dict[str, Any]) -> None:
    async with SseSession(daemon) as s:
        seen = await answered_next(s, body, expect=1)
        assert len(seen) == 1 and seen[0]["error"]["code"] == -32600
        expected_id = body.get("id") if isinstance(body.get("id"), int) and body.get("id") is not True else None
        assert seen[0]["id"] == expected_id


async def test_unknown_method_32601(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        await s.initialize()
        assert (await s.request("files/delete", {}))["error"]["code"] == -32601


async def test_bad_params_32602(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        await s.initialize()
        await post_ok(s, msg("tools/list", 5, params=[1, 2]))
        assert (await s.reply(5))["error"]["code"] == -32602
        assert (await s.request("tools/call", {"name": 5}))["error"]["code"] == -32602
        assert (await s.request("tools/call", {}))["error"]["code"] == -32602


@pytest.mark.parametrize("body", [
    {"jsonrpc": "2.0", "method": "notifications/whatever"},
    {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "nope"}},
    {"jsonrpc": "2.0", "method": "ping"},
    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 12345}},
])
async def test_notifications_never_answered(daemon: Daemon, body: dict[str, Any]) -> None:
    async with SseSession(daemon) as s:
        await s.initialize()
        assert await answered_next(s, body) == []


async def test_client_responses_are_not_answered(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        assert await answered_next(s, {"jsonrpc": "2.0", "id": 77, "result": {}}) == []


async def test_notifications_cancelled_stops_request_no_reply(daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory(workers={"timeout_seconds": 3})
    path = slow_file(tmp_path)
    async with SseSession(d) as s:
        await s.initialize()
        before = worker_pids(d.pid)
        await post_ok(s, msg("tools/call", "slow", {"name": "files/read",
                                                    "arguments": {"path": str(path), "start_line": 3}}))
        busy: set[int] = set()
        for _ in range(200):
            busy = worker_pids(d.pid) - before
            if busy:
                break
            await asyncio.sleep(0.05)
        await s.request("ping")  # the request is in flight (its worker spawned, no reply yet)
        assert "\"slow\"" not in s.pending
        await post_ok(s, {"jsonrpc": "2.0", "method": "notifications/cancelled",
                          "params": {"requestId": "slow", "reason": "test"}})
        # Without cancellation a TIMEOUT result would arrive after 3 s; wait past that.
        deadline = asyncio.get_running_loop().time() + 5
        seen = []
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            try:
                seen.append(await s.next_message(timeout=left))
            except TimeoutError:
                break
        assert all(m.get("id") != "slow" for m in seen if isinstance(m, dict))
        assert busy and not (busy & worker_pids(d.pid))  # the worker that ran it was killed


async def test_batch_replies_as_one_array(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        batch = [msg("ping", 1), {"jsonrpc": "2.0", "method": "notifications/initialized"}, msg("ping", "two"),
                 msg("nope", 3), 5]
        seen = await answered_next(s, batch, expect=1)
        assert len(seen) == 1 and isinstance(seen[0], list)
        by_id = {json.dumps(m["id"]): m for m in seen[0]}
        assert len(seen[0]) == 4
        assert by_id["1"]["result"] == {} and by_id['"two"']["result"] == {}
        assert by_id["3"]["error"]["code"] == -32601 and by_id["null"]["error"]["code"] == -32600


async def test_batch_of_notifications_gets_no_reply(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        assert await answered_next(s, [{"jsonrpc": "2.0", "method": "notifications/initialized"}]) == []


async def test_empty_batch_one_32600(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        seen = await answered_next(s, [], expect=1)
        assert seen == [{"jsonrpc": "2.0", "id": None, "error": seen[0]["error"]}]
        assert seen[0]["error"]["code"] == -32600


async def test_a_batch_far_past_max_batch_is_refused_whole_with_one_error(daemon_factory: Any) -> None:
    """Every member of a batch gets an answer, or the batch is refused whole with one error: 50,000
    members (max_batch 256) get one -32600 with id null (an object, not an array), none of them
    run; the session goes on. (Before: a task and an uncounted refusal per member: a 4 MiB body of
    466,000 members held the event loop 22 s, grew the front past 1 GiB and came back as one 47 MB
    event; then 256 replies, 256 refusals and nothing for the rest.)"""
    d = daemon_factory(session_queue_bytes=1024 * 1024)
    body = b"[" + b",".join([b'{"id":0}'] * 50_000) + b"]"
    async with httpx.AsyncClient(verify=d.ssl_context(), timeout=120) as c, SseSession(d, client=c) as s:
        await s.initialize("2025-03-26")  # (batches end with 2025-06-18)
        assert (await s.post(None, raw=body)).status_code == 202
        ev = await s.next_event(timeout=120)
        assert len(ev.data) < 1024, f"a batch refusal of {len(ev.data)} bytes"
        answer = json.loads(ev.data)
        assert answer["id"] is None and answer["error"]["code"] == -32600, answer
        assert "50000 members" in answer["error"]["message"] and "over max_batch (256)" in answer["error"]["message"]
        assert await s.request("ping", req_id="after") == {"jsonrpc": "2.0", "id": "after", "result": {}}


async def test_a_batch_one_past_max_batch_runs_none_of_its_members(daemon_factory: Any) -> None:
    """A batch of max_batch + 1 members is refused whole: none runs (a notifications/cancelled among
    them does nothing, a slow read is not started), and the one answer is a -32600 with id null."""
    d = daemon_factory(max_batch=3)
    async with SseSession(d) as s:
        await s.initialize("2025-03-26")  # (batches end with 2025-06-18)
        batch = [msg("ping", 1), msg("ping", 2), msg("ping", 3),
                 {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}]
        seen = await answered_next(s, batch, expect=1)
        assert len(seen) == 1 and isinstance(seen[0], dict), seen
        assert seen[0]["id"] is None and seen[0]["error"]["code"] == -32600
        assert "batch of 4 members is over max_batch (3)" in seen[0]["error"]["message"]
        seen = await answered_next(s, batch[:3], expect=1)  # max_batch members: all run
        assert seen == [[{"jsonrpc": "2.0", "id": i, "result": {}} for i in (1, 2, 3)]], seen


async def test_a_batch_within_max_batch_answers_every_member_within_the_queue_bytes(daemon_factory: Any) -> None:
    """A batch within max_batch whose replies would pass the batch's byte bound (session_queue_bytes):
    each member still gets an answer with its id, those past the bound -32000 ("send it alone")."""
    d = daemon_factory(session_queue_bytes=8192)
    async with SseSession(d) as s:
        await s.initialize("2025-03-26")  # (batches end with 2025-06-18)
        ids = [f"{i:02d}" + "x" * 1000 for i in range(20)]
        assert (await s.post([msg("ping", i) for i in ids])).status_code == 202
        answer = json.loads((await s.next_event()).data)
        assert sorted(m["id"] for m in answer) == ids, answer
        dropped = [m for m in answer if "error" in m]
        assert dropped and all(m["error"]["code"] == -32000 and "send it alone" in m["error"]["message"]
                               for m in dropped)
        assert len(answer) - len(dropped) < 20


# -- §2.4 tools/list, §2.5 tools/call ------------------------------------------------------------


async def test_tools_list_schema_and_annotations(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        await s.initialize()
        tools = (await s.request("tools/list"))["result"]["tools"]
        names = [t["name"] for t in tools]
        assert "files/read" in names
        for t in tools:
            assert isinstance(t["description"], str) and len(t["description"]) > 40
            assert t["inputSchema"]["type"] == "object"
            assert t["inputSchema"]["additionalProperties"] is False
            assert t["annotations"] == {"readOnlyHint": True, "openWorldHint": False}


async def test_tools_call_unknown_tool_32602(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        await s.initialize()
        r = await s.request("tools/call", {"name": "files/delete", "arguments": {}})
        assert r["error"]["code"] == -32602


async def call(s: SseSession, args: dict[str, Any]) -> dict[str, Any]:
    r = await s.request("tools/call", {"name": "files/read", "arguments": args})
    result: dict[str, Any] = r["result"]
    return result


async def test_tools_call_reads_file(daemon: Daemon, tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    p.write_bytes(b"one\r\ntwo\nthree")
    async with SseSession(daemon) as s:
        await s.initialize()
        assert (await call(s, {"path": str(p)}))["content"] == [{"type": "text", "text": "one\r\ntwo\nthree"}]
        assert (await call(s, {"path": str(p), "start_line": 2}))["content"][0]["text"] == "two\nthree"


@pytest.mark.parametrize("case,code", [("binary", "BINARY_FILE"), ("missing", "FILE_NOT_FOUND"),
                                       ("relative", "INVALID_ARGUMENT"), ("badtype", "INVALID_ARGUMENT"),
                                       ("privileged", "HELPER_UNAVAILABLE")])
async def test_tool_failure_is_error_result(daemon: Daemon, tmp_path: Path, case: str, code: str) -> None:
    binary = tmp_path / "b.bin"
    binary.write_bytes(b"abc\x00def")
    args = {"binary": {"path": str(binary)}, "missing": {"path": str(tmp_path / "nope")},
            "relative": {"path": "etc/hostname"}, "badtype": {"path": str(binary), "start_line": "x"},
            "privileged": {"path": str(binary), "privileged": True}}[case]
    async with SseSession(daemon) as s:
        await s.initialize()
        res = await call(s, args)
        assert res["isError"] is True
        err = res["structuredContent"]["error"]
        assert err["code"] == code and res["content"][0]["text"] == err["message"]
        assert set(err) == {"code", "message", "details"}
        if case == "binary":
            assert err["message"] == "cannot read binary file"
        if case == "missing":
            assert err["details"]["path"] == str(tmp_path / "nope")


# -- in-process: the hooks and the internal-error boundary ----------------------------------------


class _BrokenTool:
    NAME = "broken"
    DESCRIPTION = "raises"
    INPUT_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": False}

    @staticmethod
    def parse_args(args: Any) -> dict[str, Any]:
        raise RuntimeError("secret-internal-detail")

    @staticmethod
    def format_result(result: dict[str, Any]) -> dict[str, Any]:
        return result


async def _run(session: McpSession, payload: Any, out: list[Any]) -> None:
    session.receive(payload, Caller(Principal("alice", "root", "0" * 12), "tok", "127.0.0.1:1"))
    for _ in range(100):
        if out:
            return
        await asyncio.sleep(0.01)


async def test_unexpected_exception_generic_error_traceback_in_log(caplog: pytest.LogCaptureFixture) -> None:
    out: list[Any] = []
    dispatcher = Dispatcher(pool=None, privileged=Unavailable(), tools={"broken": _BrokenTool})  # type: ignore[arg-type,dict-item]
    session = McpSession(dispatcher, "s" * 32, out.append)
    session.initialized = True
    with caplog.at_level(logging.ERROR):
        await _run(session, msg("tools/call", 1, {"name": "broken", "arguments": {}}), out)
    res = out[0]["result"]
    assert res["isError"] is True and res["structuredContent"]["error"]["code"] == "INTERNAL_ERROR"
    assert "secret-internal-detail" not in json.dumps(out)
    assert "secret-internal-detail" in caplog.text and "Traceback" in caplog.text


async def test_progress_hook_sends_notifications_progress() -> None:
    from mcpd.front.mcp.dispatcher import RequestContext

    out: list[Any] = []
    caller = Caller(Principal("alice", "root", "0" * 12), "tok", "peer")
    await RequestContext(caller, "s", "tok-1", out.append).progress(5, 10, "half")
    await RequestContext(caller, "s", None, out.append).progress(5)
    assert out == [{"jsonrpc": "2.0", "method": "notifications/progress",
                    "params": {"progressToken": "tok-1", "progress": 5, "total": 10, "message": "half"}}]
