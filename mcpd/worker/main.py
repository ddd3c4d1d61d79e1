"""The worker process (docs/PRIVSEP.md): runs ops for one OS account over its socketpair.

It starts as ``python -I -m mcpd.worker --fd N [--ctl M] --limits JSON``, makes itself
non-dumpable before anything else (:func:`_seal`), closes every other descriptor, sets
no_new_privs, and exits when the socket closes. It holds nothing of the front's: no TLS key, no
tokens. Started by root's fork server for the policy process (``--ctl``: its control socket to
the policy process), it then tells the policy process it is hardened:
one frame ``{"ready": true}`` on its control socket with a descriptor of its own
``/proc/self/status``, which the policy process reads to check it before it passes the worker a
descriptor (docs/PRIVSEP.md, rule 5: a worker's start).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import resource
import select
import signal
import socket
import sys
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from mcpd.common import frames, sched, wirejson
from mcpd.common.config import CAP_KEY, ReadLimits
from mcpd.common.redaction import REDACT_KEY, from_args, union
from mcpd.helper.wire.errors import INTERNAL_ERROR, PERMISSION_DENIED, ToolError

if TYPE_CHECKING:
    from mcpd.core.ops import OpContext

REQUEST_CAP = frames.HELPER_REQUEST_CAP  # bytes: a request frame to a worker is at most 64 KiB
GRANTED_FDS = 4  # descriptors in one frame of the policy process (a privileged grep's batch)




def serve(sock: socket.socket, ctx: OpContext, ctl: socket.socket | None = None) -> None:
    """Run the worker loop until the peer closes the socket (docs/PRIVSEP.md).

    Args:
        sock: a blocking, connected ``AF_UNIX`` stream socket (the worker's end of a socketpair).
        ctx: the ops context (read limits and the unprivileged openers).

    Each request frame (at most :data:`REQUEST_CAP` bytes, ``{"id", "op", "args"}``) gets exactly
    one reply frame from ``mcpd.core.ops.run`` (an unexpected exception there becomes an
    ``INTERNAL_ERROR`` reply naming only the exception type). A request with ``"progress": true``
    may first get interim frames ``{"id", "progress": {"done", "total", "message"}}`` (entries
    seen, ``None`` or a total, a short text) from ops that report progress. A malformed or oversized frame ends the connection, as
    does any socket error; nothing is raised.
    """
    from mcpd.core import ops

    received = bytearray()  # of ``sock``: at most one unfinished frame and one read
    while True:
        try:
            body = frames.take_frame(received, REQUEST_CAP)
            if body is None:
                if ctl is not None and ctl in select.select([sock, ctl], [], [])[0]:
                    granted, fds = frames.recv_frame_fds(ctl, REQUEST_CAP, GRANTED_FDS)
                    if granted is None:
                        return
                    if granted.get("op") == "files/grep":
                        serve_grep(sock, ctl, granted, fds, ctx)
                    else:
                        serve_granted(sock, ctl, granted, fds, ctx)
                    continue
                chunk = sock.recv(frames.READ_CHUNK)  # (a descriptor sent along is dropped by the kernel)
                if not chunk:  # the front is gone (between frames or inside one)
                    return
                received += chunk
                continue
            frame = frames.decode_body(body)
        except (frames.FrameError, OSError):
            return
        op_ctx = ctx
        if frame.get("progress") is True:
            op_ctx = dataclasses.replace(ctx, progress=_progress_sender(sock, frame.get("id")))
        try:
            reply = ops.run(frame, op_ctx)
        except Exception as exc:  # ops.run never raises; if it does, answer without details
            print(f"mcpd.worker: op failed: {type(exc).__name__}", file=sys.stderr)
            reply = {"id": frame.get("id"), "ok": False, "error": ToolError(INTERNAL_ERROR, "internal error").to_dict()}
        try:
            send_reply(sock, reply)
        except OSError:
            return


def serve_granted(sock: socket.socket, ctl: socket.socket, frame: dict[str, Any], fds: list[int],
                  ctx: OpContext) -> None:
    """Run one privileged content call the policy process granted (docs/REFERENCE.md §4.5a): ``frame``
    is ``{"id", "op", "args"}`` with the granted path in ``args["path"]`` and ``fds`` the one
    descriptor root opened for it (passed on by the policy process); nothing else may be opened.
    For ``files/filetype`` the frame also holds ``"facts"`` (what root's descriptor showed) and
    ``fds`` is the sealed sample memfd of a regular file, or empty
    (:func:`mcpd.policy.opened.described`). The reply goes to the front on ``sock``; a report ``{"id", "code", "bytes"}`` (no content) goes back to the
    policy process on ``ctl`` for its audit record, with ``"redacted"`` (secrets replaced, by kind) when the answer was redacted."""
    from mcpd.core import ops

    args = frame.get("args")
    granted = args.get("path") if isinstance(args, dict) else None

    def open_granted(path: str) -> int:
        if len(fds) != 1 or path != granted:
            raise ToolError(PERMISSION_DENIED, f"permission denied: {path}", path=path, reason="no grant covers this path")
        return os.dup(fds[0])

    def no_dir(path: str) -> int:
        raise ToolError(PERMISSION_DENIED, f"permission denied: {path}", path=path, reason="no grant covers this path")

    try:
        facts = frame.get("facts") if frame.get("op") == "files/filetype" else None
        if frame.get("op") == "files/filetype" and not isinstance(facts, dict):
            facts = {}  # malformed: the op refuses it (INTERNAL_ERROR), never opens the descriptor as the file
        reply = ops.run(frame, dataclasses.replace(ctx, open_file=open_granted, open_dir=no_dir, facts=facts))
    finally:
        for fd in fds:
            os.close(fd)
    result = reply.get("result") if reply.get("ok") else None
    text = result.get("text") if isinstance(result, dict) else None
    size = 0 if not isinstance(text, str) else len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    code = None if reply.get("ok") else reply["error"]["code"]
    redacted = result.get("redacted") if isinstance(result, dict) else None  # counts by kind, never content
    # The report first: the policy process writes its audit record and answers the front, which reads
    # this reply only after that answer (so a reply larger than the socket buffers never holds
    # up the report).
    frames.send_frame(ctl, {"id": frame.get("id"), "code": code, "bytes": size,
                            **({"redacted": redacted} if isinstance(redacted, dict) else {})})
    send_reply(sock, reply)


def serve_grep(sock: socket.socket, ctl: socket.socket, frame: dict[str, Any], fds: list[int],
               ctx: OpContext) -> None:
    """Run one privileged ``files/grep`` (docs/REFERENCE.md §4.1): ``frame`` and ``fds`` are its
    first batch of files root opened (:mod:`mcpd.policy.grepcall`); each further batch is asked
    for with ``{"id", "took": true}`` on ``ctl`` until the last, or until the search stopped. Then
    the report ``{"id", "code", "bytes" (matches), "searched"}`` (and ``"redacted"``, counts by
    kind, when the call's redaction, ``args``' :data:`~mcpd.common.redaction.REDACT_KEY` with the
    worker's floor, replaced any) goes to the policy process and the reply to the front, as
    :func:`serve_granted`'s. Raises ``OSError`` or
    :class:`~mcpd.common.frames.FrameError` when the policy process's socket fails (the loop ends)."""
    from mcpd.core.fileops import grep

    rid, limits, args = frame.get("id"), ctx.limits, frame.get("args")
    cap = args.get(CAP_KEY) if isinstance(args, dict) else None
    if isinstance(cap, int) and not isinstance(cap, bool) and 0 < cap < limits.response_cap:
        limits = dataclasses.replace(limits, response_cap=cap)  # the principal's max_file_bytes
    # the call's redaction (the policy process's: principal's and grant's) over the worker's own floor
    detectors = union(ctx.redact, from_args(args)) if isinstance(args, dict) else ctx.redact
    args = {k: v for k, v in args.items() if k not in (CAP_KEY, REDACT_KEY)} if isinstance(args, dict) else args

    def batches() -> Generator[tuple[dict[str, Any], list[int]], None, None]:
        got, held = frame, fds
        while True:
            try:
                yield got, held
            finally:
                for fd in held:
                    os.close(fd)
                held = []
            if got.get("last") is not False:
                return
            frames.send_frame(ctl, {"id": rid, "took": True})
            nxt, held = frames.recv_frame_fds(ctl, REQUEST_CAP, GRANTED_FDS)
            if nxt is None or nxt.get("id") != rid:  # (ended, or another call's: never ours to search)
                for fd in held:
                    os.close(fd)
                raise OSError("the policy process ended the call")
            got = nxt

    batch = batches()
    try:
        reply: dict[str, Any] = {"id": rid, "ok": True, "result": grep.grep_granted(args, limits, batch, detectors)}
    except ToolError as exc:
        reply = {"id": rid, "ok": False, "error": exc.to_dict()}
    except Exception as exc:  # noqa: BLE001 - answered without details, as ops.run answers
        print(f"mcpd.worker: privileged grep failed: {type(exc).__name__}", file=sys.stderr)
        reply = {"id": rid, "ok": False, "error": ToolError(INTERNAL_ERROR, "internal error").to_dict()}
    finally:
        batch.close()
    result: dict[str, Any] = reply.get("result") or {}
    code = None if reply["ok"] else reply["error"]["code"]
    redacted = result.get("redacted")  # counts by kind, never content
    frames.send_frame(ctl, {"id": rid, "code": code, "bytes": len(result.get("matches", ())),
                            "searched": result.get("files_searched", 0),
                            **({"redacted": redacted} if isinstance(redacted, dict) else {})})
    send_reply(sock, reply)


def send_reply(sock: socket.socket, reply: dict[str, Any]) -> None:
    """Send one reply to the front in the frame format of :mod:`mcpd.helper.wire.frames`, encoded once
    with :func:`mcpd.common.wirejson.dumps`. A result's ``"text"`` travels as a second frame of
    raw UTF-8 (lone surrogates as ``surrogatepass`` writes them) and the first says
    ``"text_frame": true``: the front decodes it (fast) instead of parsing it as a JSON string (a
    1 MiB answer's slowest step there), and escapes it once itself when it answers.
    Raises ``OSError`` from the socket."""
    result = reply.get("result") if reply.get("ok") is True else None
    text = result.get("text") if isinstance(result, dict) else None
    if isinstance(result, dict) and isinstance(text, str):
        rest = {k: v for k, v in result.items() if k != "text"}
        body = wirejson.dumps({**reply, "result": rest, "text_frame": True})
        raw = text.encode("utf-8", "surrogatepass")
        parts = [frames.HEADER.pack(len(body)), body, frames.HEADER.pack(len(raw)), raw]
    else:
        body = wirejson.dumps(reply)
        parts = [frames.HEADER.pack(len(body)), body]
    _send_all(sock, parts)


def _send_all(sock: socket.socket, parts: list[bytes]) -> None:
    """Send ``parts`` in order with ``sendmsg`` (no joined copy of a large body); a blocking stream
    socket sends less only when a signal interrupts it: the rest is sent then."""
    views = [memoryview(p) for p in parts if p]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


def _progress_sender(sock: socket.socket, rid: Any) -> Callable[[int, int | None, str], None]:
    """An ``OpContext.progress`` that sends one interim frame per call; a send error is ignored
    (the final reply's send fails the same way and ends the loop)."""

    def send(done: int, total: int | None, message: str) -> None:
        try:
            frames.send_frame(sock, {"id": rid, "progress": {"done": done, "total": total, "message": message[:200]}})
        except OSError:
            pass

    return send


_PR_SET_DUMPABLE = 4


def _seal() -> None:
    """The worker's first act: not dumpable (so no process of its account may ptrace it, copy its
    descriptors with ``pidfd_getfd`` or open its ``/proc`` files), then, only after that, the
    account's gid as real gid too. The fork server execs a worker with a real gid
    (:data:`mcpd.helper.wire.rootconf.WORKER_START_GID`) that differs from its effective and saved one,
    the account's, so until this call no process of the account matches its credentials (kernels
    before 2025 set the effective and saved gids to the real one at that ``exec``, under
    no_new_privs: then all three stay the start gid and the account's gid is a supplementary
    group only). Raises ``OSError`` (the worker then fails to start)."""
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    real, effective, _ = os.getresgid()
    if real != effective:
        os.setresgid(effective, effective, effective)


#: (AUDIT_ARCH, {syscall: name}) of the architectures whose numbers are known here: fork, vfork,
#: execve, execveat and clone without CLONE_THREAD are refused (EPERM), clone3 answers ENOSYS
#: (so libc falls back to clone for its threads)
_SECCOMP_ARCHES = {"x86_64": (0xC000003E, {"fork": 57, "vfork": 58, "execve": 59, "execveat": 322,
                                           "clone": 56, "clone3": 435}),
                   "aarch64": (0xC00000B7, {"execve": 221, "execveat": 281, "clone": 220, "clone3": 435})}


def _no_new_processes() -> None:
    """Install a seccomp filter under which this process (and its threads) can start no process
    and exec nothing: ``fork``, ``vfork``, ``execve``, ``execveat`` and a ``clone`` without
    ``CLONE_THREAD`` fail with ``EPERM``, ``clone3`` with ``ENOSYS``; a system call of another ABI
    (i386 or x32 on x86_64) kills the process. So no child process of a compromised worker can
    keep a granted descriptor after the worker is killed. Needs no_new_privs. Raises ``OSError``
    when the kernel refuses the filter or the architecture is not one of
    :data:`_SECCOMP_ARCHES` (the worker then fails to start: fail closed)."""
    import platform
    import struct

    found = _SECCOMP_ARCHES.get(platform.machine())
    if found is None:
        raise OSError(f"no seccomp filter for {platform.machine()}")
    arch, nr = found
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, JGE, JSET, BPF_RET|K
    allow, kill = 0x7FFF0000, 0x80000000  # SECCOMP_RET_ALLOW, SECCOMP_RET_KILL_PROCESS
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38  # SECCOMP_RET_ERRNO | errno
    deny = [n for name, n in nr.items() if name not in ("clone", "clone3")]
    prog: list[tuple[int, int, int, int]] = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (ld, 0, 0, 0),
                                             (jge, 0, 1, 0x40000000), (ret, 0, 0, kill)]
    for n in deny:
        prog += [(jeq, 0, 1, n), (ret, 0, 0, eperm)]
    prog += [(jeq, 0, 1, nr["clone3"]), (ret, 0, 0, enosys), (jeq, 1, 0, nr["clone"]), (ret, 0, 0, allow),
             (ld, 0, 0, 16), (jset, 0, 1, 0x00010000), (ret, 0, 0, allow), (ret, 0, 0, eperm)]  # args[0] & CLONE_THREAD
    code = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog), ctypes.addressof(buf))
    pr_set_seccomp, seccomp_mode_filter = 22, 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def _harden(keep: set[int], parent: int) -> None:
    """Drop everything the worker does not need before it touches a client's path; ``parent`` is
    the pid of the process that started it, as that process said (``--parent``): a worker whose
    starter died while it was still starting finds another parent and exits."""
    for fd in range(3, max(keep) + 1):
        if fd not in keep:
            os.closerange(fd, fd + 1)
    os.closerange(max(keep) + 1, os.sysconf("SC_OPEN_MAX"))
    os.chdir("/")
    for name in [n for n in os.environ if n not in ("PATH", "LANG")]:  # HOME, MAGIC: libraries would read
        del os.environ[name]  # files the account controls (libmagic: $HOME/.magic); see mcpd.core.magicdb
    os.umask(0o077)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a core dump would hold file contents
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front decides when a worker ends
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_no_new_privs, pr_set_pdeathsig = 38, 1
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    # die with the process that started it (the front's pool, or root's fork server), even
    # in the middle of a long read: no worker outlives whoever controls it
    if libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(0)
    sched.run_as_batch()  # a request sent to it does not preempt the front
    _no_new_processes()  # last: from here on it starts no process


