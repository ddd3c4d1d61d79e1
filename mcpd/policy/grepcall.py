"""The privileged ``files/grep`` (docs/REFERENCE.md §4.1): a walker plans, this process judges, root opens, the worker searches.

A walker (:func:`mcpd.walker.main.plan_grep`: names and ``lstat`` only) streams the regular files
of the tree the grant lets it see, in the walk's order. This process judges every planned path
again (:func:`judged`: a walker may lie; a file whose allowing rule has detectors the call lacks
is skipped, :data:`REDACTED_GRANT`), has root open each granted one with root's ``open``
request (its checked opener: no symlink unless the grant covers ``/``, one hard link, never a
device, FIFO or socket, never a secret), and passes the descriptors to the principal's worker in
batches of at most :data:`BATCH`, one batch in flight: the next is passed only once the worker
reported the last one searched, so root opens at most one batch ahead of the search and none
after it stopped. The worker searches them with the ordinary route's scanner and answers the
front; its last report ends the call. Nothing here reads a byte of content.

Worker frames (control socket): ``{"id", "op": "files/grep", "args" (first only), "files":
[PATH] (one per descriptor), "skips": [[PATH, REASON]], "not_granted": N, "last": bool, "walk"
(last only: the walker's result)}``; the worker answers each non-last batch ``{"id", "took":
true}`` and ends with its report ``{"id", "code", "bytes" (matches), "searched", "redacted"
(a redacted call's counts by kind)}``. The call's redaction goes to the worker in ``args``, never
to the walker.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from collections.abc import Iterator
from typing import Any

from mcpd.common import frames, grantmatch, identity
from mcpd.common.audit.records import Prepared
from mcpd.common.config import CAP_KEY
from mcpd.common.deadline import deadline_seconds
from mcpd.common.redaction import REDACT_KEY, counts_text
from mcpd.helper.wire.errors import (
    FILE_NOT_FOUND,
    HELPER_UNAVAILABLE,
    INTERNAL_ERROR,
    NOT_A_REGULAR_FILE,
    TIMEOUT,
    ToolError,
)
from mcpd.helper.wire.openrules import SYMLINK
from mcpd.helper.wire.pathmatch import PathError, clean_path
from mcpd.policy.handover import await_report, check_worker, claim_worker, end_late, pass_call, walker_frame
from mcpd.policy.state import GREP_OP, State, Worker
from mcpd.policy.workers import kill_worker

#: the reasons a walker may give for a file it passed over (:func:`mcpd.core.grepwalk.walk_files`'s):
#: no other text of a walker's reaches an answer but the paths :func:`judged` lets through
WALK_SKIPS = frozenset({"not_regular", "symlink", "loop", "too_deep", "permission", "vanished", "error"})
#: the skip reason of a file whose allowing grant has detectors the search (decided on its root) lacks:
#: never opened, as its redaction would be less than a read or a search of the file alone gets
REDACTED_GRANT = "redacted_grant"
BATCH = 4  # descriptors per batch: as many as a worker may leave untaken (UNTAKEN_TOTAL stays in RLIMIT_NOFILE)


def judged(policy: grantmatch.Policy, user: str, groups: frozenset[str], root: str, path: Any,
           login: tuple[float, bool] | None) -> bool:
    """Whether a path the walker planned may be opened: a clean absolute path, ``root`` itself or
    below it, that the grant allows this principal for ``files/grep`` now (as the call was decided)."""
    return _allowing(policy, user, groups, root, path, login) is not None


def _allowing(policy: grantmatch.Policy, user: str, groups: frozenset[str], root: str, path: Any,
              login: tuple[float, bool] | None) -> grantmatch.Decision | None:
    """:func:`judged`'s allowing decision (its ``redact`` is the rule's), or None when not allowed."""
    if not isinstance(path, str):
        return None
    try:
        if clean_path(path) != path:
            return None
    except PathError:
        return None
    if path != root and not path.startswith(root.rstrip("/") + "/"):
        return None
    since = None if login is None else datetime.datetime.fromtimestamp(login[0], datetime.UTC)
    decision = grantmatch.decide(policy, user, groups, GREP_OP, path, grantmatch.utcnow(), since,
                                 login is not None and login[1])
    return decision if decision.allowed else None


def _skip_reason(exc: ToolError) -> str:
    """The ``files_skipped`` reason of root's refusal to open a planned file."""
    if exc.code == FILE_NOT_FOUND:
        return "vanished"
    if exc.code == NOT_A_REGULAR_FILE:
        return "not_regular"
    return "symlink" if exc.details.get("reason") == SYMLINK else "refused_at_open"


