"""The front's access log: one record per call the policy process does not record (docs/REFERENCE.md §7.1).

Every ``tools/call`` and ``resources/read`` leaves exactly one record. A privileged call the
policy process received is recorded there (it records every privileged request it reads); every
other call is recorded here, by the front, in ``access_log`` with the same chained JSON-line
format (:class:`mcpd.common.audit.writer.AuditLog`): unprivileged reads, calls refused before any route
(bad arguments, quota), and privileged calls the policy process never received: refused by the
front for the principal's caps (``RATE_LIMITED``), out of time or cancelled while waiting for a
connection or a worker, the policy process down (``HELPER_UNAVAILABLE``, also when it closed
the connection after the request without answering: it may have ended before recording it).
Whether it received the request is not guessed: the policy client says so
(:func:`policy_received`), once the whole request is in the policy process's socket. Fields: ``user`` (principal),
``token_id``, ``os_user``, ``peer``, ``session``, ``route``, ``tool``, ``requested_path``,
``resolved_path``, ``decision``, ``reason``, ``outcome`` (an error code, ``CANCELLED``, or null on success),
``bytes`` (text bytes answered, or entries/matches listed), ``duration_ms``, the request's
``traceparent``/``tracestate`` when it sent valid ones, and for a redacted answer ``redacted``
(``kind:N,...``, :func:`mcpd.common.redaction.counts_text`). Never a token or file contents.

On the unprivileged route the front decides nothing: the OS account's own permissions do, so
``decision`` is ``accept``, and a call the kernel refused there (``PERMISSION_DENIED``: the daemon
did not serve it) is ``decision`` ``refused_by_os`` (:data:`~mcpd.common.audit.records.REFUSED_BY_OS`),
listed by ``mcpd audit tail --decision reject``. A call refused before it ran (invalid arguments,
quota, an unknown tool: :meth:`AccessLog.unknown_tool`) is ``decision`` ``reject``. A
``files/find`` record also keeps what was searched for (``find_name``, ``find_type``,
``max_depth``). A login the front refused itself (a malformed request, too many in flight, no
policy process) is event ``login``, ``decision`` ``reject`` (:meth:`AccessLog.login_refused`); the policy
process records the logins it receives.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from mcpd.common.audit.records import REFUSED_BY_OS, Fields, encode_fields, find_fields
from mcpd.common.audit.writer import AuditLog
from mcpd.common.identity import Principal
from mcpd.common.redaction import counts_text
from mcpd.front import metrics
from mcpd.helper.wire.errors import (
    HELPER_UNAVAILABLE,
    INTERNAL_ERROR,
    INVALID_ARGUMENT,
    PERMISSION_DENIED,
    RATE_LIMITED,
    ToolError,
)

UNPRIVILEGED_REASON = "the OS account's own permissions"


def answer_size(result: Mapping[str, Any] | None) -> int:
    """``bytes`` of a result: UTF-8 bytes of ``text``, else the number of ``entries``/``matches``."""
    if not result:
        return 0
    if isinstance(text := result.get("text"), str):  # ASCII (known without a scan): its length, no copy
        return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return len(result.get("entries") or result.get("matches") or [])


class AccessLog:
    """Writes the front's access records (see the module docstring).

    Args:
        path: the access log file (created 0600 in a 0700 folder when missing; the folder must be
            writable by the front's account). Each record also goes to the journal, as
            ``mcpd-access``, where journald runs.
        writer: more :class:`~mcpd.common.audit.writer.AuditLog` arguments (its checkpoints:
            :meth:`mcpd.common.config.Audit.writer_args`).

    Raises:
        OSError: the file cannot be opened (the front refuses to start: calls must be recorded).
    """

    def __init__(self, path: str, writer: Mapping[str, Any] | None = None) -> None:
        self.log = AuditLog(path, ident="mcpd-access", **(writer or {}))

    def call(self, principal: Principal, peer: str, session: str, tool: str, arguments: Any, started: float,
             stage: str, *, result: Mapping[str, Any] | None = None, error: ToolError | None = None,
             outcome: str | None = None, received: bool = False, trace: Mapping[str, str] | None = None) -> None:
        """Record one call, unless the policy process did (``stage`` ``forwarded`` and ``received``).

        Args:
            arguments: the tool's arguments (only ``path``/``root`` and ``privileged`` are read).
            started: ``time.monotonic()`` when the call began.
            stage: how far it went: ``refused`` (before any route: arguments, quota),
                ``unprivileged`` (sent to a worker) or ``forwarded`` (the privileged route).
            result: the op's result on success. error: the failure, if any. outcome: the
                outcome code when there is no ``error`` (``CANCELLED``).
            received: a forwarded call's request is in the policy process, which records it.
            trace: the request's valid ``traceparent``/``tracestate``
                (:func:`mcpd.common.tracecontext.trace_fields`), written as they are.

        Raises:
            OSError: the record could not be written (the caller fails the call: fail closed).
        """
        if stage == "forwarded" and received:
            return
        raw = arguments if isinstance(arguments, Mapping) else {}
        requested = raw.get("path", raw.get("root"))
        requested = requested if isinstance(requested, str) else None
        decision, extra = "accept", find_fields(tool, raw)
        if stage == "unprivileged":
            reason = UNPRIVILEGED_REASON
            if error is not None and error.code == PERMISSION_DENIED:  # the kernel said no: not served
                decision = REFUSED_BY_OS
                if isinstance(error.details.get("reason"), str):
                    extra["reason_detail"] = error.details["reason"]
        elif stage == "refused":
            decision, reason = "reject", error.message if error else "refused"
        elif error is None:  # forwarded, never received by the policy process: why, in the front's words
            reason = "cancelled before the policy process received it" if outcome == "CANCELLED" else \
                "not sent to the policy process"
        elif error.code == HELPER_UNAVAILABLE:
            reason = "the policy process is unreachable"
        else:  # the principal's cap (RATE_LIMITED: the front refused it), or no connection or worker in time
            decision, reason = "reject" if error.code == RATE_LIMITED else "accept", error.message
        first = _who_and_what(principal.name, principal.token_id, principal.os_user, peer, session,
                              "privileged" if raw.get("privileged") is True else "unprivileged", tool, requested,
                              (result or {}).get("path", requested) if requested else None,
                              decision, reason,
                              outcome if error is None else error.code)
        if isinstance((result or {}).get("redacted"), dict):  # docs/REFERENCE.md §3 "Redaction": counts, by kind
            extra["redacted"] = counts_text(result["redacted"])  # type: ignore[index]
        self.log.record_with("access", first, bytes=answer_size(result),
                             duration_ms=round((time.monotonic() - started) * 1000, 1), **extra,
                             **dict(principal.claims), **(trace or {}))  # claims: an OAuth token's iss, sub, client, act, jti

    def unknown_tool(self, principal: Principal, peer: str, session: str, name: Any, arguments: Any,
                     trace: Mapping[str, str] | None = None) -> None:
        """Record a ``tools/call`` of a tool that does not exist (answered ``-32602``): ``reject``,
        reason ``unknown tool``, outcome ``INVALID_ARGUMENT``, the name as sent (``tool``; a name that is no string as its JSON
        type in brackets), its route and path when the arguments give them.

        Raises:
            OSError: the record could not be written.
        """
        tool = name if isinstance(name, str) else f"({type(name).__name__})"
        self.call(principal, peer, session, tool, arguments, time.monotonic(), "refused",
                  error=ToolError(INVALID_ARGUMENT, "unknown tool"), trace=trace)

    def login_refused(self, peer: str, user: Any, status: int, reason: str) -> None:
        """Record a ``POST /login`` the front answered itself, without asking the policy process
        (HTTP ``status``: 400 malformed, 413 too large, 415 not JSON, 429 too many in flight, 503
        no policy process): event ``login``, ``decision`` ``reject``, the account as typed (``os_user``,
        when the body gave a string), ``outcome`` ``HTTP_<status>``. Never the password.

        Raises:
            OSError: the record could not be written.
        """
        self.log.record("login", tool="login", route="login", os_user=user[:256] if isinstance(user, str) else None,
                        peer=peer, decision="reject", reason=reason, outcome=f"HTTP_{status}")


_FIRST_KEYS = ("user", "token_id", "os_user", "peer", "session", "route", "tool", "requested_path", "resolved_path",
               "decision", "reason", "outcome")
_FIRST: dict[tuple[Any, ...], Fields] = {}  # the values of _FIRST_KEYS -> their encoding, oldest first
_FIRST_MAX, _FIRST_CHARS = 512, 2048  # entries kept; longer encodings (long paths, messages) are not kept


def _who_and_what(*values: Any) -> Fields:
    """The fields of an access record before its counts (:data:`_FIRST_KEYS`' values, in order),
    checked and encoded once for each session, path and outcome (a session reading one file again
    and again: the usual load). At most :data:`_FIRST_MAX` encodings of at most
    :data:`_FIRST_CHARS` characters are kept, the oldest dropped first. Only strings and nulls are
    kept (``True`` and ``1`` are equal keys but are written apart). Called from the front's event
    loop only (one thread: the table has no lock).

    Raises:
        AuditError: as :meth:`AuditLog.record` (a value that is no scalar).
    """
    try:
        first = _FIRST.get(values)
    except TypeError:  # (not hashable: no scalar, refused below)
        first = None
    if first is None:
        first = encode_fields(**dict(zip(_FIRST_KEYS, values)))
        if len(first.text) <= _FIRST_CHARS and all(v is None or type(v) is str for v in values):
            if len(_FIRST) >= _FIRST_MAX:
                del _FIRST[next(iter(_FIRST))]
            _FIRST[values] = first
    return first


_CURRENT: contextvars.ContextVar[Call | None] = contextvars.ContextVar("mcpd_front_call", default=None)


def policy_received(received: bool) -> None:
    """Tell the :class:`Call` running in this task whether the policy process has its privileged
    request: ``True`` once the whole request is in the policy process's socket (it then records
    it, whatever the front does next: an answer, a timeout, a cancellation), ``False`` when the
    policy process closed the connection without answering it (it may have ended before recording
    it: the front records it). Called by the policy client
    (:meth:`mcpd.front.policy_client.channel.PolicyChannel.request`'s ``delivered``); outside a
    :class:`Call` it does nothing."""
    call = _CURRENT.get()
    if call is not None:
        call.received = received


class Call:
    """``with Call(log, principal, peer, session, tool, arguments) as call:`` around one call:
    set :attr:`stage` as it goes (``unprivileged``, ``forwarded``) and :attr:`result` when it has
    one; on leaving, one record is written (:meth:`AccessLog.call`) whatever happened: the
    result, the :class:`ToolError`, ``CANCELLED``, or ``INTERNAL_ERROR`` for anything else;
    none for a forwarded call the policy process received (:attr:`received`, set through
    :func:`policy_received` by the policy client in the same task: the policy records it). A
    record that cannot be written raises ``OSError`` in place of the call's own outcome (fail
    closed). ``log`` ``None``: nothing is recorded."""

    def __init__(self, log: AccessLog | None, principal: Principal, peer: str, session: str, tool: str,
                 arguments: Any, trace: Mapping[str, str] | None = None) -> None:
        self.log, self.who, self.tool, self.arguments = log, (principal, peer, session), tool, arguments
        self.trace = trace
        self.stage, self.started = "refused", time.monotonic()
        self.result: Mapping[str, Any] | None = None
        self.received = False
        self._entered: contextvars.Token[Call | None] | None = None

    def __enter__(self) -> Call:
        self._entered = _CURRENT.set(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._entered is not None:
            _CURRENT.reset(self._entered)
            self._entered = None
        code = "ok" if exc is None else exc.code if isinstance(exc, ToolError) else \
            "CANCELLED" if isinstance(exc, asyncio.CancelledError) else INTERNAL_ERROR
        metrics.observe_call(self.tool, self.stage, code, time.monotonic() - self.started)
        if self.log is None:
            return
        if exc is None:
            outcome: dict[str, Any] = {"result": self.result}
        elif isinstance(exc, ToolError):
            outcome = {"error": exc}
        elif isinstance(exc, asyncio.CancelledError):
            outcome = {"outcome": "CANCELLED"}
        else:
            outcome = {"error": ToolError(INTERNAL_ERROR, "internal error")}
        self.log.call(*self.who, self.tool, self.arguments, self.started, self.stage, received=self.received,
                      trace=self.trace, **outcome)