def main(argv: list[str] | None = None) -> int:
    """Entry point ``python -m mcpd.worker --fd N [--ctl M] --parent PID --limits JSON``; returns the exit status.

    ``--ctl`` is the control socket to the policy process, which passes over it the descriptors root
    opened for privileged reads
    (:func:`serve_granted`); workers started by the front itself (development mode) have none.

    ``--limits`` is a JSON object of :class:`mcpd.common.config.ReadLimits` fields (bytes), and,
    from the policy process, the principal's redaction under :data:`mcpd.common.redaction.REDACT_KEY`:
    every answer of this worker goes through those detectors, whatever a call says. Exits 0 when
    the socket closes, 2 on bad arguments (not a Unix stream socket, bad limits).
    """
    _seal()
    parser = argparse.ArgumentParser(prog="python -m mcpd.worker")
    parser.add_argument("--fd", type=int, required=True, help="the worker's socketpair end")
    parser.add_argument("--ctl", type=int, default=None,
                        help="the control socket to the policy process (privileged reads)")
    parser.add_argument("--parent", type=int, required=True, help="the pid of the process that started it")
    parser.add_argument("--limits", default="{}", help="ReadLimits as a JSON object (bytes)")
    opts = parser.parse_args(argv)
    try:
        given = json.loads(opts.limits)
        floor = from_args(given)  # the principal's redaction, when the policy process started it
        limits = ReadLimits(**{k: v for k, v in given.items() if k != REDACT_KEY})
        sock = socket.socket(fileno=opts.fd)
    except (ValueError, TypeError, AttributeError, OSError) as exc:  # (AttributeError: --limits not an object)
        print(f"mcpd.worker: bad arguments: {exc}", file=sys.stderr)
        return 2
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        print("mcpd.worker: --fd is not a Unix stream socket", file=sys.stderr)
        return 2
    ctl = socket.socket(fileno=opts.ctl) if opts.ctl is not None else None
    frames.use_codec(wirejson.dumps, wirejson.loads)  # orjson for every frame in and out
    _harden({opts.fd} | ({opts.ctl} if opts.ctl is not None else set()), opts.parent)
    if ctl is not None:  # hardened: the policy process may check it now
        status = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
        try:
            frames.send_frame(ctl, {"ready": True}, [status])
        finally:
            os.close(status)
    sock.setblocking(True)
    from mcpd.core import fileopen
    from mcpd.core.ops import OpContext

    ctx = OpContext(limits=limits, open_file=fileopen.open_regular, open_dir=fileopen.open_directory, redact=floor)
    with sock:
        serve(sock, ctx, ctl)
    return 0


