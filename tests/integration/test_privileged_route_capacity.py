"""The privileged route's capacity and records: one principal's hung privileged calls never hold up
another's, a call past its principal's cap or that never reached root leaves an audit record, a
burst past a principal's share is queued, not refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.client.api import MCPClientError, RPCError
from mcpd.front.sessions.backpressure import CALLS_AT_ONCE
from tests.conftest import EVENT_TIMEOUT
from tests.support.privsep_calls import client, read, uid_pids, wait_for
from tests.support.privsep_fixture import (  # noqa: F401  (fixture)
    LOG_TEXT,
    HungWalks,
    PrivsepDaemon,
    privsep_daemon,
)

pytestmark = pytest.mark.root


@pytest.fixture
def everyone_granted(privsep_daemon: PrivsepDaemon) -> Iterator[PrivsepDaemon]:  # noqa: F811
    """alice may read, list and find in ``app``; bob may read and find there (restored afterwards)."""
    d = privsep_daemon
    rule = {"allowed": True, "paths": [str(d.app)]}

    def regrant(grants: dict[str, Any]) -> None:
        loaded = len([r for r in d.audit() if r.get("event") == "reload"])
        d.write_grants(grants)
        wait_for(lambda: len([r for r in d.audit() if r.get("event") == "reload"]) > loaded)

    def tools(*names: str) -> dict[str, Any]:
        return {"privileged": {"tools": {t: dict(rule) for t in names}}}

    regrant({"users": {d.accounts["alice"].name: tools("files/read", "files/list", "files/find"),
                       d.accounts["bob"].name: tools("files/read", "files/find")}})
    try:
        yield d
    finally:
        regrant(d.default_grants())


#: calls one session runs at once (each reserves a share of its outgoing queue); more wait for room
SESSION_CALLS = CALLS_AT_ONCE


def _hung_find(root: Path) -> dict[str, Any]:
    """A privileged find allowed to run 60 s (the most): hung, it outlasts any other call's deadline."""
    return {"root": str(root), "privileged": True, "time_budget_seconds": 60}


def _access(d: PrivsepDaemon) -> list[dict[str, Any]]:
    if not d.access_path.exists():
        return []
    return [json.loads(line) for line in d.access_path.read_text().splitlines() if line.strip()]


def test_one_principals_hung_privileged_finds_never_hold_up_anothers_privileged_read(
        everyone_granted: PrivsepDaemon) -> None:
    """A hung request never delays another session, and no principal takes the helper's capacity
    from the others: alice's 12 privileged finds (four in each of three sessions) hang on a hung
    folder (those past her share of the call connections are refused RATE_LIMITED at once, each
    with one record); bob's privileged read of a granted file is still answered."""
    d = everyone_granted

    async def go() -> tuple[str | None, dict[str, Any], list[dict[str, Any]]]:
        async with client(d, "alice") as a1, client(d, "alice") as a2, client(d, "alice") as a3:
            finds = [asyncio.create_task(s.call_tool("files/find", _hung_find(d.app), check=False))
                     for s in (a1, a2, a3) for _ in range(SESSION_CALLS)]
            await asyncio.sleep(3)  # sequencing only: the finds have reached their walkers
            done = [t.result() for t in finds if t.done()]
            async with client(d, "bob") as b:
                res = await b.call_tool("files/read", {"path": str(d.log_file), "privileged": True}, check=False)
            for task in finds:
                task.cancel()
            await asyncio.gather(*finds, return_exceptions=True)
        refused = [r["structuredContent"]["error"] for r in done]
        if res.get("isError"):
            return None, res["structuredContent"]["error"], refused
        return res["content"][0]["text"], {}, refused

    with HungWalks(d):
        text, err, refused = asyncio.run(go())
    assert (text, err) == (LOG_TEXT, {})
    assert refused and {e["code"] for e in refused} == {"RATE_LIMITED"}, refused
    assert "share" in refused[0]["message"] and "retry when one ends" in refused[0]["message"]
    records = [r for r in _access(d) if r.get("user") == "alice" and r.get("outcome") == "RATE_LIMITED"]
    assert len(records) == len(refused), records
    assert records[0]["decision"] == "reject" and records[0]["route"] == "privileged"


