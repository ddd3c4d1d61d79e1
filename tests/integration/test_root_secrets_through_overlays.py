"""The daemon's secrets are not served through an overlay that stacks over them (docs/PRIVSEP.md
section 5).

Root's opener and the walker judge a secret by its *place* (file system ``major:minor`` and the
path from that file system's root). An overlay mount whose lower layer is the state folder shows
the very same files (``users.yaml``, the TLS and CA keys, the policy's state, the audit log) on
another file system (``overlay``, an anonymous ``0:N`` device): no place and no lexical prefix
matched, and root served them. An overlay is an ordinary administrator's layout (container roots,
``/etc`` overlays on read-only systems, ``systemd-sysext``).

Root cannot follow an overlay's file back to the layer that holds it, but the kernel says which
folders an overlay stacks (``lowerdir``, ``upperdir`` in ``/proc/self/mountinfo``): root refuses
everything on an overlay one of whose layers holds a secret, lies in one, or cannot be found (a
relative path, a folder outside root's mount namespace), and the walker hides and refuses the same.

The root helper runs in a mount namespace of its own, where the overlays are mounted (``nsenter``):
nothing reaches the shared host. Attackers: code as ``mcpd-policy`` on root's channel, and a
principal whose grant covers ``/`` calling through the real front.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import rootns
from tests.support.privsep_fixture import LOG_TEXT, SECRET_TEXT, PrivsepDaemon, running_privsep
from tests.support.root_channels import as_policy
from tests.support.root_objects import call, refused

pytestmark = pytest.mark.root
SECRETS = ["users.yaml", "mcpd.yaml", "mcp-sudo.yaml", "tls/server.key", "tls/ca.key", "audit/audit.jsonl",
           "dev-token"]
SECRET = "the daemon's own secrets are never served"


@pytest.fixture(scope="module")
def daemon() -> Iterator[PrivsepDaemon]:
    """The daemon, its helper in a mount namespace of its own, a development token in its state
    folder, alice granted read, list and find on ``/``."""
    with running_privsep(helper_wrap=rootns.own_mount_namespace()) as d:
        (d.state_dir / "dev-token").write_text("secret\n")
        (d.state_dir / "dev-token").chmod(0o600)
        rule = {"allowed": True, "paths": ["/"]}
        d.write_grants({"users": {d.accounts["alice"].name: {"privileged": {"tools": {
            t: dict(rule) for t in ("files/read", "files/list", "files/find")}}}}})
        deadline = time.monotonic() + 20
        while call(d, "files/read", path=str(d.secret)).get("text") != SECRET_TEXT:
            assert time.monotonic() < deadline, "the grants did not reload"
            time.sleep(0.2)
        yield d


@contextlib.contextmanager
def overlay(d: PrivsepDaemon, at: Path, scratch: Path, lower: str) -> Iterator[Path]:
    """``lower`` (``lowerdir=``, as given) seen through an overlay mounted at ``at`` in the helper's
    mount namespace (upper and work folders in ``scratch``, the mount run from ``scratch``, so a
    relative ``lower`` is taken from there); always unmounted after."""
    for p in (at, scratch / "upper", scratch / "work"):
        p.mkdir(parents=True, exist_ok=True)
    ns = ["nsenter", "-t", str(d.helper_pid), "-m"]
    options = f"lowerdir={lower},upperdir={scratch}/upper,workdir={scratch}/work"
    subprocess.run([*ns, "sh", "-c", 'cd "$1" && exec mount -t overlay overlay -o "$2" "$3"', "sh", str(scratch), options,
                    str(at)], check=True, timeout=30)
    try:
        yield at
    finally:
        if subprocess.run([*ns, "umount", str(at)], timeout=30).returncode != 0:
            subprocess.run([*ns, "umount", "-l", str(at)], check=True, timeout=30)
        at.rmdir()


def test_root_refuses_the_secrets_through_an_overlay_of_the_state_folder(daemon: PrivsepDaemon, tmp_path: Path) -> None:
    """Code as ``mcpd-policy`` asks root to open each secret through an overlay whose lower layer
    is the state folder, and a file of it that is no secret: all ``daemon secret``. Through an
    overlay of a folder with no secret in it, root opens the root-only file."""
    d = daemon
    call(d, "files/read", path=str(d.log_file))  # the audit log exists
    served: dict[str, str] = {}
    with overlay(d, d.srv / "ov", tmp_path / "a", str(d.state_dir)) as ov, \
            overlay(d, d.srv / "app-ov", tmp_path / "b", str(d.app)) as plain, as_policy(d) as root:
        for name in [*SECRETS, "front.log"]:
            reply, fds = root.ask("open", path=f"{ov}/{name}", follow=False, want="file")
            try:
                if reply["ok"]:
                    served[name] = os.read(fds[0], 200).decode(errors="replace")
                else:
                    assert reply["error"]["details"]["reason"] == "daemon secret", (name, reply)
            finally:
                for fd in fds:
                    os.close(fd)
        reply, fds = root.ask("open", path=f"{plain}/log.txt", follow=False, want="file")
        assert reply["ok"] is True and os.read(fds[0], 100).decode() == LOG_TEXT, reply
        os.close(fds[0])
    assert served == {}, f"root opened these through an overlay of the state folder: {sorted(served)}; " \
                         f"users.yaml starts {served.get('users.yaml', '')[:40]!r}"


def test_root_refuses_an_overlay_whose_layers_it_cannot_find(daemon: PrivsepDaemon, tmp_path: Path) -> None:
    """An overlay mounted with a relative ``lowerdir`` (root cannot tell which folder it was):
    refused, whatever it shows; so is one whose lower layer lies inside a secret (the TLS folder)."""
    d = daemon
    (tmp_path / "c" / "rel").mkdir(parents=True)
    (tmp_path / "c" / "rel" / "f").write_text("x\n")
    with overlay(d, d.srv / "rel-ov", tmp_path / "c", "rel") as rel, \
            overlay(d, d.srv / "tls-ov", tmp_path / "d", str(d.state_dir / "tls")) as keys, as_policy(d) as root:
        for path in (f"{rel}/f", f"{keys}/server.crt"):
            error = root.refused("open", path=path, follow=False, want="file")
            assert error["details"]["reason"] == "daemon secret", (path, error)


def test_a_grant_on_root_reads_and_lists_no_secret_through_an_overlay(daemon: PrivsepDaemon, tmp_path: Path) -> None:
    """A principal granted ``/`` reads ``users.yaml`` and the TLS key, lists and searches the
    overlay of the state folder: each refused; an overlay of a folder without secrets is listed."""
    d = daemon
    with overlay(d, d.srv / "ov", tmp_path / "a", str(d.state_dir)) as ov, \
            overlay(d, d.srv / "app-ov", tmp_path / "b", str(d.app)) as plain:
        got = {name: call(d, "files/read", path=f"{ov}/{name}") for name in ("users.yaml", "tls/server.key")}
        listed, found = call(d, "files/list", path=str(ov)), call(d, "files/find", root=str(ov))
        inside = call(d, "files/list", path=str(plain))
    leaked = {name: r["text"][:30] for name, r in got.items() if "text" in r}
    assert leaked == {} and all(refused(r) for r in got.values()), f"read through an overlay: {leaked or got}"
    assert refused(listed, SECRET) and refused(found, SECRET), (listed, found)
    assert [e["name"] for e in inside["entries"]] == ["log.txt"], inside
