"""The users tool's temporary file is as secret as ``users.yaml`` (docs/PRIVSEP.md, the fixed deny).

``mcpd users add``, ``rotate``, ... (``identity.save_users``) write the whole new ``users.yaml``
(every token digest) to a temporary file beside it, then rename it over the file. It was named
``.users.XXXXXXXX``, which neither the policy's fixed deny (``users.yaml*``, ``.users.yaml*``) nor
root's secrets covered, and it stays for good when the tool dies before the rename (SIGHUP from a
dropped SSH session, SIGKILL). It is now ``.users.yaml.XXXXXXXX``: covered as the file's own swap
files are.

The tool runs for real, writing in a loop, and is stopped (SIGSTOP) until its temporary file exists
(bounded tries), then killed, leaving the file. Attackers: alice, granted ``/``, listing the folder
and reading the file through the front, and code as ``mcpd-policy`` asking root to open it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcpd.common import identity
from tests.support.privsep_fixture import PrivsepDaemon, privsep_daemon  # noqa: F401
from tests.support.root_channels import as_policy
from tests.support.root_objects import call, everywhere  # noqa: F401

pytestmark = pytest.mark.root
TRIES = 400
LOOP = ("import sys; from mcpd.common import identity; p = sys.argv[1]; u = identity.load_users(p)\n"
        "print('go', flush=True)\nwhile True: identity.save_users(p, u)\n")


def temporary(folder: Path) -> list[Path]:
    """The users tool's temporary files in ``folder`` (any name ``.users.*`` but the swap files of
    the old naming's ``users.yaml`` itself)."""
    return sorted(p for p in folder.iterdir() if p.name.startswith(".users.") and p.name != ".users.yaml")


def left_behind(users: Path) -> Path:
    """Run the users tool on ``users`` until it is stopped with its temporary file written to; kill
    it there and return the file."""
    tool = subprocess.Popen([sys.executable, "-c", LOOP, str(users)], stdout=subprocess.PIPE)
    try:
        assert tool.stdout is not None and tool.stdout.readline() == b"go\n"
        for _ in range(TRIES):
            tool.send_signal(signal.SIGSTOP)
            if (found := [p for p in temporary(users.parent) if p.stat().st_size]):
                return found[0]
            tool.send_signal(signal.SIGCONT)
            time.sleep(0.005)  # (lets the tool run on: any point of its loop will do)
        raise AssertionError(f"the tool was never seen with its temporary file in {TRIES} tries")
    finally:
        tool.kill()
        tool.wait(timeout=10)
        if tool.stdout is not None:
            tool.stdout.close()


def test_the_users_tools_temporary_file_is_a_secret(everywhere: PrivsepDaemon) -> None:  # noqa: F811
    """The file the killed tool left holds the digests; alice's listing of the state folder does not
    show it, her read of it is refused, and root refuses to open it for ``mcpd-policy``."""
    d = everywhere
    users = d.state_dir / "users.yaml"
    before = identity.load_users(users)
    many = dict(before)
    for n in range(60):  # a site with 60 principals: more than one write buffer of YAML
        many[f"p{n}"] = identity.UserRecord(name=f"p{n}", os_user=d.accounts["bob"].name,
                                            tokens=[identity.new_token()[1]])
    identity.save_users(users, many)
    try:
        name = left_behind(users)
        listed = {e["name"] for e in call(d, "files/list", path=str(d.state_dir))["entries"]}
        read = call(d, "files/read", path=str(name))
        with as_policy(d) as root:
            reply, fds = root.ask("open", path=str(name), follow=False, want="file")
            for fd in fds:
                os.close(fd)
        assert name.name not in listed and "text" not in read and reply["ok"] is False, \
            f"{name.name} is listed: {name.name in listed}, read through a grant on /: " \
            f"{'sha256' in read.get('text', '')} (digests), opened by root for mcpd-policy: {reply['ok']}"
    finally:
        for p in temporary(d.state_dir):
            p.unlink()
        identity.save_users(users, before)
