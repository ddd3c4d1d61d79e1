"""The MCP side of a privileged call that needs a person (docs/REFERENCE.md §4.7): which calls
may ask their client to open a page, what a retry brings, the 2026-07-28 input-required answer
and the 2025-11-25 URL-mode elicitation. The page itself is :mod:`mcpd.front.confirm`.

A privileged call that needs a person (a step-up sign-in for ``reauth_after``, or an approval
under a grant's ``approve``) comes back from the policy process as ``PERMISSION_DENIED`` with
``details.confirm = {id, kind}``. On a 2026-07-28 request whose client declared URL-mode
elicitation, :func:`input_required` turns it into that revision's ``InputRequiredResult``: one
input request ``mcpd_confirm`` (``elicitation/create``, ``mode: "url"``, the page's address) and
the record's id as ``requestState``; the client opens the page, then sends the same call again
with ``inputResponses`` and the ``requestState`` (:func:`hitl_of` reads them back).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

from mcpd.front.mcp.outgoing import ClientDidNotAnswer
from mcpd.helper.wire.errors import PERMISSION_DENIED, ToolError

PREFIX = "/confirm/"  # the page's path, under the server's base path
INPUT_KEY = "mcpd_confirm"
ID = re.compile(r"[A-Za-z0-9_-]{16,64}")  # a confirmation record's id, as the policy process makes them
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_REASON = "dev.mcpd/reason"  # the agent's stated reason for a call, in its ``_meta`` (shown to approvers)


def _url_mode(caps: Any) -> bool:
    elicit = caps.get("elicitation") if isinstance(caps, dict) else None
    return isinstance(elicit, dict) and isinstance(elicit.get("url"), dict)


def may_elicit(caps: dict[str, Any], msg: dict[str, Any]) -> bool:
    """Whether request ``msg`` of a session whose client declared ``caps`` may send that client a
    URL-mode ``elicitation/create`` (a privileged ``tools/call``): its answer is then an event stream."""
    raw = msg.get("params")
    params: dict[str, Any] = raw if isinstance(raw, dict) else {}
    args = params.get("arguments")
    return (msg.get("method") == "tools/call" and isinstance(args, dict) and args.get("privileged") is True
            and _url_mode(caps))


def hitl_of(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The ``privileged_call`` keys a ``tools/call``'s ``params`` bring (all optional):
    ``interactive`` (a 2026-07-28 request that declared ``elicitation.url`` in its capabilities,
    or a 2025-11-25 session whose client did at ``initialize``: then also ``elicit``),
    ``confirm`` (the ``requestState`` of a retry) and ``why`` (``_meta["dev.mcpd/reason"]``, at
    most 500 characters). A retry whose ``inputResponses[mcpd_confirm].action`` is not
    ``accept`` brings ``declined: True``. ``ctx``: the request's
    :class:`~mcpd.front.mcp.dispatcher.RequestContext`."""
    out: dict[str, Any] = {}
    raw = params.get("_meta")
    meta: dict[str, Any] = raw if isinstance(raw, dict) else {}
    if ctx.modern and _url_mode(meta.get(META_CAPABILITIES)):
        out["interactive"] = True
    elif not ctx.modern and ctx.ask is not None and _url_mode(ctx.client_capabilities):
        out["interactive"] = out["elicit"] = True
    state = params.get("requestState")
    if isinstance(state, str) and ID.fullmatch(state):
        out["confirm"] = state
        answers = params.get("inputResponses")
        answer = answers.get(INPUT_KEY) if isinstance(answers, dict) else None
        if isinstance(answer, dict) and answer.get("action") in ("decline", "cancel"):
            out["declined"] = True
    if isinstance(meta.get(META_REASON), str):
        out["why"] = meta[META_REASON][:500]
    return out


def page_url(origin: str, confirm_id: str) -> str:
    """The page of record ``confirm_id`` under ``origin`` (``https://host:port`` and base path)."""
    return f"{origin}{PREFIX}{confirm_id}"


def input_required(exc: ToolError, origin: str) -> dict[str, Any] | None:
    """The 2026-07-28 ``InputRequiredResult`` for a refusal that carries ``details.confirm``, else None."""
    confirm = exc.details.get("confirm")
    if not isinstance(confirm, dict) or not isinstance(confirm.get("id"), str) or not origin:
        return None
    what = ("Sign in again to allow this privileged read" if confirm.get("kind") == "signin"
            else "An approver must approve this privileged read")
    return {"resultType": "input_required", "requestState": confirm["id"],
            "inputRequests": {INPUT_KEY: {"method": "elicitation/create", "params": {
                "mode": "url", "message": f"{what}: {exc.details.get('path', '')}. Open the page, then retry.",
                "url": page_url(origin, confirm["id"])}}}}


async def elicit_then_retry(ctx: Any, exc: ToolError, retry: Callable[[str], Awaitable[dict[str, Any]]]
                            ) -> dict[str, Any]:
    """A 2025-11-25 session's way through a refusal that carries ``details.confirm``: send the
    client a URL-mode ``elicitation/create`` (``elicitationId`` the record's id, ``url`` its page),
    and once it accepts, run ``retry(id)`` (the same call naming the record; the policy process
    waits there, up to the call's deadline, for the sign-in or decision) until it no longer asks
    for the same record or the record's time is up; then ``notifications/elicitation/complete``.

    Raises:
        ToolError: ``exc`` itself when it carries no record; ``PERMISSION_DENIED`` (reason
            ``declined``) when the client declines, cancels or does not answer; the retry's own.
    """
    confirm = exc.details.get("confirm")
    if not isinstance(confirm, dict) or not isinstance(confirm.get("id"), str) or ctx.ask is None:
        raise exc
    cid, seconds = confirm["id"], float(confirm.get("expires_in") or 60)
    shaped = input_required(exc, ctx.caller.origin) or {}
    message = shaped.get("inputRequests", {}).get(INPUT_KEY, {}).get("params", {}).get("message", "")
    params = {"mode": "url", "elicitationId": cid, "url": page_url(ctx.caller.origin, cid), "message": str(message)}
    try:
        answer = await ctx.ask("elicitation/create", params, seconds)
    except ClientDidNotAnswer as why:
        raise ToolError(PERMISSION_DENIED, f"permission denied: the confirmation was not answered: {why}",
                        reason="declined") from None
    if answer.get("action") != "accept":
        raise ToolError(PERMISSION_DENIED, "permission denied: the user declined the confirmation", reason="declined")
    end = asyncio.get_running_loop().time() + seconds
    while True:
        try:
            result = await retry(cid)
            break
        except ToolError as again:
            same = again.details.get("confirm")
            if not (isinstance(same, dict) and same.get("id") == cid) or asyncio.get_running_loop().time() >= end:
                raise
    ctx.send({"jsonrpc": "2.0", "method": "notifications/elicitation/complete", "params": {"elicitationId": cid}})
    return result
