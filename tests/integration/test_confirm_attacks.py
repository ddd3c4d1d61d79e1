"""Attacks on the person in the loop (step-up sign-in and approval grants, docs/REFERENCE.md §4.7),
against the real daemons: real TLS, the root helper, real OS accounts and PAM, the front's page.

The requester (alice, an agent holding her token) is the attacker: she replays and reuses
records, forges ids, approves her own calls through a group or a second principal of her own
account, floods the store, holds the policy process's threads with waiting calls, injects text
into the page and the approver's terminal, and races reloads. Each test names the behaviour that
must hold; one that is known to break is marked ``xfail(strict=True)`` with what breaks.
"""

from __future__ import annotations

import concurrent.futures
import grp
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpd.client import login as login_client
from mcpd.client.api import ssl_context
from mcpd.client.errors import AuthError, UsageError
from mcpd.common import identity
from mcpd.front.policy_client.backend import WAITS_PER_PRINCIPAL
from mcpd.front.policy_client.channel import CALL_CONNECTIONS, CALL_SHARE
from mcpd.policy import confirm as confirm_store
from tests.support.confirm import call, call_body, confirm_daemon, csrf_of, page, page_url, sign_in, submit
from tests.support.osaccounts import AccountFactory
from tests.support.privsep_fixture import PrivsepDaemon

pytestmark = pytest.mark.root

DEADLINE = 8  # workers.timeout_seconds: how long a non-interactive approval call waits
PER_ACCOUNT = 8  # workers.per_account: one principal may fill its share of the call connections


@pytest.fixture(scope="module")
def attackd() -> Iterator[tuple[PrivsepDaemon, dict[str, str]]]:
    """alice: files/read waits for bob or ``alice2`` (a second principal of alice's own account);
    files/list for bob or alice's own primary group, an approval covering 1h. bob: files/read of
    the tree without any person in the loop, files/list under an approval by alice."""
    rules = {"files/read": {"approve": {"by": ["bob", "alice2"]}}}
    factory = AccountFactory()
    with confirm_daemon(rules, {"max_failures": 5, "free_failures": 2, "base_delay_seconds": 0,
                                "max_delay_seconds": 0, "lockout_seconds": 600},
                        workers={"per_account": PER_ACCOUNT, "timeout_seconds": DEADLINE}) as (d, pw):
        alice, bob = d.accounts["alice"].name, d.accounts["bob"].name
        pw["carol"], pw["dave"] = secrets.token_urlsafe(12), secrets.token_urlsafe(12)
        d.accounts["carol"] = factory.user(password=pw["carol"])
        d.accounts["dave"] = factory.user(password=pw["dave"])  # an account no principal is bound to
        users_path = Path(d.config_path).parent / "users.yaml"
        users = identity.load_users(users_path)
        d.tokens["alice2"], rec = identity.new_token()
        users["alice2"] = identity.UserRecord(name="alice2", os_user=alice, tokens=[rec])
        d.tokens["carol"], rec = identity.new_token()
        users["carol"] = identity.UserRecord(name="carol", os_user=d.accounts["carol"].name, tokens=[rec])
        identity.save_users(users_path, users)
        d.write_grants(grants_of(d))
        for name in ("one.txt", "two.txt", "three.txt", "four.txt", "five.txt"):
            (d.app / name).write_text(f"{name} text\n")
        for sub in ("sub", "sub2"):
            (d.app / sub).mkdir(exist_ok=True)
            os.chmod(d.app / sub, 0o755)
        d.pw = pw  # type: ignore[attr-defined]
        time.sleep(1.5)  # the users file and the grants reloaded
        del bob
        try:
            yield d, pw
        finally:
            d.accounts.pop("carol")
            d.accounts.pop("dave")
            factory.cleanup()