def test_a_privileged_call_refused_for_the_principals_cap_leaves_a_record(everyone_granted: PrivsepDaemon) -> None:
    """Every call on either route leaves exactly one record: alice has her share of privileged
    finds in flight (hung; four in each of two sessions, what one session runs at once); her
    next, from a third session, is RATE_LIMITED by the front, which never sent it on: the
    front's access log holds that refusal, once, and the helper's audit log nothing of it."""
    d = everyone_granted

    async def go() -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        async with client(d, "alice") as a1, client(d, "alice") as a2, client(d, "alice") as a:
            hung = [asyncio.create_task(s.call_tool("files/find", _hung_find(d.app), check=False))
                    for s in (a1, a2) for _ in range(SESSION_CALLS)]
            await asyncio.sleep(2)  # sequencing only: all 8 are in flight
            before = len(_access(d)), len(d.audit())
            res = await a.call_tool("files/find", _hung_find(d.app / "."), check=False)
            await asyncio.sleep(1)
            new_access, new_audit = _access(d)[before[0]:], d.audit()[before[1]:]
            for task in hung:
                task.cancel()
            await asyncio.gather(*hung, return_exceptions=True)
            return res["structuredContent"]["error"], new_access, new_audit

    with HungWalks(d):
        err, new_access, new_audit = asyncio.run(go())
    assert err["code"] == "RATE_LIMITED", err
    assert [r["outcome"] for r in new_access] == ["RATE_LIMITED"], new_access
    rec = new_access[0]
    assert (rec["user"], rec["tool"], rec["route"], rec["decision"]) == ("alice", "files/find", "privileged", "reject")
    assert rec["requested_path"] == str(d.app / ".") and rec["reason"] == err["message"]
    assert not [r for r in new_audit if r.get("tool") == "files/find"], new_audit


def test_a_privileged_read_that_never_reached_the_helper_leaves_a_record(everyone_granted: PrivsepDaemon) -> None:
    """Every call leaves one record, also one that waited for a connection to the root helper
    past its time: alice's 8 hung finds (two sessions) and bob's 4 (one session) hold every
    call connection; bob's next privileged read, from another session, waits its whole time for
    one and answers TIMEOUT saying so; it never reached the policy process, so the front records
    it (once)."""
    d = everyone_granted

    async def go() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        async with client(d, "alice") as a1, client(d, "alice") as a2, client(d, "bob") as b1, \
                client(d, "bob") as b:
            finds = [asyncio.create_task(s.call_tool("files/find", _hung_find(d.app), check=False))
                     for s in (a1, a2, b1) for _ in range(SESSION_CALLS)]
            await asyncio.sleep(3)  # sequencing only: the finds hold their connections
            before = len(_access(d)), len(d.audit())
            res = await b.call_tool("files/read", {"path": str(d.log_file), "privileged": True}, check=False)
            await asyncio.sleep(1)
            new = [r for r in _access(d)[before[0]:] + d.audit()[before[1]:]
                   if r.get("user") == "bob" and r.get("tool") == "files/read"]
            for task in finds:
                task.cancel()
            await asyncio.gather(*finds, return_exceptions=True)
            return res["structuredContent"]["error"], new

    with HungWalks(d):
        err, records = asyncio.run(go())
    assert err["code"] == "TIMEOUT" and "no connection to the policy process came free" in err["message"], err
    assert len(records) == 1 and records[0]["event"] == "access", records
    assert records[0]["outcome"] == "TIMEOUT" and records[0]["route"] == "privileged"


def test_a_call_waiting_behind_its_sessions_hung_calls_answers_within_its_deadline(
        everyone_granted: PrivsepDaemon) -> None:
    """A call must answer within its deadline: alice's session runs its four calls at once, all
    hung finds; her next call on it, a privileged read, waits for room in the session and is
    answered ``-32000`` (not run) once its deadline (``workers.timeout_seconds``, 20 s) passed,
    though the stream sent her client keep-alive comments meanwhile (every 15 s here), which
    took it to no answer at all; it never reached the privileged route, so no audit record."""
    d = everyone_granted

    async def go() -> tuple[BaseException | dict[str, Any], float, list[dict[str, Any]]]:
        async with client(d, "alice") as a:
            hung = [asyncio.create_task(a.call_tool("files/find", _hung_find(d.app), check=False))
                    for _ in range(SESSION_CALLS)]
            await asyncio.sleep(2)  # sequencing only: the finds run (hung)
            before, started = len(d.audit()), time.monotonic()
            try:
                out: BaseException | dict[str, Any] = await a.call_tool(
                    "files/read", {"path": str(d.log_file), "privileged": True}, check=False, timeout=40)
            except MCPClientError as exc:
                out = exc
            took = time.monotonic() - started
            new = [r for r in d.audit()[before:] if r.get("tool") == "files/read"]
            for task in hung:
                task.cancel()
            await asyncio.gather(*hung, return_exceptions=True)
            return out, took, new

    with HungWalks(d):
        out, took, audited = asyncio.run(go())
    assert isinstance(out, RPCError) and out.rpc_code == -32000 and "not run" in str(out), out
    assert took < 30, took  # its deadline is 20 s: it never waits on for as long as the client listens
    assert audited == [], audited