class _Plan:
    """The walker's frames, read as needed until its reply (at the call's deadline ``end``)."""

    def __init__(self, chan: Any, end: float, cap: int) -> None:
        self.chan, self.end, self.cap = chan, end, cap
        self.result: dict[str, Any] | None = None

    def frames(self) -> Iterator[dict[str, Any]]:
        while self.result is None:
            self.chan.settimeout(max(self.end - time.monotonic(), 0.001))
            try:
                frame = frames.recv_frame(self.chan, self.cap)
            except TimeoutError:
                raise ToolError(TIMEOUT, "the call did not finish in time") from None
            except (OSError, frames.FrameError):
                frame = None
            if not isinstance(frame, dict):
                raise ToolError(INTERNAL_ERROR, "the walker ended without a reply")
            if isinstance(frame.get("plan"), dict):
                yield frame["plan"]
            elif frame.get("ok") is True and isinstance(frame.get("result"), dict):
                self.result = frame["result"]
            else:
                raise frames.reply_error(frame.get("error"))


def run(state: State, policy: grantmatch.Policy, args: dict[str, Any], principal: identity.Principal,
        groups: list[str], follow: bool, login: tuple[float, bool] | None, req: dict[str, Any],
        record: dict[str, Any]) -> tuple[dict[str, Any], str | None, int, Prepared]:
    """Run one granted privileged ``files/grep`` (module docstring) for ``principal``'s worker
    ``req["worker"]`` (reply id ``req["rid"]``); ``args``' path is the decided one, ``follow``
    the decision's ``covers_root``, ``login`` the caller's password login (as for the walker).
    Returns ``(reply to the front, the worker's code, matches, the accept record prepared)``; the
    record names ``files_opened`` and ``not_granted`` (``record`` gets them too).

    Raises:
        ToolError: before the first batch, the refusal of the path (the walker's opener, or
            root's for a file named alone: the worker stays the front's); after it, ``TIMEOUT``
            or ``INTERNAL_ERROR`` (the worker is killed: it holds part of the job).
    """
    w = claim_worker(state, principal, req)
    if not w.busy.acquire(blocking=False):
        raise ToolError(HELPER_UNAVAILABLE, "that worker is busy", reason="busy")
    rid, end = req["rid"], time.monotonic() + deadline_seconds(args, state.cfg.workers.timeout_seconds, "files/grep")
    root = args["path"].rstrip("/") or "/"
    first = dict(args, **({CAP_KEY: req["cap"]} if req.get("cap") is not None else {}))  # the principal's max_file_bytes
    counts = {"opened": 0, "not_granted": 0}
    passed, walker = False, None
    try:
        check_worker(state, w)
        walker = pid, chan, pidfd = state.root.walk()
        chan.settimeout(max(end - time.monotonic(), 0.001))
        plain = {k: v for k, v in args.items() if k != REDACT_KEY}  # the walker plans names: no redaction key
        frames.send_frame(chan, walker_frame(policy, GREP_OP, plain, principal.os_user, groups, follow, login))
        plan = _Plan(chan, end, frames.reply_cap(state.cfg.read.response_cap))
        who, groupset = principal.name, frozenset(groups)
        detectors = set(args.get(REDACT_KEY) or ())
        files: list[Any] = []
        skips: list[list[Any]] = []
        refused = 0
        frame_iter = plan.frames()
        report = None
        while report is None:
            fds: list[int] = []
            paths: list[str] = []
            try:
                while len(fds) < BATCH:
                    if time.monotonic() > end:
                        raise ToolError(TIMEOUT, "the call did not finish in time")
                    if not files:
                        got = next(frame_iter, None)
                        if got is None:
                            break
                        files = list(got.get("files") or [])
                        skips += [s for s in got.get("skips") or [] if isinstance(s, list) and len(s) == 2
                                  and s[1] in WALK_SKIPS and judged(policy, principal.os_user, groupset, root, s[0],
                                                                    login)]
                        refused += int(got.get("not_granted") or 0)
                        continue
                    path = files.pop(0)
                    allowing = _allowing(policy, principal.os_user, groupset, root, path, login)
                    if allowing is None:
                        refused += 1  # (a walker planning what the grant refuses: never opened)
                        continue
                    if not set(allowing.redact) <= detectors:  # its own grant redacts more than this search
                        skips.append([path, REDACTED_GRANT])
                        continue
                    try:
                        fd, real = state.root.open(path, follow, "file", who)
                    except ToolError as exc:
                        if path == root:  # a file named alone: its refusal is the call's
                            raise
                        skips.append([path, _skip_reason(exc)])
                        continue
                    if grantmatch.is_secret(policy, real):
                        os.close(fd)
                        skips.append([path, "refused_at_open"])
                        continue
                    fds.append(fd)
                    paths.append(path)
                last = plan.result is not None and not files
                frame: dict[str, Any] = {"id": rid, "op": GREP_OP, "files": paths, "skips": skips[:BATCH],
                                         "not_granted": refused, "last": last}
                skips, refused = skips[BATCH:], 0
                if last and skips:  # more skips than one frame carries: the last frame waits
                    frame["last"] = last = False
                if not passed:
                    frame["args"] = first
                if last:
                    frame["walk"] = plan.result
                while frame["skips"] and len(frames.encode(frame)) > frames.HELPER_REQUEST_CAP:  # a worker's cap
                    skips.insert(0, frame["skips"].pop())  # (long names: the rest go in the next frame)
                    frame["last"] = last = False
                    frame.pop("walk", None)
                if passed:  # the worker's report of the batch before: "took" or its last
                    report = _worker_report(state, w, rid, end)
                    if "took" not in report:
                        break
                    report = None
                pass_call(state, w, frame, fds)
                counts["opened"] += len(fds)
                counts["not_granted"] += frame["not_granted"]
                passed = True
            finally:
                for fd in fds:
                    os.close(fd)
            if last:
                report = _worker_report(state, w, rid, end)
                if "took" in report:
                    raise ToolError(INTERNAL_ERROR, "the worker asked for more after the last batch")
    except BaseException:
        if passed and state.workers.get(w.pid) is w:  # it holds part of the job: it must not go on
            kill_worker(state, w, "its privileged grep failed")
        raise
    finally:
        record.update(files_opened=counts["opened"], not_granted=counts["not_granted"])
        w.busy.release()
        if walker is not None:
            walker[1].close()
            os.close(walker[2])
            with contextlib.suppress(ToolError, OSError):
                state.root.kill(walker[0])
    if REDACT_KEY in args:  # the worker's count of secrets redacted in the answer (never content)
        record["redacted"] = counts_text(report.get("redacted"))
    prepared = state.audit.prepare("accept", decision="accept", reason="granted", **record)
    return {"ok": True, "dispatched": True}, report.get("code"), int(report.get("bytes") or 0), prepared


def _worker_report(state: State, w: Worker, rid: Any, end: float) -> dict[str, Any]:
    """The worker's next report on this call, by the deadline ``end`` (else it is killed: ``TIMEOUT``)."""
    report = await_report(w, rid, max(end - time.monotonic(), 0.0))
    if report is None:
        report = end_late(state, w, rid)
        if report is None:
            raise ToolError(TIMEOUT, "the call did not finish in time")
    return report