def grants_of(d: PrivsepDaemon, list_by: list[str] | None = None, list_for: str = "1h") -> dict[str, Any]:
    alice, bob = d.accounts["alice"].name, d.accounts["bob"].name
    alice_group = grp.getgrgid(d.accounts["alice"].gid).gr_name
    app = [str(d.app)]
    by = list_by if list_by is not None else ["bob", "%" + alice_group]
    return {"users": {
        alice: {"privileged": {"tools": {
            "files/read": {"allowed": True, "paths": app, "approve": {"by": ["bob", "alice2"]}},
            "files/list": {"allowed": True, "paths": app, "approve": {"by": by, "for": list_for}}}}},
        bob: {"privileged": {"tools": {
            "files/read": {"allowed": True, "paths": app},
            "files/list": {"allowed": True, "paths": app, "approve": {"by": ["alice"]}}}}},
        d.accounts["carol"].name: {"privileged": {"tools": {"files/read": {"allowed": True, "paths": app}}}}}}


def confirms(d: PrivsepDaemon, **match: Any) -> list[dict[str, Any]]:
    return [r for r in d.audit() if r.get("event") == "confirm" and all(r.get(k) == v for k, v in match.items())]


def is_error(result: dict[str, Any]) -> str | None:
    """The refusal's reason of a tools/call result, or None when it succeeded."""
    if not result.get("isError"):
        return None
    return str(result["structuredContent"]["error"]["details"].get("reason"))


# ---------------------------------------------------------------- who may use a record


def test_a_record_is_not_usable_by_another_token_or_principal_of_the_same_account(attackd: Any) -> None:
    d, _ = attackd
    path = str(d.app / "one.txt")
    first = call(d, d.tokens["alice"], call_body(path))
    cid = first["requestState"]
    login_client.approve(d.url, d.tokens["bob"], cid, d.cacert)
    # alice2 (same OS account, another principal) names alice's approved record: judged as a first call
    other = call(d, d.tokens["alice2"], call_body(path, state=cid, rid=2))
    assert other["resultType"] == "input_required" and other["requestState"] != cid
    # bob (who has his own grant on this path) names it: his own decision, the record stays alice's
    bobs = call(d, d.tokens["bob"], call_body(path, state=cid, rid=3))
    assert bobs["resultType"] == "complete"
    assert [r["decision"] for r in confirms(d, confirm_id=cid)] == ["requested", "approved"]
    mine = call(d, d.tokens["alice"], call_body(path, state=cid, rid=4))
    assert mine["resultType"] == "complete" and mine["content"][0]["text"] == "one.txt text\n"


def test_a_record_is_not_reused_for_another_path_spelling_or_tool(attackd: Any) -> None:
    d, _ = attackd
    path = str(d.app / "two.txt")
    first = call(d, d.tokens["alice"], call_body(path))
    cid = first["requestState"]
    login_client.approve(d.url, d.tokens["bob"], cid, d.cacert)
    for i, other in enumerate([str(d.app / "three.txt"), str(d.app / "sub/../three.txt"),
                               str(d.app / "three.txt") + "/", str(d.app / "tw\u006f.txt\u200b")]):
        asked = call(d, d.tokens["alice"], call_body(other, state=cid, rid=10 + i))
        assert asked.get("resultType") == "input_required" or is_error(asked), (other, asked)
        assert asked.get("requestState") != cid
    listed = call(d, d.tokens["alice"], call_body(path, state=cid, rid=20, tool="files/list"))
    assert listed.get("requestState") != cid
    # another spelling of the same file is asked again (the record holds the spelling the approver saw)
    for i, spelling in enumerate([str(d.app / "sub/.." / "two.txt"), str(d.app) + "//two.txt",
                                  str(d.app) + "/./two.txt"]):
        asked = call(d, d.tokens["alice"], call_body(spelling, state=cid, rid=30 + i))
        assert asked["resultType"] == "input_required" and asked["requestState"] != cid
    same = call(d, d.tokens["alice"], call_body(path, state=cid, rid=21))
    assert same["resultType"] == "complete" and same["content"][0]["text"] == "two.txt text\n"
    again = call(d, d.tokens["alice"], call_body(path, state=cid, rid=22))
    assert again["resultType"] == "input_required"  # used once


