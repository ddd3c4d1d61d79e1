"""Operations a worker executes, on both routes (docs/INTERNALS.md, "Operations").

A request frame ``{"id": int, "op": str, "args": {...}}`` becomes a reply frame
``{"id", "ok": true, "result"}`` or ``{"id", "ok": false, "error": ToolError.to_dict()}``.
:func:`run` never raises: an unexpected exception becomes ``INTERNAL_ERROR`` with a generic
message, and its traceback goes to the log only (docs/REFERENCE.md §2.5).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mcpd.common.config import CAP_KEY, ReadLimits
from mcpd.common.readerrors import reader_error
from mcpd.common.redaction import REDACT_KEY, from_args, union
from mcpd.core import textread
from mcpd.core.fileops import filetype, find, grep, listing
from mcpd.core.tools import files_read
from mcpd.helper.wire.errors import INTERNAL_ERROR, PERMISSION_DENIED, ToolError, invalid_argument

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpContext:
    """What an op may use: the read limits (bytes) and the openers of its route.

    ``open_file(path) -> fd`` returns a regular file opened ``O_RDONLY|O_NONBLOCK|O_CLOEXEC|O_NOCTTY``
    or raises ``ToolError``; ``open_dir(path) -> fd`` a directory; ``allow(path)`` is the privileged
    route's grant filter (``None``: no filter). ``progress(done, total | None, message)`` is
    called by long ops (``files/find``) every few thousand entries (``None``: nobody listens).
    ``redact`` names the secret detectors the answer goes through (docs/REFERENCE.md §3
    "Redaction"): the worker's own (its principal's, given at its start) and those the call
    carries (:data:`mcpd.common.redaction.REDACT_KEY`).
    ``facts`` is set on the privileged route of ``files/filetype`` only: what root's descriptor of
    the granted path showed (``{"mode", "size", "dev", "ino", "target"}``, see
    :func:`mcpd.core.fileops.filetype.filetype`), and ``open_file`` then gives a sample, not the file.
    """

    limits: ReadLimits
    open_file: Callable[[str], int]
    open_dir: Callable[[str], int]
    allow: Callable[[str], bool] | None = None
    progress: Callable[[int, int | None, str], None] | None = None
    facts: dict[str, Any] | None = None
    redact: tuple[str, ...] = ()


def files_read_op(args: Any, ctx: OpContext) -> dict[str, Any]:
    """``files/read`` (docs/REFERENCE.md §3): validate again (defence in depth), open, read, close.

    Raises:
        ToolError: any docs/REFERENCE.md §2.5 code of the opener or the reading core; ``PERMISSION_DENIED``
            (reason ``no grant covers this path``) when ``ctx.allow`` refuses the path.
    """
    a = files_read.parse_args(args)
    path = a["path"]
    if ctx.allow is not None and not ctx.allow(path):
        raise ToolError(PERMISSION_DENIED, f"permission denied: {path}", path=path, reason="no grant covers this path")
    fd = ctx.open_file(path)
    try:
        return textread.read_fd(fd, a, ctx.limits, ctx.redact)
    except OSError as exc:
        raise reader_error(exc, path) from None
    finally:
        os.close(fd)


OPS: dict[str, Callable[[Any, OpContext], dict[str, Any]]] = {
    "files/read": files_read_op,
    "files/list": listing.op_list,
    "files/find": find.op_find,
    "files/filetype": filetype.op_filetype,
    "files/grep": grep.op_grep,
}


def run(frame: Any, ctx: OpContext) -> dict[str, Any]:
    """Execute one request frame and return its reply frame; never raises (except ``BaseException``s
    such as ``SystemExit`` and ``KeyboardInterrupt``).

    Args:
        frame: ``{"id": int, "op": str, "args": dict}`` as received (validated here).
        ctx: the route's :class:`OpContext`.
    """
    fid = frame.get("id") if isinstance(frame, dict) else None
    try:
        if not isinstance(frame, dict):
            raise invalid_argument("request frame must be an object")
        op = frame.get("op")
        handler = OPS.get(op) if isinstance(op, str) else None
        if handler is None:
            raise invalid_argument("unknown operation")
        args = frame.get("args")
        if isinstance(args, dict) and REDACT_KEY in args:  # the call's redaction, over the worker's own floor
            ctx = dataclasses.replace(ctx, redact=union(ctx.redact, from_args(args)))
            args = {k: v for k, v in args.items() if k != REDACT_KEY}
        if isinstance(args, dict) and CAP_KEY in args:  # the caller's max_file_bytes (mcpd/front/limits.py)
            args = dict(args)
            cap = args.pop(CAP_KEY)
            if isinstance(cap, int) and not isinstance(cap, bool) and 0 < cap < ctx.limits.response_cap:
                ctx = dataclasses.replace(ctx, limits=dataclasses.replace(ctx.limits, response_cap=cap))
        return {"id": fid, "ok": True, "result": handler(args, ctx)}
    except ToolError as exc:
        return {"id": fid, "ok": False, "error": exc.to_dict()}
    except Exception:
        log.exception("operation failed")
        return {"id": fid, "ok": False, "error": ToolError(INTERNAL_ERROR, "internal error").to_dict()}
