"""The policy process's request table: every request type it serves, nothing else.

Like OpenSSH's monitor and root's table (:data:`mcpd.helper.monitor.TABLE`), in the same style
and held to the same schema check (:mod:`mcpd.helper.wire.requests`): one entry per request
type with its keys (exact types; unknown, missing or wrongly typed keys are refused), its
handler, what it may do and its capacity class. Each class (:data:`CLASSES`) has a bounded number
of requests in flight, so a burst of one kind (logins) never takes capacity from another.
"""

from __future__ import annotations

from typing import Any

from mcpd.common.identity import MAX_JWT_CHARS
from mcpd.common.tracecontext import TRACEPARENT_CHARS, TRACESTATE_CHARS
from mcpd.helper.wire.requests import Key, Request, SchemaError, check, table
from mcpd.policy import confirmcall
from mcpd.policy.calls import handle_call
from mcpd.policy.handlers import handle_authenticate, handle_kill, handle_login, handle_revoke, handle_spawn
from mcpd.policy.state import Refused

# capacity class -> threads (in flight: 4x); "call" requests run on their connection's thread instead
CLASSES = {"auth": 8, "spawn": 4, "call": 16, "login": 8}

TOKEN, PEER, INT, OPT_INT = Key(str, longest=MAX_JWT_CHARS), Key(str, longest=100), Key(int), Key(int, required=False)
CALL = {"token": TOKEN, "session": Key(str, longest=64), "peer": PEER, "op": Key(str, longest=64), "args": Key(dict),
        "cap": OPT_INT, "worker": OPT_INT, "rid": OPT_INT,
        # the call's W3C trace context, as the front found it valid (checked again in handle_call)
        "traceparent": Key(str, longest=TRACEPARENT_CHARS, required=False),
        "tracestate": Key(str, longest=TRACESTATE_CHARS, required=False),
        # a person in the loop (mcpd.policy.confirmcall): the client can open a URL; the record a
        # retry names; the agent's stated reason; the front waits on a waiting record itself (defer),
        # and a retry it has waited for
        "interactive": Key(bool, required=False), "confirm": Key(str, longest=64, required=False),
        "why": Key(str, longest=500, required=False), "defer": Key(bool, required=False),
        "waited": Key(bool, required=False)}
LOGIN = {"user": Key(str, longest=64), "password": Key(str, longest=4096), "peer": PEER}
CONFIRM_ID = Key(str, longest=64)
ANSWER = {"cid": CONFIRM_ID, "csrf": Key(str, longest=64), "user": Key(str, longest=64),
          "password": Key(str, longest=4096), "decision": Key(str, longest=16), "peer": PEER}
#: request type -> its keys, handler, what it may do and when, and its capacity class; nothing else is served
REQUESTS = table(
    Request("authenticate", {"token": TOKEN}, handle_authenticate, "the principal of a token, or ok false", "auth"),
    Request("revoke", {"token": TOKEN}, handle_revoke, "a login token deletes itself (linuxctl logout)", "auth"),
    Request("spawn_worker", {"token": TOKEN}, handle_spawn, "a worker as the token's principal's account", "spawn"),
    Request("kill_worker", {"token": TOKEN, "pid": INT}, handle_kill, "SIGKILL one of the principal's workers", "spawn"),
    Request("privileged_call", CALL, handle_call, "one call decided by the grants; root opens or walks", "call"),
    Request("pam_login", LOGIN, handle_login, "a password login (root's PAM) to a login token, once", "login"),
    Request("confirm_view", {"cid": CONFIRM_ID}, confirmcall.handle_view, "what a confirmation page shows", "auth"),
    Request("confirm_answer", ANSWER, confirmcall.handle_answer,
            "a confirmation page's form: a password sign-in (root's PAM), then a sign-in or a decision", "login"),
    Request("confirm_decide", {"token": TOKEN, "cid": CONFIRM_ID, "decision": Key(str, longest=16), "peer": PEER},
            confirmcall.handle_decide, "an approver's decision with their bearer token", "auth"),
)


def check_request(req: dict[str, Any]) -> Request:
    """The table's entry for ``req`` once it holds exactly that entry's keys
    (:func:`mcpd.helper.wire.requests.check`). Raises :class:`~mcpd.policy.state.Refused` with
    the check's reason (``unknown request type``, ``<type>: unknown key 'k'``, ``missing key``,
    ``malformed key``)."""
    try:
        return check(REQUESTS, req)
    except SchemaError as exc:
        raise Refused(str(exc)) from None