def test_forged_and_foreign_ids_are_refused_alike(attackd: Any) -> None:
    d, _ = attackd
    bobs = call(d, d.tokens["bob"], call_body(str(d.app), tool="files/list"))
    foreign = bobs["requestState"]
    forged = "A" * len(foreign)
    for cid in (foreign, forged):
        asked = call(d, d.tokens["alice"], call_body(str(d.app / "three.txt"), state=cid))
        assert asked["resultType"] == "input_required" and asked["requestState"] not in (foreign, forged)
    with pytest.raises(UsageError) as unknown:
        login_client.approve(d.url, d.tokens["alice"], forged, d.cacert)
    assert "unknown, used or expired" in str(unknown.value)
    for bad in ("x" * 65, "%2e%2e", forged + "%00"):
        assert page(d, f"{d.url}/confirm/{bad}").status_code == 404


# ---------------------------------------------------------------- who may approve


def test_own_request_is_refused_through_a_group_and_a_second_principal(attackd: Any) -> None:
    d, pw = attackd
    alice = d.accounts["alice"].name
    listing = call(d, d.tokens["alice"], call_body(str(d.app / "sub"), tool="files/list"))
    cid = listing["requestState"]
    with pytest.raises(AuthError, match="your own request"):  # alice is in %her group, an approver
        login_client.approve(d.url, d.tokens["alice"], cid, d.cacert)
    refused = sign_in(d, page_url(listing), alice, pw["alice"], decision="approve")
    assert refused.status_code == 403 and "your own request" in refused.text
    reading = call(d, d.tokens["alice"], call_body(str(d.app / "four.txt")))
    with pytest.raises(AuthError, match="your own request"):  # alice2 is named, but is alice's account
        login_client.approve(d.url, d.tokens["alice2"], reading["requestState"], d.cacert)
    with pytest.raises(AuthError, match="not an approver"):  # the root principal, not named
        login_client.approve(d.url, d.tokens["rooty"], reading["requestState"], d.cacert)
    for cid_ in (cid, reading["requestState"]):
        assert call(d, d.tokens["alice"], call_body(str(d.app / "x"), state=cid_)).get("requestState") != cid_
    reasons = [r["reason"] for r in confirms(d, decision="refused") if r["confirm_id"] in (cid, reading["requestState"])]
    assert sorted(reasons) == ["not an approver of this grant", "own request", "own request", "own request"]
    assert all(r.get("by") and r["user"] == "alice" for r in confirms(d, decision="refused"))


def test_strangers_signing_in_on_the_page_are_refused_and_recorded(attackd: Any) -> None:
    d, pw = attackd
    first = call(d, d.tokens["alice"], call_body(str(d.app / "four.txt")))
    cid = first["requestState"]
    for who, said in (("carol", "not an approver"), ("dave", "authentication failed")):
        refused = sign_in(d, page_url(first), d.accounts[who].name, pw[who], decision="approve")
        assert refused.status_code == 403 and said in refused.text
    assert page(d, page_url(first)).status_code == 200  # still waiting
    seen = [(r["by"], r["reason"]) for r in confirms(d, confirm_id=cid, decision="refused")]
    assert seen == [("carol", "not an approver of this grant")]
    logins = [r for r in d.audit() if r.get("event") == "login" and r.get("route") == "confirm"
              and d.accounts["dave"].name in (r.get("user"), r.get("os_user"))]
    assert logins and pw["dave"] not in d.audit_text(), "dave's refused sign-in on the page is recorded"
    assert all(r["user"] == "alice" and r["peer"] for r in confirms(d, confirm_id=cid, decision="refused"))


def test_an_approval_for_a_while_covers_no_other_principal_or_path(attackd: Any) -> None:
    d, _ = attackd
    path = str(d.app)
    first = call(d, d.tokens["alice"], call_body(path, tool="files/list"))
    login_client.approve(d.url, d.tokens["bob"], first["requestState"], d.cacert)
    done = call(d, d.tokens["alice"], call_body(path, tool="files/list", state=first["requestState"], rid=2))
    assert done["resultType"] == "complete"
    assert call(d, d.tokens["alice"], call_body(path, tool="files/list", rid=3))["resultType"] == "complete"
    assert call(d, d.tokens["alice2"], call_body(path, tool="files/list", rid=4))["resultType"] == "input_required"
    assert call(d, d.tokens["alice"], call_body(path + "/sub", tool="files/list", rid=5))["resultType"] == "input_required"
    assert call(d, d.tokens["alice"], call_body(path + "/one.txt", rid=6))["resultType"] == "input_required"
    approved = confirms(d, confirm_id=first["requestState"], decision="approved")
    assert approved[0]["covers_seconds"] == 3600 and approved[0]["by"] == "bob" and approved[0]["user"] == "alice"


