"""Step-up sign-in for ``reauth_after`` on 2026-07-28 requests (docs/REFERENCE.md §4.7), end to
end with real PAM, real OS accounts, the real root helper and the front's own TLS page, driven
over raw HTTP (the pinned TypeScript SDK does not speak the 2026-07-28 revision).

The attacks: the page's link replayed after use, used by another account, used after expiry, a
forged id, a retry naming another principal's record, and a form POST without the page's CSRF
token or from another origin.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.confirm import (
    call,
    call_body,
    confirm_daemon,
    csrf_of,
    page,
    page_url,
    sign_in,
    submit,
)
from tests.support.privsep_fixture import PrivsepDaemon

pytestmark = pytest.mark.root

CONFIRM_SECONDS = 12


@pytest.fixture(scope="module")
def stepd() -> Iterator[tuple[PrivsepDaemon, dict[str, str]]]:
    """The privsep daemon, alice's files/read under ``reauth_after: 1h``, passwords for alice and bob."""
    with confirm_daemon({"files/read": {"reauth_after": "1h"}, "files/list": {"reauth_after": "1h"}}, {"max_failures": 50, "free_failures": 50,
                        "confirm_seconds": CONFIRM_SECONDS}, workers={"per_account": 4, "timeout_seconds": 4}) as found:
        yield found


def confirm_records(d: PrivsepDaemon) -> list[dict[str, Any]]:
    return [r for r in d.audit() if r.get("event") == "confirm"]


def test_stepup_input_required_then_sign_in_then_retry_succeeds(stepd: Any) -> None:
    d, pw = stepd
    alice = d.accounts["alice"].name
    first = call(d, d.tokens["alice"], call_body(str(d.log_file)))
    url = page_url(first)
    assert url.startswith(d.url + "/confirm/") and first["requestState"] in url
    shown = page(d, url)
    assert shown.status_code == 200 and str(d.log_file) in shown.text and alice in shown.text
    csp = shown.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp and "<script" not in shown.text
    assert shown.headers["cache-control"] == "no-store" and shown.headers["x-frame-options"] == "DENY"
    done = sign_in(d, url, alice, pw["alice"])
    assert done.status_code == 200 and "signed in" in done.text
    retry = call(d, d.tokens["alice"], call_body(str(d.log_file), state=first["requestState"], rid=2))
    assert retry.get("isError") is not True, retry
    assert retry["resultType"] == "complete" and retry["content"][0]["text"].startswith("app log line 1")
    steps = [r["decision"] for r in confirm_records(d) if r.get("requested_path") == str(d.log_file)]
    assert steps[-3:] == ["requested", "signed_in", "used"]
    assert pw["alice"] not in d.audit_text()
    # replayed: the record was used; the same requestState is judged as a first call again
    again = call(d, d.tokens["alice"], call_body(str(d.log_file), state=first["requestState"], rid=3))
    assert again["resultType"] == "input_required" and again["requestState"] != first["requestState"]
    assert page(d, url).status_code == 404


def test_a_listing_after_the_sign_in_holds_its_entries(stepd: Any) -> None:
    d, pw = stepd
    first = call(d, d.tokens["alice"], call_body(str(d.app), tool="files/list"))
    assert sign_in(d, page_url(first), d.accounts["alice"].name, pw["alice"]).status_code == 200
    done = call(d, d.tokens["alice"], call_body(str(d.app), tool="files/list", state=first["requestState"], rid=2))
    assert done["resultType"] == "complete" and "log.txt" in str(done["content"])  # the walker judged it alike


def test_without_url_elicitation_the_refusal_says_where_to_log_in(stepd: Any) -> None:
    d, _ = stepd
    result = call(d, d.tokens["alice"], call_body(str(d.log_file), caps={}))
    assert result["isError"] is True
    err = result["structuredContent"]["error"]
    assert err["details"]["reason"] == "reauthentication required" and "linuxctl login" in err["message"]


