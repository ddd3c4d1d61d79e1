"""One privileged files/list, files/find or files/grep metadata walk, out of root (docs/REFERENCE.md §4.4, §4.5a; docs/PRIVSEP.md).

The fork server starts it for each call as ``python -I -m mcpd.walker --fd 3``, already dropped to
the walker account (:data:`mcpd.common.config.WALK_USER`: not root, no groups, owns nothing) with
CAP_DAC_READ_SEARCH alone (read and list any folder, ``lstat`` anything), no_new_privs, and no
descriptor but its channel to the root helper. It reads one request frame from the helper::

    {"op", "args" (the call's arguments, the path already the decided one), "os_user", "groups",
     "follow" (the grant covers /), "rules" (the rules that apply to the principal for the tool, as
     data: :func:`mcpd.common.grantmatch.rules_to_wire`), "secrets" (the fixed deny),
     "login_time" (a password login's, UNIX seconds; null for a static token), "login_used"}

parses and checks ``args`` with the tool's own ``parse_args`` (so both routes answer the same
codes, ``INVALID_ARGUMENT`` included), walks with :mod:`mcpd.core.walk` (names and ``lstat``
only, never a byte of content), shows an entry only when the same grants allow it for the same
principal (the secrets never are), sends one reply frame ``{"ok": true, "result": RAW}`` or
``{"ok": false, "error": {...}}`` and exits. The policy process has root SIGKILL it at the call's deadline.

For ``files/grep`` the walk is a plan (:func:`plan_grep`): the regular files to search, in the
walk's order, streamed as frames ``{"plan": {"files": [PATH], "skips": [[PATH, REASON]],
"not_granted": N}}`` before the one reply, which says whether the time ran out and where. It
never opens a file: root opens each one the policy process judges granted again.

The grants judge the path asked; the secrets and processes are judged by the object actually
opened (:class:`Objects`): every folder the walk opens and every entry it shows is taken as
its place (:func:`mcpd.helper.wire.opener.place`: its file system and its path from that file
system's root), and the secrets' patterns are moved to places too, so a symlink or a bind mount
to the policy's state folder, or to the folder of ``users.yaml``, lists nothing secret. A
process's ``/proc`` folder (``/proc/PID``, ``self``, ``thread-self``) is never shown or entered,
so the daemon's own processes, like every other, are invisible to a privileged list or find.

Before it walks, it confines itself with Landlock where the kernel has it (:func:`metadata_only`):
from then on it can list folders, ``lstat`` and ``readlink``, but not open a file for reading,
write, create, remove, execute, use TCP or signal outside itself. So even a walker taken over
reads no file content, although CAP_DAC_READ_SEARCH alone would let it.
"""

from __future__ import annotations

import ctypes
import datetime
import functools
import os
import posixpath
import re
import resource
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from mcpd.common import frames, grantmatch
from mcpd.core import grepargs, grepwalk, walk
from mcpd.helper.wire import opener
from mcpd.helper.wire.errors import INTERNAL_ERROR, INVALID_ARGUMENT, NOT_A_REGULAR_FILE, ToolError

REQUEST_CAP = 4 * 1024 * 1024  # bytes: the call and its rules (from a grants file of at most 1 MiB)
READ_SECONDS = 5.0  # the policy process sends the request as soon as the walker exists
OPS: dict[str, tuple[Callable[..., dict[str, Any]], Callable[[Any], dict[str, Any]]]] = {  # op -> (walk, parse)
    "files/list": (walk.walk_list, walk.parse_list_args), "files/find": (walk.walk_find, walk.parse_find_args)}
GREP = "files/grep"
PLAN_BATCH = 64  # files and skips per plan frame of files/grep
_PR_SET_DUMPABLE = 4
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_RESTRICT_SELF = 444, 446  # the same on every architecture
_LANDLOCK_READ_DIR = 1 << 3


