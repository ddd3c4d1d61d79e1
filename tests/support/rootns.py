"""Helpers for tests that play a compromised policy process against root in a namespace of its own.

Some attacks need a host layout no test may make on a shared machine: an account database entry
with uid 4294967295, an alias of the service user's uid, a member of group ``mcpd``, a file system
that never answers. :func:`own_mount_namespace` gives a command prefix for
:attr:`~tests.support.privsep_fixture.PrivsepDaemon.helper_wrap`: the root helper (and so the
policy process, the fork server, workers and walkers) runs in a mount namespace of its own with
private propagation, after a shell command that changes only that namespace (:func:`etc_copy`
binds a copy of ``/etc`` with extra lines over ``/etc``). Other sessions' mounts do not reach it,
and nothing it mounts reaches them.

:func:`wait_exec`, :func:`front_socket` and :func:`ask` speak to a worker root spawned, as the
front (or code as ``mcpd-policy`` holding the worker's front end) would.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any

from mcpd.common import wirejson
from mcpd.helper.wire import frames


def own_mount_namespace(shell: str = "true") -> list[str]:
    """A command prefix: ``shell`` (``sh -c``), then the command, in a new mount namespace with
    private propagation."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{shell} && exec "$@"', "sh"]


def etc_copy(folder: str, passwd: list[str] | None = None, members: dict[str, str] | None = None) -> str:
    """A ``shell`` for :func:`own_mount_namespace`: copy ``/etc`` to ``folder/etc`` when the helper
    starts (accounts made until then are in it), append ``passwd`` lines to its ``passwd`` and each
    ``{group: member}`` to its ``group``, and bind the copy over ``/etc``. The whole folder is bound,
    not single files: ``useradd`` on the host replaces ``/etc/passwd`` by a rename, which would
    drop a mount on the file itself."""
    script = (
        "import json, shutil, sys; f, lines, members = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])\n"
        "shutil.rmtree(f + '/etc', ignore_errors=True); shutil.copytree('/etc', f + '/etc', symlinks=True)\n"
        "open(f + '/etc/passwd', 'a').write(''.join(l + '\\n' for l in lines))\n"
        "rows = open(f + '/etc/group').read().splitlines()\n"
        "rows = [r + ('' if r.endswith(':') else ',') + members[r.split(':')[0]] if r.split(':')[0] in members else r"
        " for r in rows]\n"
        "open(f + '/etc/group', 'w').write('\\n'.join(rows) + '\\n')\n")
    args = shlex.join([sys.executable, "-I", "-c", script, folder, json.dumps(passwd or []), json.dumps(members or {})])
    return f"{args} && mount --bind {shlex.quote(folder)}/etc /etc"


def wait_exec(pid: int, seconds: float = 15.0) -> None:
    """Until ``pid`` runs ``mcpd.worker`` (the fork server's child has exec'd; bounded)."""
    deadline = time.monotonic() + seconds
    while b"mcpd.worker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.05)


def front_socket(fd: int) -> socket.socket:
    """A socket object of a copy of ``fd`` (the caller keeps ``fd``)."""
    return socket.socket(fileno=os.dup(fd))


def ask(sock: socket.socket, op: str, seconds: float = 30.0, **args: Any) -> dict[str, Any]:
    """One request ``{"id", "op", "args"}`` on a worker's front socket and its reply; a
    ``text_frame`` reply gets its text back in ``result["text"]``."""
    frames.send_frame(sock, {"id": 1, "op": op, "args": args})

    def body() -> bytes:
        assert select.select([sock], [], [], seconds)[0], "the worker did not answer"
        return _exact(sock, int.from_bytes(_exact(sock, 4), "big"))

    reply = wirejson.loads(body())
    if reply.get("text_frame"):
        reply["result"]["text"] = body().decode("utf-8", "replace")
    return dict(reply)


def _exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "the worker closed its socket"
        out += chunk
    return bytes(out)
