"""Handing a granted call over: to the principal's worker (a descriptor and its call), or to a walker.

Both privileged routes that end in a worker use it: :mod:`mcpd.policy.calls` (``files/read``,
``files/filetype``) and :mod:`mcpd.policy.grepcall` (``files/grep``, batch by batch). The worker
the front named is claimed for the principal (:func:`claim_worker`: its own, and none that left
descriptors untaken), checked hardened once (:func:`check_worker`), passed each call without ever
waiting on it (:func:`pass_call`), and its report awaited until the call's deadline
(:func:`await_report`); one past it is killed first (:func:`end_late`). :func:`walker_frame` is the
request a walker gets.
"""

from __future__ import annotations

import array
import contextlib
import errno
import pwd
import socket
import time
from typing import Any

from mcpd.common import frames, grantmatch, identity
from mcpd.helper.wire.errors import HELPER_UNAVAILABLE, INTERNAL_ERROR, ToolError
from mcpd.policy.state import Refused, State, Worker
from mcpd.policy.workers import UNTAKEN, UNTAKEN_MAX, UNTAKEN_TOTAL, bound_worker, check_started, kill_worker, untaken


def claim_worker(state: State, principal: identity.Principal, req: dict[str, Any]) -> Worker:
    """The worker ``req`` names for a content call of ``principal``, when it may be passed descriptors.

    Raises:
        Refused: no worker or rid in the request.
        ToolError: ``PERMISSION_DENIED`` (not the principal's worker), ``INTERNAL_ERROR`` (it was
            killed: it had left a call untaken), ``HELPER_UNAVAILABLE`` (reason :data:`UNTAKEN`).
    """
    if not isinstance(req.get("worker"), int) or req.get("rid") is None:
        raise Refused("content call without worker and rid")
    w = bound_worker(state, principal, req["worker"])
    held = untaken(state, w.owner, w)
    if state.workers.get(w.pid) is not w:  # it was one of them: killed
        raise ToolError(INTERNAL_ERROR, "the worker ended during the call: it did not read its control socket")
    if held >= UNTAKEN_MAX or (held and untaken(state) >= UNTAKEN_TOTAL):
        raise ToolError(HELPER_UNAVAILABLE, f"no privileged read for this principal: its workers left {held} "
                        "descriptors untaken in their sockets (a process of its account keeps them); "
                        "none is passed until they are released", reason=UNTAKEN)
    return w


def check_worker(state: State, w: Worker) -> None:
    """Once per worker, before its first descriptor (the caller holds ``w.busy``): only one seen
    hardened gets one (:func:`~mcpd.policy.workers.check_started`); else it is killed and the call
    fails ``INTERNAL_ERROR``."""
    if not w.checked:
        why = check_started(w, pwd.getpwnam(w.owner[1]))
        if why is not None:
            kill_worker(state, w, f"it did not start safely: {why}")
            raise ToolError(INTERNAL_ERROR, f"the worker did not start safely: {why}")
        w.checked = True


def pass_call(state: State, w: Worker, frame: dict[str, Any], fds: list[int]) -> None:
    """Send one call (``frame`` and ``fds``) to worker ``w``'s control socket, never waiting: only
    when the worker has taken all it was sent before (nothing of ours unread in its socket,
    ``SIOCOUTQ`` 0: a worker reads a call whole before it reports), and only at once and whole
    (``MSG_DONTWAIT``). So at most one call and one descriptor per worker are ever in flight, and
    no thread waits on a worker that does not read. Otherwise the worker is killed and forgotten
    (its socket's queue, and the descriptor in it, go with its last holder: the worker alone) and
    this call fails: ``INTERNAL_ERROR``, the worker replaced by the front like any that ended."""
    data = frames.encode(frame)
    why = "it did not read its control socket"
    try:
        if frames.queued_bytes(w.ctl.fileno()) == 0:
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
            if w.ctl.sendmsg([data], rights, socket.MSG_DONTWAIT) == len(data):
                return
    except OSError as exc:  # (EBADF: a kill on another thread closed it meanwhile)
        if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.EBADF):
            why = "it ended"
        elif exc.errno != errno.EAGAIN:
            why = f"its control socket failed ({errno.errorcode.get(exc.errno or 0, exc.errno)})"
    kill_worker(state, w, f"a privileged call could not be passed to it: {why}")
    raise ToolError(INTERNAL_ERROR, f"the worker ended during the call: {why}")


def end_late(state: State, w: Worker, rid: Any) -> dict[str, Any] | None:
    """A worker past its call's deadline: have root SIGKILL it first (it holds the granted
    descriptor, and would otherwise still read the file and answer the front after the call was
    recorded as ``TIMEOUT`` with 0 bytes), then take the report it may have sent before it died
    (it reports before it answers, so without a report no answer left it)."""
    with contextlib.suppress(ToolError, OSError):
        state.root.kill(w.pid)
    try:
        report = await_report(w, rid, 1.0)
    except ToolError:  # ended without (another) report
        report = None
    kill_worker(state, w, "its privileged call passed its deadline")
    return report


def await_report(w: Worker, rid: Any, seconds: float) -> dict[str, Any] | None:
    """The worker's report ``{"id": rid, ...}`` within ``seconds``, or None; read through the
    worker's buffer (one ``recv`` per report as a rule). Reports of other ids (a call that timed
    out earlier) are skipped.

    Raises:
        ToolError: ``INTERNAL_ERROR`` when the worker ended (its socket at its end, or reset: a
            worker killed with the call's frame unread) or sent a report over 4 KiB or not a
            JSON object (a broken worker: the call fails, its record says so).
    """
    end = time.monotonic() + seconds
    while True:
        try:
            while (body := frames.take_frame(w.reports, 4096)) is not None:
                if (report := frames.decode_body(body)).get("id") == rid:
                    return report
        except frames.FrameError:
            raise ToolError(INTERNAL_ERROR, "the worker sent a malformed report") from None
        left = end - time.monotonic()
        try:
            if left <= 0 or not frames.ready([w.ctl.fileno()], left):
                return None
            chunk = w.ctl.recv(frames.READ_CHUNK)
        except (OSError, ValueError):  # ECONNRESET: it died with our frame unread; closed: reaped meanwhile
            chunk = b""
        if not chunk:
            raise ToolError(INTERNAL_ERROR, "the worker ended during the call")
        w.reports += chunk


def walker_frame(policy: grantmatch.Policy, op: str, args: dict[str, Any], os_user: str, groups: list[str],
                 follow: bool, login: tuple[float, bool] | None) -> dict[str, Any]:
    """The request frame of a walker (:mod:`mcpd.walker`) for one call decided under ``policy``."""
    return {"op": op, "args": args, "os_user": os_user, "groups": groups, "follow": follow,
            "rules": grantmatch.rules_to_wire(policy, os_user, set(groups), op), "secrets": list(policy.secrets),
            "login_time": None if login is None else login[0], "login_used": login is not None and login[1]}