def metadata_only() -> bool:
    """Confine this process for good with Landlock: of the file system accesses the kernel knows,
    only listing a folder stays allowed (``O_PATH`` opens, ``stat`` and ``readlink`` are not
    file-system accesses to Landlock); TCP bind/connect and signals or abstract sockets outside
    this process are refused where the kernel can. Returns False, confining nothing, where the
    kernel lacks Landlock or refuses it (the walker then relies on its uid and capability)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # ABI version
    if abi < 1:
        return False
    fs = (1 << (13 + (abi >= 2) + (abi >= 3))) - 1 | (1 << 15 if abi >= 5 else 0)  # ABI 2: REFER, 3: TRUNCATE, 5: IOCTL_DEV
    attr = (ctypes.c_uint64 * 3)(fs & ~_LANDLOCK_READ_DIR, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 8 * (1 + (abi >= 4) + (abi >= 6))  # struct landlock_ruleset_attr grew with the ABI
    fd = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        return False
    try:
        return bool(libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) == 0)
    finally:
        os.close(fd)


def _literal(pattern: str) -> str | None:
    """The path a secret pattern names when it has no glob of its own (escaped ``[*]`` ... count
    as the character), else None."""
    path = re.sub(r"\[([*?[])\]", r"\1", pattern)
    return path if grantmatch.escape_glob(path) == pattern else None


class Objects:
    """The object rule of privileged list and find (module docstring).

    Args:
        secrets: the fixed deny's patterns (:func:`mcpd.policy.grants.secret_paths`). Each pattern
            ``FOLDER/NAME`` becomes ``PLACE/NAME`` on the file system of ``FOLDER``'s place, and a
            pattern naming one existing file or folder also becomes that object's own place (a
            folder that is a mount of its own); one naming a symlink to a file (the TLS key in a
            certbot layout) also gives the whole folder of the file it leads to now, as root's
            :meth:`mcpd.helper.monitor.Monitor.places` does.

    Build it before the Landlock confinement: it reads the mount table, which later mounts are
    not in (what lies on one of them is refused or hidden: fail closed).
    """

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self.table, self.index = opener.mounts(), dict[str, tuple[str, ...]]()  # file system -> secret patterns
        self._stacked: dict[str, bool] = {}  # overlay file system -> whether it stacks over a secret
        for text in secrets:
            folder, name = posixpath.split(text)
            for literal, tail in ((_literal(folder), name), (_literal(text), "")):
                where = None if literal is None else opener.place_of(literal, self.table)
                if literal is None or where is None:
                    continue
                pattern = posixpath.join(grantmatch.escape_glob(where[1]), tail) if tail else grantmatch.escape_glob(where[1])
                self.index[where[0]] = (*self.index.get(where[0], ()), pattern)
                if not tail and os.path.islink(literal) and not os.path.isdir(literal):  # a symlinked key (certbot)
                    self.index[where[0]] += (grantmatch.escape_glob(posixpath.dirname(where[1])),)

    def refused(self, where: opener.Place) -> str | None:
        """Why a place is never shown (a process's folder, a secret), or None."""
        if opener.of_a_process(where):
            return opener.PROCESS
        return grantmatch.SECRET if self.secret(where) else None

    def secret(self, where: opener.Place) -> bool:
        """Whether a place is at or below a secret's, or lies on an overlay one of whose layers is,
        holds a secret below it, or cannot be found (the rule of root's
        :meth:`mcpd.helper.monitor.Monitor.secret`)."""
        if grantmatch.is_secret(self.index.get(where[0], ()), where[1]):
            return True
        if where[0] not in self._stacked:
            layers = [opener.place_of(p, self.table) if p.startswith("/") else None for p in opener.layers(where, self.table)]
            self._stacked[where[0]] = any(w is None or self.secret(w) or any(
                p.startswith(grantmatch.escape_glob(w[1]).rstrip("/") + "/") for p in self.index.get(w[0], ())) for w in layers)
        return self._stacked[where[0]]

    def judge(self, fd: int) -> str | None:
        """Why a folder (any descriptor) is never listed: its place is refused or cannot be told
        (:data:`mcpd.helper.wire.opener.Judge`, for the opener of the walk's folders)."""
        try:
            return self.refused(opener.place(fd, self.table))
        except (OSError, KeyError, ValueError):
            return "its place cannot be told"

    def screen(self, dfd: int) -> Callable[[str], bool]:
        """The entries of the open folder ``dfd`` never shown (:data:`mcpd.core.walk.Screen`): an
        entry's place is the folder's plus its name, or for a mount point the root of the mount
        there (``statx``'s mount id tells); one whose place cannot be told is hidden."""
        try:
            mnt, (fs, inside, kind) = opener.mount_id(dfd), opener.place(dfd, self.table)
        except (OSError, KeyError, ValueError):
            return lambda name: True

        def hidden(name: str) -> bool:
            try:
                entry = opener.mount_id(dfd, name)
                other = self.table[entry]
            except (OSError, KeyError):  # gone since listed, or mounted since the walk began
                return True
            where = (fs, posixpath.join(inside, name), kind) if entry == mnt else (other[0], other[1], other[3])
            return self.refused(where) is not None

        return hidden


def plan_grep(args: dict[str, Any], open_dir: walk.Opener, allow: walk.Allow, counted: Callable[[str], bool],
              screen: walk.Screen, send: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The plan of one privileged ``files/grep`` (module docstring): the walk of
    :func:`mcpd.core.grepwalk.walk_files` from the parsed ``args``' path and cursor, with the
    grant filter ``allow`` and the object rule ``screen``. Each plan frame goes to ``send`` (at
    most :data:`PLAN_BATCH` files and skips); ``not_granted`` counts the files ``allow`` refused
    for which ``counted`` says so (not the daemon's secrets: they are never told). A path that is
    no directory is planned alone (``{"alone": true}``; root's opener judges what it is). Returns
    the reply's result ``{"alone", "stopped": None | "time_budget", "stop_path"}``.

    Raises:
        ToolError: the opener's error for the path; ``INVALID_ARGUMENT`` for a cursor of another path.
    """
    root, cursor = walk.clean(args["path"]), grepargs.cursor_of(args)
    at = grepwalk.resume_at(root, cursor)
    if at is None:
        raise ToolError(INVALID_ARGUMENT, "cursor belongs to another search: pass next_cursor back unchanged",
                        argument="cursor")
    try:
        rfd = open_dir(root)
    except ToolError as exc:
        if exc.code != NOT_A_REGULAR_FILE:
            raise
        if cursor is None or not at and cursor["o"] is not None:
            send({"plan": {"files": [root], "skips": [], "not_granted": 0}})
        return {"alone": True, "stopped": None, "stop_path": None}
    plan: dict[str, Any] = {"files": [], "skips": [], "not_granted": 0}
    deadline, ticks, stopped = time.monotonic() + args["time_budget_seconds"], [0], [""]

    def flush(full: bool = True) -> None:
        if full and len(plan["files"]) + len(plan["skips"]) < PLAN_BATCH:
            return
        if plan["files"] or plan["skips"] or plan["not_granted"]:
            send({"plan": dict(plan)})
            plan.update(files=[], skips=[], not_granted=0)

    def skip(path: str, reason: str) -> None:
        plan["skips"].append([path, reason])
        flush()

    def tick(path: str) -> bool:
        ticks[0] += 1
        if ticks[0] % 64 == 0 and time.monotonic() > deadline:
            stopped[0] = path
            return True
        return False

    def refused(path: str) -> None:
        if counted(path):
            plan["not_granted"] += 1

    try:
        for _, _, path, resumed in grepwalk.walk_files(rfd, root, args, skip, tick, allow, screen, at, refused):
            if not (resumed and cursor is not None and cursor["o"] is None):
                plan["files"].append(path)
                flush()
    finally:
        os.close(rfd)
    flush(False)
    return {"alone": False, "stopped": "time_budget" if stopped[0] else None, "stop_path": stopped[0] or None}


def run(frame: dict[str, Any], confine: Callable[[], object] = lambda: None,
        send: Callable[[dict[str, Any]], None] = lambda _: None) -> dict[str, Any]:
    """The reply frame for one request frame (module docstring); never raises. ``confine`` runs
    once everything is parsed, just before the walk (:func:`metadata_only` in a real walker);
    ``send`` sends ``files/grep``'s plan frames before the reply."""
    try:
        op = frame["op"]
        walk_op, parse_args = OPS[op] if op != GREP else (None, grepargs.parse_grep_args)
        args = parse_args(frame["args"])
        policy = grantmatch.policy_from_wire(frame["rules"], tuple(frame["secrets"]))
        follow, user, groups = bool(frame["follow"]), frame["os_user"], frozenset(frame["groups"])
        since = frame.get("login_time")  # a password login's (reauth_after), None for a static token
        login_time = None if since is None else datetime.datetime.fromtimestamp(since, datetime.UTC)
        used = frame.get("login_used") is True
        objects = Objects(tuple(frame["secrets"]))  # reads the mount table: before confining
        confine()

        def decide(path: str) -> grantmatch.Decision:
            return grantmatch.decide(policy, user, groups, op, path, grantmatch.utcnow(), login_time, used)

        def allow(path: str) -> bool:
            return decide(path).allowed

        open_dir = functools.partial(opener.open_checked_dir, follow_symlinks=follow, judge=objects.judge)
        if walk_op is None:
            return {"ok": True, "result": plan_grep(args, open_dir, allow, lambda p: decide(p).reason !=
                                                    grantmatch.SECRET, objects.screen, send)}
        return {"ok": True, "result": walk_op(args, open_dir, allow, screen=objects.screen)}
    except ToolError as exc:
        return {"ok": False, "error": exc.to_dict()}
    except Exception:  # noqa: BLE001 - the walker answers, whatever happened
        return {"ok": False, "error": ToolError(INTERNAL_ERROR, "internal error").to_dict()}


def main(argv: list[str] | None = None) -> int:
    """Entry point ``python -m mcpd.walker --fd N``: one request, one reply. Returns 0 after
    replying, 1 when no well-formed request arrived within :data:`READ_SECONDS`, 2 on bad usage."""
    argv = sys.argv[1:] if argv is None else argv  # no argparse: every walker start counts (one per call)
    if len(argv) != 2 or argv[0] != "--fd" or not argv[1].isdigit():
        print("usage: python -m mcpd.walker --fd N", file=sys.stderr)
        return 2
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # not dumpable: another walker (same uid) cannot ptrace it or read its /proc entries
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return 1
    with socket.socket(fileno=int(argv[1])) as chan:
        chan.settimeout(READ_SECONDS)
        try:
            frame = frames.recv_frame(chan, REQUEST_CAP)
        except (OSError, frames.FrameError):
            return 1
        if frame is None:
            return 1
        chan.settimeout(None)
        frames.send_frame(chan, run(frame, metadata_only, lambda plan: frames.send_frame(chan, plan)))
    return 0
