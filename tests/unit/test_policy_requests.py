"""The policy process's request table (mcpd.policy.requests), held to the one schema check of
the wire layer: what it serves, each type's capacity class, and the refusals that end a front
connection with an audit alert."""

from __future__ import annotations

from typing import Any

import pytest

from mcpd.common.identity import MAX_JWT_CHARS
from mcpd.policy.requests import CLASSES, REQUESTS, check_request
from mcpd.policy.state import Refused

CALL = {"type": "privileged_call", "id": 7, "token": "t", "session": "s", "peer": "127.0.0.1", "op": "files/read",
        "args": {"path": "/etc/hosts"}}


def test_the_table_serves_nine_requests_each_in_its_class() -> None:
    assert {name: entry.pool for name, entry in REQUESTS.items()} == {
        "authenticate": "auth", "revoke": "auth", "spawn_worker": "spawn", "kill_worker": "spawn",
        "privileged_call": "call", "pam_login": "login", "confirm_view": "auth", "confirm_answer": "login",
        "confirm_decide": "auth"}
    assert {entry.pool for entry in REQUESTS.values()} == set(CLASSES)
    assert all(entry.doc for entry in REQUESTS.values())


def test_a_request_that_fits_gets_its_entry() -> None:
    assert check_request(CALL).name == "privileged_call"
    assert check_request(dict(CALL, cap=10, worker=123, rid=4)).handler is REQUESTS["privileged_call"].handler
    traced = dict(CALL, traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", tracestate="a=1")
    assert check_request(traced).name == "privileged_call"
    assert check_request({"type": "kill_worker", "id": 1, "token": "t", "pid": 5}).name == "kill_worker"


@pytest.mark.parametrize(("req", "reason"), [
    ({"type": "shutdown", "id": 1}, "unknown request type"),
    ({"type": 3, "id": 1}, "unknown request type"),
    (dict(CALL, extra=1), "privileged_call: unknown key 'extra'"),
    ({k: v for k, v in CALL.items() if k != "op"}, "privileged_call: missing key 'op'"),
    (dict(CALL, token="t" * (MAX_JWT_CHARS + 1)), "privileged_call: malformed key 'token'"),
    (dict(CALL, worker=True), "privileged_call: malformed key 'worker'"),
    (dict(CALL, traceparent="0" * 56), "privileged_call: malformed key 'traceparent'"),
    (dict(CALL, tracestate=["a=1"]), "privileged_call: malformed key 'tracestate'"),
    (dict(CALL, tracestate="a=" * 300), "privileged_call: malformed key 'tracestate'"),
    (dict(CALL, args=["/etc"]), "privileged_call: malformed key 'args'"),
    (dict(CALL, id="7"), "privileged_call: malformed key 'id'"),
    ({"type": "pam_login", "id": 1, "user": "u" * 65, "password": "p", "peer": "x"}, "pam_login: malformed key 'user'"),
    ({"type": "kill_worker", "id": 1, "token": "t", "pid": 1.0}, "kill_worker: malformed key 'pid'"),
])
def test_a_request_that_does_not_fit_is_refused_with_its_reason(req: dict[str, Any], reason: str) -> None:
    with pytest.raises(Refused) as refused:
        check_request(req)
    assert str(refused.value) == reason
