"""The front's access records (docs/REFERENCE.md §7.1): each call's record holds that call's own who, what and
outcome, whatever was written before it. The fields that repeat from call to call are encoded once
and remembered (``mcpd.front.access``); these tests try to make a remembered encoding leak into
another call's record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hypothesis
import hypothesis.strategies as st
import pytest

from mcpd.common.audit.records import AuditError, encode_fields
from mcpd.common.audit.writer import AuditLog
from mcpd.common.identity import Principal
from mcpd.front import access
from mcpd.front.access import AccessLog, Call
from mcpd.helper.wire.errors import HELPER_UNAVAILABLE, PERMISSION_DENIED, RATE_LIMITED, TIMEOUT, ToolError

ALICE = Principal(name="alice", os_user="alice", token_id="aaaaaaaaaaaa")
BOB = Principal(name="bob", os_user="bob", token_id="bbbbbbbbbbbb")


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def expected(principal: Principal, peer: str, session: str, path: str | None, stage: str,
             result: dict[str, Any] | None, error: ToolError | None) -> dict[str, Any]:
    """The record's fields as the module docstring defines them, from the call alone."""
    return {"event": "access", "user": principal.name, "token_id": principal.token_id, "os_user": principal.os_user,
            "peer": peer, "session": session, "route": "unprivileged", "tool": "files/read",
            "requested_path": path, "resolved_path": (result or {}).get("path", path) if path else None,
            "decision": "reject" if stage == "refused" else
            "refused_by_os" if error is not None and error.code == PERMISSION_DENIED else "accept",
            "reason": (error.message if error else "refused") if stage == "refused" else access.UNPRIVILEGED_REASON,
            "outcome": error.code if error else None, "bytes": len((result or {}).get("text", ""))}


CALLS = st.tuples(st.sampled_from([ALICE, BOB]), st.sampled_from(["127.0.0.1:1", "127.0.0.1:2"]),
                  st.sampled_from(["s1", "s2"]), st.sampled_from(["/a", "/b", "/é\u2028", None]),
                  st.sampled_from(["unprivileged", "refused"]), st.booleans())