def test_concurrent_retries_of_one_approval_run_one_call(attackd: Any) -> None:
    d, _ = attackd
    path = str(d.app / "five.txt")
    first = call(d, d.tokens["alice"], call_body(path))
    login_client.approve(d.url, d.tokens["bob"], first["requestState"], d.cacert)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: call(d, d.tokens["alice"], call_body(path, state=first["requestState"],
                                                                                 rid=i)), range(8)))
    assert [r["resultType"] for r in results].count("complete") == 1, results
    steps = confirms(d, confirm_id=first["requestState"])
    assert [r["decision"] for r in steps] == ["requested", "approved", "used"]
    assert all((r["user"], r["os_user"], r["tool"], r["requested_path"]) == ("alice", d.accounts["alice"].name,
                                                                           "files/read", path) for r in steps)
    assert len({r["token_id"] for r in steps}) == 1 and steps[0]["token_id"] in d.tokens["alice"]
    assert [r.get("by") for r in steps] == [None, "bob", "bob"] and steps[1]["peer"]


# ---------------------------------------------------------------- the page: CSRF, framing, injection


def test_the_form_needs_its_own_token_and_origin(attackd: Any) -> None:
    d, pw = attackd
    bob = d.accounts["bob"].name
    one = call(d, d.tokens["alice"], call_body(str(d.app / "five.txt")))
    two = call(d, d.tokens["alice"], call_body(str(d.app / "five.txt"), rid=2))
    url, other_url = page_url(one), page_url(two)
    token, other_token = csrf_of(page(d, url).text), csrf_of(page(d, other_url).text)
    assert token != other_token
    base = {"user": bob, "password": pw["bob"], "decision": "approve"}
    for fields, origin in [({**base, "csrf": other_token}, "same"), ({**base, "csrf": token.upper()}, "same"),
                           ({**base, "csrf": token}, "null"), ({**base, "csrf": token}, "https://evil.example"),
                           ({**base, "csrf": token}, d.url.replace("https", "http")),
                           ({**base, "csrf": token}, d.url + ".evil.example")]:
        assert submit(d, url, fields, origin=origin).status_code == 403, (fields["csrf"] == token, origin)
    assert page(d, url).status_code == 200  # nothing was decided
    assert len([r for r in confirms(d, confirm_id=one["requestState"], decision="refused")
                if r["reason"] == "csrf token missing or wrong"]) == 2
    good = submit(d, url, {**base, "csrf": token})
    assert good.status_code == 200 and "approved" in good.text


def test_a_form_without_a_token_is_refused_and_recorded(attackd: Any) -> None:
    d, pw = attackd
    first = call(d, d.tokens["alice"], call_body(str(d.app / "five.txt")))
    url = page_url(first)
    refused = submit(d, url, {"user": d.accounts["bob"].name, "password": pw["bob"], "decision": "approve"})
    assert refused.status_code == 403
    assert [r["reason"] for r in confirms(d, confirm_id=first["requestState"], decision="refused")] == [
        "csrf token missing or wrong"]


def test_a_malformed_form_is_a_clear_refusal(attackd: Any) -> None:
    d, pw = attackd
    first = call(d, d.tokens["alice"], call_body(str(d.app / "five.txt")))
    url = page_url(first)
    token = csrf_of(page(d, url).text)
    fields = {"csrf": token, "user": d.accounts["bob"].name, "password": pw["bob"], "decision": "approve"}
    padded = "&".join([f"{k}={v}" for k, v in fields.items()] + [f"x{i}=1" for i in range(8)])
    with httpx.Client(verify=ssl_context(d.cacert), timeout=30) as c:
        many = c.post(url, content=padded, headers={"Content-Type": "application/x-www-form-urlencoded"})
        big = c.post(url, content="csrf=" + "a" * 9000, headers={"Content-Type": "application/x-www-form-urlencoded"})
        binary = c.post(url, content=b"\xff\xfe\x00csrf=\x80", headers={"Content-Type": "application/x-www-form-urlencoded"})
        unknown = c.post(url, data={**fields, "decision": "approve-all"})
    assert many.status_code == 400 and "too many fields" in many.text
    assert big.status_code == 413 and binary.status_code == 403
    assert unknown.status_code == 403 and "unknown decision" in unknown.text
    assert page(d, url).status_code == 200  # still waiting
    assert submit(d, url, fields).status_code == 200


