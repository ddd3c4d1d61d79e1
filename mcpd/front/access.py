"""The front's access log: one record per call the root helper does not record (SPEC §7.1).

Every ``tools/call`` and ``resources/read`` leaves exactly one record. A call forwarded to the
root helper is recorded there (the privileged route); every other call is recorded here, by the
front, in ``access_log`` with the same chained JSON-line format (:class:`mcpd.common.audit.AuditLog`):
unprivileged reads, calls refused before any route (bad arguments, quota), and privileged calls
that never reached the helper (``HELPER_UNAVAILABLE``). Fields: ``user`` (principal),
``token_id``, ``os_user``, ``peer``, ``session``, ``route``, ``tool``, ``requested_path``,
``resolved_path``, ``decision``, ``reason``, ``outcome`` (an error code, ``CANCELLED``, or null on success),
``bytes`` (text bytes answered, or entries/matches listed), ``duration_ms``. Never a token or
file contents.

On the unprivileged route the front decides nothing: the OS account's own permissions do, so
``decision`` is ``accept`` and a refusal by the kernel shows as ``outcome`` ``PERMISSION_DENIED``.
A call refused before it ran (invalid arguments, quota) is ``decision`` ``reject``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from mcpd.front import metrics
from mcpd.common.audit import AuditLog, Fields, encode_fields
from mcpd.common.errors import HELPER_UNAVAILABLE, INTERNAL_ERROR, ToolError
from mcpd.common.identity import Principal

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

    Raises:
        OSError: the file cannot be opened (the front refuses to start: calls must be recorded).
    """

    def __init__(self, path: str) -> None:
        self.log = AuditLog(path, ident="mcpd-access")

    def call(self, principal: Principal, peer: str, session: str, tool: str, arguments: Any, started: float,
             stage: str, *, result: Mapping[str, Any] | None = None, error: ToolError | None = None,
             outcome: str | None = None) -> None:
        """Record one call, unless the helper did (``stage`` ``forwarded`` and the helper reached).

        Args:
            arguments: the tool's arguments (only ``path``/``root`` and ``privileged`` are read).
            started: ``time.monotonic()`` when the call began.
            stage: how far it went: ``refused`` (before any route: arguments, quota),
                ``unprivileged`` (sent to a worker) or ``forwarded`` (sent to the root helper).
            result: the op's result on success. error: the failure, if any. outcome: the
                outcome code when there is no ``error`` (``CANCELLED``).

        Raises:
            OSError: the record could not be written (the caller fails the call: fail closed).
        """
        if stage == "forwarded" and (error is None or error.code != HELPER_UNAVAILABLE):
            return
        raw = arguments if isinstance(arguments, Mapping) else {}
        requested = raw.get("path", raw.get("root"))
        requested = requested if isinstance(requested, str) else None
        reason = {"refused": error.message if error else "refused", "forwarded": "the root helper is unreachable",
                  "unprivileged": UNPRIVILEGED_REASON}[stage]
        first = _who_and_what(principal.name, principal.token_id, principal.os_user, peer, session,
                              "privileged" if raw.get("privileged") is True else "unprivileged", tool, requested,
                              (result or {}).get("path", requested) if requested else None,
                              "reject" if stage == "refused" else "accept", reason,
                              outcome if error is None else error.code)
        self.log.record_with("access", first, bytes=answer_size(result),
                             duration_ms=round((time.monotonic() - started) * 1000, 1))


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


class Call:
    """``with Call(log, principal, peer, session, tool, arguments) as call:`` around one call:
    set :attr:`stage` as it goes (``unprivileged``, ``forwarded``) and :attr:`result` when it has
    one; on leaving, one record is written (:meth:`AccessLog.call`) whatever happened: the
    result, the :class:`ToolError`, ``CANCELLED``, or ``INTERNAL_ERROR`` for anything else. A
    record that cannot be written raises ``OSError`` in place of the call's own outcome (fail
    closed). ``log`` ``None``: nothing is recorded."""

    def __init__(self, log: AccessLog | None, principal: Principal, peer: str, session: str, tool: str,
                 arguments: Any) -> None:
        self.log, self.who, self.tool, self.arguments = log, (principal, peer, session), tool, arguments
        self.stage, self.started = "refused", time.monotonic()
        self.result: Mapping[str, Any] | None = None

    def __enter__(self) -> "Call":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
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
        self.log.call(*self.who, self.tool, self.arguments, self.started, self.stage, **outcome)