@hypothesis.settings(max_examples=60, deadline=None, suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(st.lists(CALLS, min_size=1, max_size=12))
def test_every_record_holds_its_own_call_whatever_was_remembered_before(tmp_path: Path, calls: list[Any]) -> None:
    path = tmp_path / f"access-{len(list(tmp_path.iterdir()))}.jsonl"
    log = AccessLog(str(path))
    want = []
    for principal, peer, session, file, stage, fails in calls:
        error = ToolError(PERMISSION_DENIED, f"denied: {file}") if fails else None
        result = None if fails else {"text": "xy", "path": file}
        args = {} if file is None else {"path": file}
        log.call(principal, peer, session, "files/read", args, 0.0, stage, result=result, error=error)
        want.append(expected(principal, peer, session, file, stage, result, error))
    got = lines(path)
    assert [{k: v for k, v in r.items() if k in want[0]} for r in got] == want
    assert [list(r)[:2] + list(r)[4:] for r in got] == [["seq", "prev", *list(w)[1:], "duration_ms"] for w in want]


def test_a_result_path_true_after_one_of_1_is_written_true(tmp_path: Path) -> None:
    """``True == 1`` in Python: a remembered encoding must never answer for the other."""
    log = AccessLog(str(tmp_path / "a.jsonl"))
    for odd in (1, True, 1.0):
        log.call(ALICE, "p", "s", "files/read", {"path": "/x"}, 0.0, "unprivileged", result={"path": odd})
    assert [r["resolved_path"] for r in lines(tmp_path / "a.jsonl")] == [1, True, 1.0]


def test_a_result_path_that_is_no_scalar_fails_the_record_and_writes_nothing(tmp_path: Path) -> None:
    log = AccessLog(str(tmp_path / "a.jsonl"))
    for bad in ({"a": 1}, [1]):
        with pytest.raises(AuditError):
            log.call(ALICE, "p", "s", "files/read", {"path": "/x"}, 0.0, "unprivileged", result={"path": bad})
    assert not (tmp_path / "a.jsonl").read_text()


def test_what_is_remembered_is_bounded_in_count_and_size(tmp_path: Path) -> None:
    log = AccessLog(str(tmp_path / "a.jsonl"))
    access._FIRST.clear()
    for i in range(access._FIRST_MAX + 100):
        log.call(ALICE, "p", "s", "files/read", {"path": f"/f{i}"}, 0.0, "unprivileged", result={"text": ""})
    assert len(access._FIRST) == access._FIRST_MAX
    assert ("alice", "aaaaaaaaaaaa", "alice", "p", "s", "unprivileged", "files/read", "/f0", "/f0", "accept",
            access.UNPRIVILEGED_REASON, None) not in access._FIRST  # the oldest went first
    long = "/" + "x" * access._FIRST_CHARS
    log.call(ALICE, "p", "s", "files/read", {"path": long}, 0.0, "unprivileged", result={"text": ""})
    assert all(len(f.text) <= access._FIRST_CHARS for f in access._FIRST.values())
    assert lines(tmp_path / "a.jsonl")[-1]["requested_path"] == long


def test_record_with_writes_what_record_writes_and_refuses_what_it_refuses(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    log = AuditLog(str(path))
    log.record("access", user="u", peer="p\n\"", outcome=None, bytes=3, duration_ms=0.5)
    log.record_with("access", encode_fields(user="u", peer="p\n\"", outcome=None), bytes=3, duration_ms=0.5)
    one, two = (line.split(',"event"', 1)[1] for line in path.read_text().splitlines())
    assert one == two  # every character after the chain and the time
    with pytest.raises(AuditError, match="twice"):
        log.record_with("access", encode_fields(user="u"), user="v")
    with pytest.raises(AuditError):
        log.record_with("alert", encode_fields(reason="r"))
    with pytest.raises(AuditError):
        encode_fields(token="secret")
    with pytest.raises(AuditError):
        log.record_with("access", encode_fields(user="u"), content="x")
    assert len(path.read_text().splitlines()) == 2


def test_a_call_that_succeeds_or_fails_leaves_one_record_with_its_own_outcome(tmp_path: Path) -> None:
    log = AccessLog(str(tmp_path / "a.jsonl"))
    with Call(log, ALICE, "p", "s", "files/read", {"path": "/x"}) as call:
        call.stage, call.result = "unprivileged", {"text": "abc", "path": "/x"}
    with pytest.raises(ToolError), Call(log, ALICE, "p", "s", "files/read", {"path": "/x"}) as call:
        call.stage = "unprivileged"
        raise ToolError(PERMISSION_DENIED, "no")
    got = lines(tmp_path / "a.jsonl")
    # the kernel's refusal on the unprivileged route is no accept: the daemon did not serve it
    assert [(r["outcome"], r["bytes"], r["decision"]) for r in got] == [(None, 3, "accept"),
                                                                        (PERMISSION_DENIED, 0, "refused_by_os")]


def _forwarded(log: AccessLog, marks: list[bool], error: ToolError | None) -> None:
    """One privileged call through :class:`Call`, the helper client's ``marks`` given in its task."""
    try:
        with Call(log, ALICE, "127.0.0.1:1", "s1", "files/read", {"path": "/a", "privileged": True}) as call:
            call.stage = "forwarded"
            for mark in marks:
                access.policy_received(mark)
            if error is not None:
                raise error
            call.result = {"text": "xy", "path": "/a"}
    except ToolError:
        pass


def test_a_forwarded_call_is_recorded_by_the_front_only_when_the_policy_process_never_received_it(
        tmp_path: Path) -> None:
    """One record per call: a privileged call the policy process received (the whole request in its
    socket) is its to record, whatever the front then saw; one it never received, or whose
    connection it closed without answering, is the front's."""
    path = tmp_path / "access.jsonl"
    log = AccessLog(str(path))
    _forwarded(log, [True], None)  # answered
    _forwarded(log, [True], ToolError(TIMEOUT, "the worker did not finish in 1 s"))  # the policy records it
    assert not path.exists() or lines(path) == []
    _forwarded(log, [], ToolError(RATE_LIMITED, "8 privileged calls of this principal ..."))
    _forwarded(log, [], ToolError(TIMEOUT, "no connection to the policy process came free within 1 s"))
    _forwarded(log, [True, False], ToolError(HELPER_UNAVAILABLE, "gone"))
    got = [(r["route"], r["decision"], r["outcome"], r["reason"]) for r in lines(path)]
    assert got == [("privileged", "reject", "RATE_LIMITED", "8 privileged calls of this principal ..."),
                   ("privileged", "accept", "TIMEOUT", "no connection to the policy process came free within 1 s"),
                   ("privileged", "accept", "HELPER_UNAVAILABLE", "the policy process is unreachable")]
    access.policy_received(True)  # outside a call: nothing to mark, nothing fails