def test_another_account_cannot_sign_in_for_the_call(stepd: Any) -> None:
    d, pw = stepd
    url = page_url(call(d, d.tokens["alice"], call_body(str(d.log_file))))
    refused = sign_in(d, url, d.accounts["bob"].name, pw["bob"])
    assert refused.status_code == 403 and "only " in refused.text
    assert page(d, url).status_code == 200  # still waiting for alice


def test_wrong_password_does_not_sign_in(stepd: Any) -> None:
    d, _ = stepd
    first = call(d, d.tokens["alice"], call_body(str(d.log_file)))
    refused = sign_in(d, page_url(first), d.accounts["alice"].name, "wrong-password")
    assert refused.status_code == 403 and "authentication failed" in refused.text
    retry = call(d, d.tokens["alice"], call_body(str(d.log_file), state=first["requestState"], rid=2))
    assert retry["resultType"] == "input_required" and retry["requestState"] == first["requestState"]


def test_another_principal_cannot_use_the_record(stepd: Any) -> None:
    d, pw = stepd
    alice = d.accounts["alice"].name
    first = call(d, d.tokens["alice"], call_body(str(d.log_file)))
    assert sign_in(d, page_url(first), alice, pw["alice"]).status_code == 200
    # bob (no grant of his own) retries with alice's record: judged as his own call, refused
    stolen = call(d, d.tokens["bob"], call_body(str(d.log_file), state=first["requestState"]))
    assert stolen.get("isError") is True
    assert stolen["structuredContent"]["error"]["details"]["reason"] == "no grant covers this path"
    # a retry for another path does not use it either
    other = call(d, d.tokens["alice"], call_body(str(d.app / "other.txt"), state=first["requestState"]))
    assert other["resultType"] == "input_required" and other["requestState"] != first["requestState"]
    ok = call(d, d.tokens["alice"], call_body(str(d.log_file), state=first["requestState"]))
    assert ok["resultType"] == "complete" and ok.get("isError") is not True


def test_forged_id_and_csrf_and_origin(stepd: Any) -> None:
    d, pw = stepd
    alice = d.accounts["alice"].name
    forged = d.url + "/confirm/" + secrets.token_urlsafe(24)
    assert page(d, forged).status_code == 404
    assert submit(d, forged, {"csrf": "x" * 32, "user": alice, "password": pw["alice"],
                              "decision": "signin"}).status_code == 404
    url = page_url(call(d, d.tokens["alice"], call_body(str(d.log_file))))
    no_token = submit(d, url, {"user": alice, "password": pw["alice"], "decision": "signin"})
    assert no_token.status_code == 403 and "token" in no_token.text
    wrong = submit(d, url, {"csrf": secrets.token_urlsafe(24), "user": alice, "password": pw["alice"],
                            "decision": "signin"})
    assert wrong.status_code == 403 and "token" in wrong.text
    shown = page(d, url)
    cross = submit(d, url, {"csrf": csrf_of(shown.text), "user": alice, "password": pw["alice"],
                            "decision": "signin"}, origin="https://evil.example")
    assert cross.status_code == 403
    assert page(d, url).status_code == 200  # none of them signed in
    assert any(r.get("reason") == "csrf token missing or wrong" for r in confirm_records(d))


def test_expired_record_is_gone(stepd: Any) -> None:
    d, pw = stepd
    first = call(d, d.tokens["alice"], call_body(str(d.log_file)))
    url = page_url(first)
    time.sleep(CONFIRM_SECONDS + 1)
    assert page(d, url).status_code == 404
    late = submit(d, url, {"csrf": "x" * 32, "user": d.accounts["alice"].name, "password": pw["alice"],
                           "decision": "signin"})
    assert late.status_code == 404
    retry = call(d, d.tokens["alice"], call_body(str(d.log_file), state=first["requestState"]))
    assert retry["resultType"] == "input_required" and retry["requestState"] != first["requestState"]
    assert any(r["decision"] == "expired" and r["confirm_id"] == first["requestState"]
               for r in confirm_records(d))
