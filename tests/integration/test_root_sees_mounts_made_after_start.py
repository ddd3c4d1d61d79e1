"""Root judges each open by the mount table as it is at that open (docs/PRIVSEP.md section 5).

Root names an object by its place: the mount its descriptor lies on (``statx``'s mount id), looked
up in ``/proc/self/mountinfo``. Root keeps the table it read and reads it again only when the
kernel says it changed (``POLLPRI`` on the ``mountinfo`` root holds open). A table kept past a
change would misname places: a mount made after it was read is missing (every open through it
fails), and the kernel reuses a freed mount id at once, so a bind of the state folder made where
an ordinary folder was bound a moment ago took the ordinary folder's place, and its secrets were
served as ordinary files.

The root helper runs in a mount namespace of its own where the test binds folders (``nsenter``):
nothing reaches the shared host. Attacker: code as ``mcpd-policy`` on root's channel.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.support import rootns
from tests.support.privsep_fixture import LOG_TEXT, SECRET_TEXT, PrivsepDaemon, running_privsep
from tests.support.root_channels import Channel, as_policy

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def daemon() -> Iterator[PrivsepDaemon]:
    """The daemon, its helper in a mount namespace of its own."""
    with running_privsep(helper_wrap=rootns.own_mount_namespace()) as d:
        yield d


def in_helper_ns(d: PrivsepDaemon, *command: str) -> None:
    subprocess.run(["nsenter", "-t", str(d.helper_pid), "-m", *command], check=True, timeout=30)


def read(root: Channel, path: str) -> str:
    """What root opens at ``path`` (a privileged open, no symlink followed), or its refusal's reason."""
    reply, fds = root.ask("open", path=path, follow=False, want="file")
    try:
        return os.read(fds[0], 200).decode() if reply["ok"] else "refused: " + reply["error"]["details"]["reason"]
    finally:
        for fd in fds:
            os.close(fd)


def test_root_judges_by_the_mounts_made_after_its_last_open(daemon: PrivsepDaemon) -> None:
    """Root opens a file (its table is read), then: a bind of an ordinary folder made after that is
    served through; that bind replaced by a bind of the state folder at the same point (most often
    with the same mount id): its ``users.yaml`` and TLS key are refused as the daemon's secrets;
    unmounted again, the ordinary file is served as before."""
    d = daemon
    at = d.srv / "late-bind"
    at.mkdir()
    try:
        with as_policy(d) as root:
            assert read(root, str(d.secret)) == SECRET_TEXT
            in_helper_ns(d, "mount", "--bind", str(d.app), str(at))
            assert read(root, f"{at}/log.txt") == LOG_TEXT, "a mount made after root's last open"
            in_helper_ns(d, "umount", str(at))
            in_helper_ns(d, "mount", "--bind", str(d.state_dir), str(at))
            got = {name: read(root, f"{at}/{name}") for name in ("users.yaml", "tls/server.key")}
            assert got == {name: "refused: daemon secret" for name in got}, got
            in_helper_ns(d, "umount", str(at))
            assert read(root, str(d.app / "log.txt")) == LOG_TEXT
    finally:
        subprocess.run(["nsenter", "-t", str(d.helper_pid), "-m", "umount", "-l", str(at)], timeout=30,
                       stderr=subprocess.DEVNULL)
        at.rmdir()
