"""The policy process's request table: every request type it serves, nothing else.

Like OpenSSH's monitor: a fixed table :data:`REQUESTS` of request types, each with a strict
schema (unknown, missing or wrongly typed keys are refused), a capacity class and a handler.
Each capacity class (:data:`CLASSES`) has a bounded number of requests in flight, so a burst of
one kind (logins) never takes capacity from another (token checks, spawns, privileged calls).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcpd.policy.calls import handle_call
from mcpd.policy.handlers import handle_authenticate, handle_kill, handle_login, handle_revoke, handle_spawn
from mcpd.policy.state import Refused, State

# capacity class -> threads (in flight: 4x); "call" requests run on their connection's thread instead
CLASSES = {"auth": 8, "spawn": 4, "call": 16, "login": 8}

Handler = Callable[[State, dict[str, Any]], dict[str, Any]]
_ID = (int, True, 0)
_TOKEN = (str, True, 256)

#: type -> (capacity class, schema {key: (type, required, max length)}, handler). Nothing else is served.
REQUESTS: dict[str, tuple[str, dict[str, tuple[type, bool, int]], Handler]] = {
    "authenticate": ("auth", {"token": _TOKEN}, handle_authenticate),
    "revoke": ("auth", {"token": _TOKEN}, handle_revoke),
    "spawn_worker": ("spawn", {"token": _TOKEN}, handle_spawn),
    "kill_worker": ("spawn", {"token": _TOKEN, "pid": (int, True, 0)}, handle_kill),
    "privileged_call": ("call", {"token": _TOKEN, "session": (str, True, 64), "peer": (str, True, 100),
                                 "op": (str, True, 64), "args": (dict, True, 0), "cap": (int, False, 0),
                                 "worker": (int, False, 0), "rid": (int, False, 0)}, handle_call),
    "pam_login": ("login", {"user": (str, True, 64), "password": (str, True, 4096), "peer": (str, True, 100)},
                  handle_login),
}


#: each request type's whole schema: its own keys, ``type`` and ``id``
_SCHEMAS = {kind: dict(entry[1], type=(str, True, 32), id=_ID) for kind, entry in REQUESTS.items()}


def check_request(req: dict[str, Any]) -> str:  # noqa: C901
    """Return the request's type after checking it against its schema (strict: unknown keys,
    missing keys, wrong types and overlong strings are refused). Raises :class:`Refused`."""
    kind = req.get("type")
    if not isinstance(kind, str) or kind not in REQUESTS:
        raise Refused("unknown request type")
    schema = _SCHEMAS[kind]
    for key in req.keys() - schema.keys():
        raise Refused(f"{kind}: unknown key {key!r}")
    for key, (typ, required, limit) in schema.items():
        if key not in req:
            if required:
                raise Refused(f"{kind}: missing key {key!r}")
            continue
        value = req[key]
        if not isinstance(value, typ) or isinstance(value, bool) or (limit and len(str(value)) > limit):
            raise Refused(f"{kind}: malformed key {key!r}")
    return kind

