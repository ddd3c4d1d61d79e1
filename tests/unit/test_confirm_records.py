"""The confirmation records of the policy process (mcpd.policy.confirm) and the front's shapes
around them (mcpd.front.confirm, mcpd.front.mcp.outgoing), with a real audit log: bound to one
principal, token, tool and path; used once; approvers as the grant names them; expiry."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mcpd.common.audit.writer import AuditLog
from mcpd.common.grantmatch import Approve
from mcpd.front.mcp.confirm import hitl_of, input_required
from mcpd.front.mcp.outgoing import ClientDidNotAnswer, Outgoing
from mcpd.helper.wire.errors import PERMISSION_DENIED, ToolError
from mcpd.policy.confirm import (
    APPROVE,
    APPROVED,
    DENIED,
    EXPIRED,
    MAX_PENDING_PER_PRINCIPAL,
    SIGNED_IN,
    SIGNIN,
    Confirmations,
    Resolution,
)


def box(tmp_path: Path, ttl: float = 60) -> tuple[Confirmations, Path]:
    path = tmp_path / "audit.jsonl"
    return Confirmations(AuditLog(str(path), syslog=False), ttl), path


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_record_is_bound_to_principal_token_tool_and_path_and_used_once(tmp_path: Path) -> None:
    b, path = box(tmp_path)
    p = b.open(SIGNIN, "alice", "alice", "t1", "files/read", "/var/log/syslog")
    assert b.for_retry(p.id, "alice", "t1", "files/read", "/var/log/syslog") is p
    for other in (("bob", "t1", "files/read", "/var/log/syslog"), ("alice", "t2", "files/read", "/var/log/syslog"),
                  ("alice", "t1", "files/list", "/var/log/syslog"), ("alice", "t1", "files/read", "/var/log/auth.log")):
        assert b.for_retry(p.id, *other) is None
    assert b.for_retry(p.id[:-1] + ("A" if p.id[-1] != "A" else "B"), "alice", "t1", "files/read",
                       "/var/log/syslog") is None  # forged
    assert not b.use(p)  # nobody signed in yet
    assert b.signed_in(p, "bob", "1.2.3.4") is not None and p.state != SIGNED_IN
    assert b.signed_in(p, "alice", "1.2.3.4") is None and p.state == SIGNED_IN
    assert b.use(p) and not b.use(p)
    assert b.get(p.id) is None
    assert [r["decision"] for r in records(path)] == ["requested", "refused", "signed_in", "used"]
    assert records(path)[1]["by"] == "bob" and records(path)[2]["by"] == "alice"


def test_approvers_self_and_the_for_window(tmp_path: Path) -> None:
    b, _ = box(tmp_path)
    rule = Approve(("bob", "%ops"), 60.0, False)
    p = b.open(APPROVE, "alice", "alice", "t1", "files/read", "/srv/a", "why not", rule)
    assert b.decide(p, "carol", "carol", set(), True, "-") == "you are not an approver of this grant"
    assert b.decide(p, "alice", "alice", {"ops"}, True, "-") == "you may not approve your own request"
    assert b.decide(p, "dave", "dave", {"ops"}, True, "-") is None and p.state == APPROVED
    assert b.approved("alice", "files/read", "/srv/a", rule) == "dave"
    assert b.approved("alice", "files/read", "/srv/b", rule) is None
    assert b.approved("bob", "files/read", "/srv/a", rule) is None
    # a reload that changed the approve block (dave's group no longer named) ends the approval
    assert b.approved("alice", "files/read", "/srv/a", Approve(("bob",), 60.0, False)) is None
    q = b.open(APPROVE, "bob", "bob", "t9", "files/read", "/srv/a", "", Approve(("bob",), 0.0, True))
    assert b.decide(q, "bob", "bob", set(), False, "-") is None and q.state == DENIED  # self: true


def test_an_approval_holds_only_for_the_object_it_resolved_to(tmp_path: Path) -> None:
    b, path = box(tmp_path)
    rule = Approve(("bob",), 60.0, False)
    notes, payroll = Resolution("/srv/notes.txt", 2049, 11), Resolution("/srv/payroll.txt", 2049, 12)
    p = b.open(APPROVE, "alice", "alice", "t1", "files/read", "/srv/today.txt", "", rule, resolved=notes)
    assert p.view()["resolves_to"] == "/srv/notes.txt" and records(path)[0]["resolves_to"] == "/srv/notes.txt"
    assert b.decide(p, "bob", "bob", set(), True, "-") is None
    assert b.approved("alice", "files/read", "/srv/today.txt", rule, notes) == "bob"
    assert b.approved("alice", "files/read", "/srv/today.txt", rule, payroll) is None  # the link re-pointed
    assert b.approved("alice", "files/read", "/srv/today.txt", rule, Resolution("/srv/notes.txt", 2049, 13)) is None
    b.moved(p, payroll)  # the retry found the path resolving elsewhere: the record never admits a call
    assert b.get(p.id) is None and not b.use(p)
    last = records(path)[-1]
    assert (last["decision"], last["reason"], last["resolves_to"]) == ("refused", "the path resolves elsewhere now",
                                                                       "/srv/payroll.txt")


def test_a_waiting_calls_login_claim_stays_with_its_record(tmp_path: Path) -> None:
    b, _ = box(tmp_path)
    p = b.open(APPROVE, "alice", "alice", "t1", "files/read", "/srv/a", "", Approve(("bob",), 0.0, False))
    assert not b.holds_claim(p.id, "login1")
    b.hold_claim(p.id, "login1")
    assert b.holds_claim(p.id, "login1") and not b.holds_claim(p.id, "login2")
    assert not b.holds_claim(None, "login1") and not b.holds_claim("forged" * 4, "login1")


def test_wait_returns_on_a_decision_and_records_expire(tmp_path: Path) -> None:
    b, path = box(tmp_path, ttl=1.0)
    p = b.open(APPROVE, "alice", "alice", "t1", "files/read", "/srv/a", "", Approve(("bob",)))
    threading.Timer(0.2, lambda: b.decide(p, "bob", "bob", set(), True, "-")).start()
    started = time.monotonic()
    assert b.wait(p, 5) == APPROVED and time.monotonic() - started < 2
    q = b.open(SIGNIN, "alice", "alice", "t1", "files/read", "/srv/a")
    assert b.wait(q, 5) == EXPIRED
    assert b.get(q.id) is None and records(path)[-1]["decision"] == "expired"


def test_input_required_shape_and_hitl_of() -> None:
    exc = ToolError(PERMISSION_DENIED, "x", path="/srv/a", confirm={"id": "A" * 32, "kind": "signin"})
    out = input_required(exc, "https://h:1")
    assert out is not None and out["resultType"] == "input_required" and out["requestState"] == "A" * 32
    req = out["inputRequests"]["mcpd_confirm"]
    assert req["method"] == "elicitation/create"
    assert req["params"]["mode"] == "url" and req["params"]["url"] == "https://h:1/confirm/" + "A" * 32
    assert input_required(ToolError(PERMISSION_DENIED, "x"), "https://h:1") is None
    modern = SimpleNamespace(modern=True, ask=None, client_capabilities={})
    caps = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {"url": {}}}, "dev.mcpd/reason": "r"}
    assert hitl_of({"_meta": caps}, modern) == {"interactive": True, "why": "r"}
    assert hitl_of({"_meta": {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}}, modern) == {}
    retry = hitl_of({"requestState": "B" * 32, "inputResponses": {"mcpd_confirm": {"action": "decline"}}}, modern)
    assert retry == {"confirm": "B" * 32, "declined": True}
    assert hitl_of({"requestState": "../../x"}, modern) == {}
    legacy = SimpleNamespace(modern=False, ask=object(), client_capabilities={"elicitation": {"url": {}}})
    assert hitl_of({}, legacy) == {"interactive": True, "elicit": True}


def test_outgoing_routes_the_response_and_times_out() -> None:
    async def go() -> None:
        out = Outgoing()
        sent: list[dict[str, Any]] = []

        def send(msg: dict[str, Any]) -> None:
            sent.append(msg)
            asyncio.get_running_loop().call_soon(out.resolve, {"jsonrpc": "2.0", "id": msg["id"],
                                                               "result": {"action": "accept"}})

        assert await out.ask(send, "elicitation/create", {"mode": "url"}, 5) == {"action": "accept"}
        assert sent[0]["method"] == "elicitation/create" and sent[0]["id"].startswith("mcpd-")
        assert not out.resolve({"id": "mcpd-99", "result": {}}) and not out.resolve({"id": 1, "result": {}})
        try:
            await out.ask(lambda m: None, "elicitation/create", {}, 0.05)
        except ClientDidNotAnswer:
            pass
        else:
            raise AssertionError("no answer must time out")

    asyncio.run(go())


def test_one_principals_flood_expires_only_its_own_records(tmp_path: Path) -> None:
    b, _ = box(tmp_path)
    rule = Approve(("bob",), 0.0, False)
    bobs = b.open(APPROVE, "bob", "bob", "t2", "files/read", "/srv/b", "", rule)
    mine = [b.open(APPROVE, "alice", "alice", "t1", "files/read", f"/srv/{i}", "", rule)
            for i in range(MAX_PENDING_PER_PRINCIPAL + 5)]
    assert b.get(bobs.id) is bobs
    assert [b.get(p.id) for p in mine[:5]] == [None] * 5 and all(b.get(p.id) is p for p in mine[5:])
