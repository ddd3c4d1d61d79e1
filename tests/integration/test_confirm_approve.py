"""Approval grants (``approve: {by, for}``, docs/REFERENCE.md §4.7) end to end: real PAM, real
OS accounts, the root helper and the front's page; the approver approves on the page (password)
or with ``linuxctl approve`` (bearer token). The requester's client is driven over raw HTTP
(2026-07-28 requests; the pinned TypeScript SDK does not speak that revision).

The attacks: an approval for one path reused for another, approving one's own request when the
grant forbids it, and someone the grant does not name approving.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.client import login as login_client
from mcpd.client.errors import AuthError
from tests.support.confirm import call, call_body, confirm_daemon, page, page_url, sign_in
from tests.support.privsep_fixture import PrivsepDaemon

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def appd() -> Iterator[tuple[PrivsepDaemon, dict[str, str]]]:
    """alice's files/read needs an approval by bob (or alice herself, which ``self`` forbids), for 1h."""
    with confirm_daemon({"files/read": {"approve": {"by": ["bob", "alice"], "for": "1h"}},
                         "files/list": {"reauth_after": "1h", "approve": {"by": ["bob"]}}},
                        {"max_failures": 50, "free_failures": 50}) as found:
        for name in ("one.txt", "two.txt", "three.txt", "four.txt"):
            (found[0].app / name).write_text(f"{name} text\n")
        yield found


def confirm_records(d: PrivsepDaemon, path: str) -> list[dict[str, Any]]:
    return [r for r in d.audit() if r.get("event") == "confirm" and r.get("requested_path") == path]


def test_approved_on_the_page_then_covered_for_that_path_only(appd: Any) -> None:
    d, pw = appd
    path = str(d.app / "one.txt")
    first = call(d, d.tokens["alice"], call_body(path, why="checking the nightly job"))
    url = page_url(first)
    shown = page(d, url)
    assert "checking the nightly job" in shown.text and path in shown.text and "Approve" in shown.text
    done = sign_in(d, url, d.accounts["bob"].name, pw["bob"], decision="approve")
    assert done.status_code == 200 and "approved" in done.text
    retry = call(d, d.tokens["alice"], call_body(path, state=first["requestState"], rid=2))
    assert retry["resultType"] == "complete" and retry["content"][0]["text"] == "one.txt text\n"
    again = call(d, d.tokens["alice"], call_body(path, rid=3))  # within `for: 1h`: no new approval
    assert again["resultType"] == "complete"
    other = call(d, d.tokens["alice"], call_body(str(d.app / "two.txt"), rid=4))  # another path: asked again
    assert other["resultType"] == "input_required"
    steps = [(r["decision"], r.get("by")) for r in confirm_records(d, path)]
    assert steps[:3] == [("requested", None), ("approved", "bob"), ("used", "bob")]
    assert all(r["user"] == "alice" for r in confirm_records(d, path))
    assert [r for r in confirm_records(d, path) if r["decision"] == "requested"][0]["why"] == "checking the nightly job"


def test_own_request_cannot_be_approved_and_strangers_cannot_approve(appd: Any) -> None:
    d, pw = appd
    path = str(d.app / "three.txt")
    first = call(d, d.tokens["alice"], call_body(path))
    cid = first["requestState"]
    with pytest.raises(AuthError, match="your own request"):
        login_client.approve(d.url, d.tokens["alice"], cid, d.cacert)
    refused = sign_in(d, page_url(first), d.accounts["alice"].name, pw["alice"], decision="approve")
    assert refused.status_code == 403 and "your own request" in refused.text
    retry = call(d, d.tokens["alice"], call_body(path, state=cid, rid=2))
    assert retry["resultType"] == "input_required" and retry["requestState"] == cid
    assert [r["reason"] for r in confirm_records(d, path) if r["decision"] == "refused"] == ["own request"] * 2


def test_a_rule_with_reauth_after_and_approve_needs_both(appd: Any) -> None:
    d, pw = appd
    path = str(d.app)
    first = call(d, d.tokens["alice"], call_body(path, tool="files/list"))
    assert "Sign in" in page(d, page_url(first)).text
    assert sign_in(d, page_url(first), d.accounts["alice"].name, pw["alice"]).status_code == 200
    second = call(d, d.tokens["alice"], call_body(path, tool="files/list", state=first["requestState"], rid=2))
    assert second["resultType"] == "input_required" and second["requestState"] != first["requestState"]
    assert "Approve" in page(d, page_url(second)).text  # signed in: now the approval
    login_client.approve(d.url, d.tokens["bob"], second["requestState"], d.cacert)
    done = call(d, d.tokens["alice"], call_body(path, tool="files/list", state=second["requestState"], rid=3))
    assert done["resultType"] == "complete" and "one.txt" in str(done["content"])


def test_mcpd_approve_command_approves_as_the_tokens_principal(appd: Any) -> None:
    d, _ = appd
    path = str(d.app / "two.txt")
    first = call(d, d.tokens["alice"], call_body(path))
    env = {**os.environ, "MCPD_URL": d.url, "MCP_TOKEN": d.tokens["bob"], "MCPD_CACERT": d.cacert}
    mcpd = str(Path(sys.executable).with_name("mcpd"))
    done = subprocess.run([mcpd, "approve", first["requestState"]], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"approved: the waiting call may go on: alice files/read {path}" in done.stderr
    again = subprocess.run([mcpd, "approve", first["requestState"]], env=env, capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 2 and "unknown, used or expired" in again.stderr  # decided already
    retry = call(d, d.tokens["alice"], call_body(path, state=first["requestState"], rid=2))
    assert retry["resultType"] == "complete" and retry["content"][0]["text"] == "two.txt text\n"


def test_denied_with_linuxctl_approve_and_a_waiting_call(appd: Any) -> None:
    d, _ = appd
    path = str(d.app / "four.txt")
    first = call(d, d.tokens["alice"], call_body(path))
    out: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: out.update(call(d, d.tokens["alice"],
                                                             call_body(path, state=first["requestState"], rid=2))))
    waiter.start()  # the retry waits for the decision (within its deadline)
    time.sleep(1.0)
    answer = login_client.approve(d.url, d.tokens["bob"], first["requestState"], d.cacert, deny=True)
    assert answer["message"] == "denied" and answer["view"]["path"] == path
    waiter.join(30)
    assert out["isError"] is True
    assert out["structuredContent"]["error"]["details"]["reason"] == "the approver denied this call"
    assert [r["decision"] for r in confirm_records(d, path)][-1] == "denied"
