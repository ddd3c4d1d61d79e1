"""The one schema check of request tables (mcpd.helper.wire.requests), and root's table held to it."""

from __future__ import annotations

from typing import Any

import pytest

from mcpd.helper.monitor import TABLE
from mcpd.helper.wire.requests import Key, Request, SchemaError, check, table


def _echo(server: Any, req: dict[str, Any]) -> dict[str, Any]:
    return {}


SERVED = table(
    Request("login", {"user": Key(str, longest=8), "args": Key(dict), "cap": Key(int, required=False)}, _echo, "a test"),
    Request("any", {"text": Key(str, longest=0)}, _echo, "no length limit"),
)


def refusal(req: dict[str, Any]) -> str:
    with pytest.raises(SchemaError) as caught:
        check(SERVED, req)
    return str(caught.value)


def test_a_request_that_fits_gets_its_entry() -> None:
    assert check(SERVED, {"type": "login", "id": 1, "user": "alice", "args": {}}) is SERVED["login"]
    assert check(SERVED, {"type": "login", "id": 2, "user": "a" * 8, "args": {}, "cap": 3}).name == "login"
    assert check(SERVED, {"type": "any", "id": 3, "text": "x" * 100_000}).name == "any"


@pytest.mark.parametrize(("req", "message"), [
    ({"id": 1}, "unknown request type"),
    ({"type": "nope", "id": 1}, "unknown request type"),
    ({"type": ["login"], "id": 1}, "unknown request type"),
    ({"type": "login", "id": 1, "user": "a", "args": {}, "x": 1}, "login: unknown key 'x'"),
    ({"type": "login", "id": 1, "args": {}}, "login: missing key 'user'"),
    ({"type": "login", "user": "a", "args": {}}, "login: missing key 'id'"),
    ({"type": "login", "id": True, "user": "a", "args": {}}, "login: malformed key 'id'"),
    ({"type": "login", "id": 1, "user": "a", "args": {}, "cap": False}, "login: malformed key 'cap'"),
    ({"type": "login", "id": 1, "user": "a" * 9, "args": {}}, "login: malformed key 'user'"),
    ({"type": "login", "id": 1, "user": "a", "args": []}, "login: malformed key 'args'"),
])
def test_a_request_that_does_not_fit_is_refused_with_its_reason(req: dict[str, Any], message: str) -> None:
    assert refusal(req) == message


def test_a_table_holds_each_type_once() -> None:
    with pytest.raises(ValueError):
        table(Request("a", {}, _echo, "one"), Request("a", {}, _echo, "two"))


def test_root_serves_seven_requests_with_every_key_required() -> None:
    assert sorted(TABLE) == ["account", "config", "kill", "open", "pam", "spawn", "walk"]
    assert all(key.required and key.longest == 4096 for entry in TABLE.values() for key in entry.keys.values())
    assert check(TABLE, {"type": "open", "id": 1, "path": "/etc", "follow": True, "want": "any"}).name == "open"
    with pytest.raises(SchemaError, match="kill: malformed key 'pid'"):
        check(TABLE, {"type": "kill", "id": 1, "pid": True})
    with pytest.raises(SchemaError, match="open: malformed key 'path'"):
        check(TABLE, {"type": "open", "id": 1, "path": "/" * 4097, "follow": True, "want": "any"})
    for want in ("dir", "", "FILE"):  # root opens a file, or anything as O_PATH; never a folder to read
        with pytest.raises(SchemaError, match="open: malformed key 'want'"):
            check(TABLE, {"type": "open", "id": 1, "path": "/etc", "follow": True, "want": want})