def test_a_privileged_read_whose_worker_dies_before_reading_is_audited(privsep_daemon: PrivsepDaemon) -> None:
    """Every privileged decision is one audit record: alice's workers are stopped, a granted
    privileged read is handed to one of them (root opened the file), and the worker is killed
    before it reads: the call answers INTERNAL_ERROR, its accept record (outcome INTERNAL_ERROR)
    is in the audit log, the front records nothing of it, and the helper logs no traceback; nor
    is the front's request to kill the dead worker an alert."""
    d = privsep_daemon
    uid = d.accounts["alice"].uid

    victims: list[int] = []

    async def go() -> dict[str, Any]:
        async with client(d) as c:
            first = await c.call_tool("files/read", {"path": str(d.log_file), "privileged": True}, check=False)
            assert not first.get("isError")
            victims[:] = uid_pids(uid)
            for pid in victims:
                os.kill(pid, signal.SIGSTOP)
            task = asyncio.create_task(c.call_tool("files/read", {"path": str(d.log_file), "privileged": True},
                                                   check=False))
            await asyncio.sleep(1.0)  # sequencing only: the grant reached a stopped worker
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            res = await asyncio.wait_for(task, EVENT_TIMEOUT)
            return res["structuredContent"]["error"]

    before, access_before, log_before = len(d.audit()), len(_access(d)), len(d.log("helper.log"))
    err = asyncio.run(go())
    assert err["code"] == "INTERNAL_ERROR"
    wait_for(lambda: any(r.get("tool") == "files/read" and r.get("outcome") == "INTERNAL_ERROR"
                         for r in d.audit()[before:]), seconds=5)
    failed = [r for r in d.audit()[before:] if r.get("tool") == "files/read" and r.get("outcome") == "INTERNAL_ERROR"]
    assert len(failed) == 1 and failed[0]["decision"] == "accept", failed
    assert not [r for r in _access(d)[access_before:] if r.get("tool") == "files/read"]
    assert "Traceback" not in d.log("helper.log")[log_before:]
    # the front then has the dead worker killed: the policy process may have reaped it already, no alert
    wait_for(lambda: {r.get("pid") for r in d.audit()[before:] if r.get("event") in ("exit", "kill")} & set(victims))
    assert not [r for r in d.audit()[before:] if r.get("event") == "alert"], d.audit()[before:]


def test_a_burst_of_one_principals_privileged_reads_past_its_share_is_queued_not_refused(
        privsep_daemon: PrivsepDaemon) -> None:
    """The share of the helper's call connections refuses only walks: 12 privileged reads of
    one principal at once (more than its share, 8) while its workers are stopped wait for their
    turn, and all are answered once the workers go on."""
    d = privsep_daemon
    uid = d.accounts["alice"].uid
    stopped: set[int] = set()
    done = threading.Event()

    def freeze() -> None:  # every worker of alice is stopped as it appears, until done
        end = time.monotonic() + 30
        while not done.is_set() and time.monotonic() < end:
            for pid in uid_pids(uid):
                if pid not in stopped:
                    os.kill(pid, signal.SIGSTOP)
                    stopped.add(pid)
            time.sleep(0.005)

    async def go() -> list[tuple[str | None, dict[str, Any]]]:
        async with client(d) as c:
            assert (await read(c, d.log_file, privileged=True)) == (LOG_TEXT, {})
            freezer = threading.Thread(target=freeze, daemon=True)
            freezer.start()
            try:
                reads = [asyncio.create_task(read(c, d.log_file, privileged=True)) for _ in range(12)]
                await asyncio.sleep(2)  # sequencing only: the reads hold or wait for connections
            finally:
                done.set()
                freezer.join(5)
                for pid in stopped:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGCONT)
            return list(await asyncio.wait_for(asyncio.gather(*reads), EVENT_TIMEOUT))

    answers = asyncio.run(go())
    assert answers == [(LOG_TEXT, {})] * 12, answers