def test_the_page_cannot_be_framed_and_escapes_what_the_agent_controls(attackd: Any) -> None:
    d, _ = attackd
    name = '"><img src=x onerror=alert(1)><script>alert(2)<\\script>.txt'
    (d.app / name).write_text("x\n")
    why = "</dd><form action=https://evil.example><input name=password></form><script>alert(3)</script>"
    first = call(d, d.tokens["alice"], call_body(str(d.app / name), why=why))
    shown = page(d, page_url(first))
    assert shown.status_code == 200
    for raw in ("<script", "<img", "<form action=https", "<input name=password"):
        assert raw not in shown.text
    assert "&lt;script&gt;alert(3)" in shown.text and "&lt;img src=x" in shown.text
    assert shown.text.count("<form") == 1
    for resp in (shown, page(d, f"{d.url}/confirm/{'Z' * 32}")):
        assert "frame-ancestors 'none'" in resp.headers["content-security-policy"]
        assert resp.headers["x-frame-options"] == "DENY" and resp.headers["cache-control"] == "no-store"


def test_the_page_shows_bidi_and_invisible_characters_as_escapes(attackd: Any) -> None:
    d, _ = attackd
    name = "report\u202etxt.exe\u200b"  # shown raw, it would read "reportexe.txt"
    first = call(d, d.tokens["alice"], call_body(str(d.app / name), why="fine\u202e.enif\u2066"))
    shown = page(d, page_url(first))
    assert shown.status_code == 200
    for raw in ("\u202e", "\u200b", "\u2066"):
        assert raw not in shown.text
    assert "report\\u202etxt.exe\\u200b" in shown.text and "fine\\u202e.enif\\u2066" in shown.text


def test_the_approvers_terminal_sees_no_control_characters_from_the_agent(attackd: Any) -> None:
    d, _ = attackd
    name = "\x1b]0;owned\x07\x1b[2Jclean.txt"
    (d.app / name).write_text("x\n")
    first = call(d, d.tokens["alice"], call_body(str(d.app / name), why="\x1b[31mred\r\nfake line"))
    if first.get("resultType") != "input_required":  # the path was refused before any record: nothing to show
        assert is_error(first), first
        return
    env = {**os.environ, "MCPD_URL": d.url, "MCP_TOKEN": d.tokens["bob"], "MCPD_CACERT": d.cacert}
    linuxctl = str(Path(sys.executable).with_name("linuxctl"))
    done = subprocess.run([linuxctl, "approve", "--deny", first["requestState"]], env=env, capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert b"\x1b" not in done.stderr + done.stdout and b"\x07" not in done.stderr + done.stdout
    tail = subprocess.run([str(Path(sys.executable).with_name("mcpd")), "audit", "tail", "--config",
                           str(d.config_path), "--event", "confirm", "-n", "40"], capture_output=True, timeout=60)
    assert tail.returncode == 0, tail.stderr
    assert b"clean.txt" in tail.stdout and b"denied" in tail.stdout
    assert b"\x1b" not in tail.stdout + tail.stderr and b"\r" not in tail.stdout


# ---------------------------------------------------------------- floods and held capacity


def test_waiting_approvals_of_one_principal_do_not_stall_others(attackd: Any) -> None:
    d, _ = attackd
    path = str(d.app / "three.txt")
    with concurrent.futures.ThreadPoolExecutor(CALL_SHARE + 2) as pool:
        waiting = [pool.submit(call, d, d.tokens["alice"], call_body(path, caps={}, rid=i)) for i in range(CALL_SHARE + 2)]
        time.sleep(2.0)  # her calls wait (non-interactive) for an approver, up to their deadline
        started = time.monotonic()
        bobs = call(d, d.tokens["bob"], call_body(str(d.app / "one.txt"), caps={}, rid=99))
        took = time.monotonic() - started
        outcomes = [f.result() for f in waiting]
    assert bobs["content"][0]["text"] == "one.txt text\n"
    assert took < 3.0, f"bob's unrelated privileged read took {took:.1f} s"
    assert all(r.get("isError") for r in outcomes)  # her own calls: refused in time, or queued past it


def test_waiting_approvals_of_two_principals_do_not_stall_a_third(attackd: Any) -> None:
    d, _ = attackd
    assert 2 * CALL_SHARE >= CALL_CONNECTIONS and PER_ACCOUNT >= CALL_SHARE
    calls = [("alice", call_body(str(d.app / "three.txt"), caps={}, rid=i)) for i in range(CALL_SHARE)]
    calls += [("bob", call_body(str(d.app / "sub"), caps={}, tool="files/list", rid=100 + i))
              for i in range(CALL_SHARE)]
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        waiting = [pool.submit(call, d, d.tokens[who], body) for who, body in calls]
        time.sleep(2.0)  # alice's and bob's calls wait for an approver, holding every call connection
        started = time.monotonic()
        carols = call(d, d.tokens["carol"], call_body(str(d.app / "one.txt"), caps={}, rid=999))
        took = time.monotonic() - started
        outcomes = [str(f.result()) for f in waiting]
    assert carols["content"][0]["text"] == "one.txt text\n"
    assert took < 3.0, f"carol's unrelated privileged read took {took:.1f} s"
    # past each principal's few waits a call is refused at once, clearly; the others time out
    over = [o for o in outcomes if "are already waiting for a sign-in or an approval" in o]
    assert len(over) == 2 * (CALL_SHARE - WAITS_PER_PRINCIPAL) and all("RATE_LIMITED" in o for o in over)
    assert all("no approver decided in time" in o for o in outcomes if o not in over)


def test_a_flood_of_records_by_one_principal_does_not_expire_anothers(attackd: Any) -> None:
    d, _ = attackd
    victim = call(d, d.tokens["bob"], call_body(str(d.app), tool="files/list"))
    url = page_url(victim)
    body = call_body(str(d.app / "one.txt"))
    headers = {"Authorization": f"Bearer {d.tokens['alice']}", "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json", "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call",
               "Mcp-Name": "files/read"}

    def flood(n: int) -> int:
        asked = 0
        with httpx.Client(verify=ssl_context(d.cacert), timeout=60) as c:
            for _ in range(n):
                r = c.post(d.url + "/mcp", json=body, headers=headers)
                asked += r.status_code == 200 and r.json()["result"].get("resultType") == "input_required"
        return asked

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        asked = sum(pool.map(flood, [confirm_store.MAX_PENDING // 4 + 5] * 4))
    assert asked >= 1
    assert page(d, url).status_code == 200, "bob's waiting approval was pushed out by alice's flood"
    login_client.approve(d.url, d.tokens["alice"], victim["requestState"], d.cacert)
    done = call(d, d.tokens["bob"], call_body(str(d.app), tool="files/list", state=victim["requestState"], rid=2))
    assert done["resultType"] == "complete"


# ---------------------------------------------------------------- reloads


def test_a_reload_that_removes_the_approver_ends_approvals_in_force(attackd: Any) -> None:
    d, _ = attackd
    path = str(d.app / "sub")
    first = call(d, d.tokens["alice"], call_body(path, tool="files/list"))
    login_client.approve(d.url, d.tokens["bob"], first["requestState"], d.cacert)
    pending = call(d, d.tokens["alice"], call_body(str(d.app / "sub2"), tool="files/list", rid=5))
    login_client.approve(d.url, d.tokens["bob"], pending["requestState"], d.cacert)
    try:
        d.write_grants(grants_of(d, list_by=["rooty"], list_for="0"))  # bob is no approver any more
        time.sleep(1.5)
        covered = call(d, d.tokens["alice"], call_body(path, tool="files/list", rid=2))
        retried = call(d, d.tokens["alice"], call_body(str(d.app / "sub2"), tool="files/list", rid=6,
                                                         state=pending["requestState"]))
    finally:
        d.write_grants(grants_of(d))
        time.sleep(1.5)
    assert covered["resultType"] == "input_required", "bob's 1h approval outlived his removal"
    assert retried["resultType"] == "input_required", "bob's decision under the old rule was honoured"


def test_a_reload_that_adds_approve_makes_the_next_call_wait(attackd: Any) -> None:
    d, _ = attackd
    assert call(d, d.tokens["bob"], call_body(str(d.app / "two.txt"), caps={}))["resultType"] == "complete"
    grants = grants_of(d)
    grants["users"][d.accounts["bob"].name]["privileged"]["tools"]["files/read"]["approve"] = {"by": ["alice"]}
    try:
        d.write_grants(grants)
        time.sleep(1.5)
        asked = call(d, d.tokens["bob"], call_body(str(d.app / "two.txt"), rid=2))
    finally:
        d.write_grants(grants_of(d))
        time.sleep(1.5)
    assert asked["resultType"] == "input_required"
    assert call(d, d.tokens["bob"], call_body(str(d.app / "two.txt"), caps={}, rid=3))["resultType"] == "complete"


# ---------------------------------------------------------------- expiry

EXPIRY = 3


@pytest.fixture(scope="module")
def shortd() -> Iterator[tuple[PrivsepDaemon, dict[str, str]]]:
    """Records live :data:`EXPIRY` seconds; alice's files/read waits for bob, one approval covering
    2 s; her files/list needs a sign-in within the hour."""
    with confirm_daemon({"files/read": {"approve": {"by": ["bob"], "for": "2s"}},
                         "files/list": {"reauth_after": "1h"}},
                        {"max_failures": 50, "free_failures": 50, "confirm_seconds": EXPIRY}) as found:
        found[0].log_file.write_text("log\n")
        yield found


def test_an_expired_record_is_recorded_when_it_expires_and_is_dead(shortd: Any) -> None:
    d, pw = shortd
    approval = call(d, d.tokens["alice"], call_body(str(d.log_file)))
    signin = call(d, d.tokens["alice"], call_body(str(d.app), tool="files/list", rid=2))
    token = csrf_of(page(d, page_url(signin)).text)
    time.sleep(EXPIRY + 1.5)  # nobody looks at either record meanwhile
    for cid, kind in ((approval["requestState"], "approve"), (signin["requestState"], "signin")):
        gone = confirms(d, confirm_id=cid, decision="expired")
        assert len(gone) == 1 and gone[0]["kind"] == kind and gone[0]["user"] == "alice", cid
        assert gone[0]["os_user"] == d.accounts["alice"].name and gone[0]["token_id"]
    assert page(d, page_url(approval)).status_code == 404
    late = submit(d, page_url(signin), {"csrf": token, "user": d.accounts["alice"].name, "password": pw["alice"],
                                         "decision": "signin"})
    assert late.status_code == 404
    with pytest.raises(UsageError, match="unknown, used or expired"):
        login_client.approve(d.url, d.tokens["bob"], approval["requestState"], d.cacert)
    again = call(d, d.tokens["alice"], call_body(str(d.log_file), state=approval["requestState"], rid=3))
    assert again["resultType"] == "input_required" and again["requestState"] != approval["requestState"]


def test_an_approval_for_a_while_ends_at_its_time(shortd: Any) -> None:
    d, _ = shortd
    first = call(d, d.tokens["alice"], call_body(str(d.log_file)))
    login_client.approve(d.url, d.tokens["bob"], first["requestState"], d.cacert)
    assert call(d, d.tokens["alice"], call_body(str(d.log_file), state=first["requestState"], rid=2))[
        "resultType"] == "complete"
    assert call(d, d.tokens["alice"], call_body(str(d.log_file), rid=3))["resultType"] == "complete"  # within 2 s
    time.sleep(2.5)
    assert call(d, d.tokens["alice"], call_body(str(d.log_file), rid=4))["resultType"] == "input_required"


# ---------------------------------------------------------------- a symlink under a grant of `/`


@pytest.fixture(scope="module")
def rootd() -> Iterator[tuple[PrivsepDaemon, dict[str, str]]]:
    """alice's files/read covers `/` (symlinks followed, §4.3) and waits for bob's approval."""
    with confirm_daemon({"files/read": {"paths": ["/"], "approve": {"by": ["bob"]}}},
                        {"max_failures": 50, "free_failures": 50}) as found:
        yield found


def test_an_approved_symlink_repointed_before_the_retry_is_asked_again(rootd: Any) -> None:
    d, _ = rootd
    (d.app / "notes.txt").write_text("harmless notes\n")
    (d.app / "payroll.txt").write_text("salaries\n")
    link = d.app / "today.txt"
    link.symlink_to(d.app / "notes.txt")
    first = call(d, d.tokens["alice"], call_body(str(link)))
    shown = page(d, page_url(first)).text
    assert str(link) in shown and "payroll" not in shown  # what the approver sees, and approves
    assert "Resolves to" in shown and str(d.app / "notes.txt") in shown
    said = login_client.approve(d.url, d.tokens["bob"], first["requestState"], d.cacert)
    assert said["view"]["resolves_to"] == str(d.app / "notes.txt")
    link.unlink()
    link.symlink_to(d.app / "payroll.txt")  # the requester's account re-points its own link
    retry = call(d, d.tokens["alice"], call_body(str(link), state=first["requestState"], rid=2))
    assert retry.get("resultType") == "input_required" or is_error(retry), retry
    assert "salaries" not in str(retry)
    if retry.get("resultType") == "input_required":  # asked again: the new record shows the new target
        assert str(d.app / "payroll.txt") in page(d, page_url(retry)).text
    assert '"the path resolves elsewhere now"' in d.audit_text()


def test_a_symlink_repointed_while_its_call_waits_is_refused(rootd: Any) -> None:
    d, _ = rootd
    (d.app / "memo.txt").write_text("a memo\n")
    (d.app / "bonus.txt").write_text("bonuses\n")
    link = d.app / "latest.txt"
    link.symlink_to(d.app / "memo.txt")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # non-interactive: it waits for bob
        waiting = pool.submit(call, d, d.tokens["alice"], call_body(str(link), caps={}, rid=7))
        for _ in range(50):
            asked = confirms(d, decision="requested", requested_path=str(link))
            if asked:
                break
            time.sleep(0.1)
        assert asked and asked[0]["resolves_to"] == str(d.app / "memo.txt")
        link.unlink()
        link.symlink_to(d.app / "bonus.txt")
        login_client.approve(d.url, d.tokens["bob"], asked[0]["confirm_id"], d.cacert)
        result = waiting.result()
    assert is_error(result) == "the path resolves to another file than the one approved", result
    assert "bonuses" not in str(result)


# ---------------------------------------------------------------- passwords (last: locks bob's account)


def test_the_page_password_is_under_the_login_lockout(attackd: Any) -> None:
    d, pw = attackd
    bob = d.accounts["bob"].name
    first = call(d, d.tokens["alice"], call_body(str(d.app / "four.txt")))
    url = page_url(first)
    token = csrf_of(page(d, url).text)
    for i in range(6):  # alice (the requester) guesses bob's password on her own record's page
        wrong = submit(d, url, {"csrf": token, "user": bob, "password": f"guess{i}", "decision": "approve"})
        assert wrong.status_code == 403 and "authentication failed" in wrong.text
    right = submit(d, url, {"csrf": token, "user": bob, "password": pw["bob"], "decision": "approve"})
    assert right.status_code == 403 and "authentication failed" in right.text  # locked out now
    assert page(d, url).status_code == 200  # still waiting: nothing was decided
    # bob's bearer token still decides (a lockout of his password does not stop his approvals)
    login_client.approve(d.url, d.tokens["bob"], first["requestState"], d.cacert)
    done = call(d, d.tokens["alice"], call_body(str(d.app / "four.txt"), state=first["requestState"], rid=2))
    assert done["resultType"] == "complete"
    assert pw["bob"] not in d.audit_text()
