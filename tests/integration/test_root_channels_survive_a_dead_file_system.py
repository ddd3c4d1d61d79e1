"""A file system that stops answering holds only the channels of the opens that wait on it
(docs/PRIVSEP.md section 3, "Policy process -> root").

Each of root's channels is served by a root thread of its own, and a privileged ``open`` on a dead
network file system waits in the kernel as long as the server is gone. The policy process gave up
on such a channel after ``ROOT_SECONDS`` and then never used it again, and every channel served
every kind of request: 24 privileged reads by one principal on a dead mount took all 24 channels
for good. Every privileged call, login, new worker (root's ``spawn``) and, where the policy
process may not stat the users file (the shipped ``/etc/mcpd`` layout), every token check (root's
``config``) failed until the helper restarted, the file system's return notwithstanding.

Now the policy process keeps channels for the requests that must never wait behind an open
(``config``, ``account``, ``spawn``, ``walk``, ``kill``), lets privileged opens hold at most
``OPENS_EACH`` (4) channels for one principal and ``OPENS`` (12) in all until root answers, and
frees a channel when its late reply finally comes. The dead file system is FUSE that answers
nothing (``tests/support/deadfs.py``), mounted only in the root helper's own mount
namespace; "the server is back" is closing it, which makes every waiting ``open`` fail at once.
The attacker is an ordinary principal (alice) whose grant covers the mount, calling through the
real front over TLS; bob, another principal, must not notice.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.client.api import Client, text_of
from mcpd.policy.rootclient import OPENS_EACH, ROOT_SECONDS
from tests.support import rootns
from tests.support.osaccounts import AccountFactory
from tests.support.privsep_fixture import LOG_TEXT, PrivsepDaemon, start_privsep, stop_privsep

pytestmark = pytest.mark.root
CHANNELS = 24  # root's channels to the policy process (mcpd.helper.monitor.CHANNELS)
ROUNDS = 3  # rounds of 8 hung reads (one principal's share of the policy's call connections): 24 in all
DEADFS = Path(__file__).resolve().parents[1] / "support" / "deadfs.py"


@pytest.fixture(scope="module")
def dead_fs() -> Iterator[tuple[PrivsepDaemon, Path, subprocess.Popen[bytes]]]:
    """The daemon in the shipped ``/etc/mcpd`` layout (token checks need root's ``config``), its
    helper in a mount namespace of its own where a dead file system is mounted at ``srv/nfs``;
    alice may read ``app`` and the mount, bob ``app``."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    factory = AccountFactory()
    d = fuse = None
    try:
        d = start_privsep(factory, etc=True, workers={"per_account": 4, "timeout_seconds": 5},
                          helper_wrap=rootns.own_mount_namespace())
        mount = d.srv / "nfs"
        mount.mkdir(mode=0o755)
        fuse = subprocess.Popen(["nsenter", "-t", str(d.helper_pid), "-m", sys.executable, str(DEADFS), str(mount)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert fuse.stdout is not None and fuse.stdout.readline() == b"mounted\n"
        d.write_grants({"users": {
            d.accounts["alice"].name: {"privileged": {"tools": {"files/read": {"allowed": True, "paths": [str(d.app), str(mount)]}}}},
            d.accounts["bob"].name: {"privileged": {"tools": {"files/read": {"allowed": True, "paths": [str(d.app)]}}}}}})
        deadline = time.monotonic() + 20
        while read(d, "bob", str(d.log_file), True).get("text") != LOG_TEXT:
            assert time.monotonic() < deadline, "the grants did not reload"
            time.sleep(0.2)
        yield d, mount, fuse
    finally:
        if fuse is not None:
            fuse.kill()
            fuse.wait(timeout=10)
            for pipe in (fuse.stdin, fuse.stdout):
                if pipe is not None:
                    pipe.close()
        if d is not None:
            subprocess.run(["nsenter", "-t", str(d.helper_pid), "-m", "umount", "-l", str(d.srv / "nfs")],
                           timeout=30, check=False)
            stop_privsep(d)
        factory.cleanup()


def read(d: PrivsepDaemon, principal: str, path: str, privileged: bool) -> dict[str, Any]:
    """One ``files/read`` in a new session: ``{"text"}`` or ``{"error"}`` (a refused session too)."""
    async def go() -> dict[str, Any]:
        async with Client(d.url, d.tokens[principal], d.cacert, timeout=90) as c:
            res = await c.call_tool("files/read", {"path": path, "privileged": privileged}, check=False)
        return {"error": res["structuredContent"]["error"]} if res.get("isError") else {"text": text_of(res)}

    try:
        return asyncio.run(go())
    except Exception as exc:  # noqa: BLE001 - a 401/503 or a broken session is an answer here too
        return {"error": {"code": type(exc).__name__, "message": str(exc)[:200]}}


def stuck(pid: int) -> int:
    """Threads of the root helper waiting for the dead file system."""
    count = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            count += "fuse" in Path(f"/proc/{pid}/task/{tid}/stack").read_text() or \
                "request_wait_answer" in Path(f"/proc/{pid}/task/{tid}/wchan").read_text()
        except OSError:
            pass
    return count


def test_a_dead_file_system_holds_only_its_own_opens_and_gives_them_back(
        dead_fs: tuple[PrivsepDaemon, Path, subprocess.Popen[bytes]]) -> None:
    """Three rounds of 8 privileged reads by alice on the dead mount hold at most 4 of root's
    threads; meanwhile bob's new session, its first (unprivileged) read, which needs a new
    worker, and its privileged read all succeed. After the policy process has given up on the
    hung opens (``ROOT_SECONDS``), the file system comes back: within seconds no root thread waits
    and alice's privileged read succeeds again, her channels given back."""
    d, mount, fuse = dead_fs
    assert read(d, "alice", str(d.log_file), True).get("text") == LOG_TEXT
    first, widest = time.monotonic(), 0
    for n in range(ROUNDS):  # each round ends at the calls' deadline

        async def round_(n: int = n) -> None:
            async def one(i: int) -> None:
                async with Client(d.url, d.tokens["alice"], d.cacert, timeout=90) as c:
                    await c.call_tool("files/read", {"path": f"{mount}/f{n}-{i}", "privileged": True}, check=False)
            await asyncio.gather(*(one(i) for i in range(8)), return_exceptions=True)

        asyncio.run(round_())
        widest = max(widest, stuck(d.helper_pid))
    assert 0 < widest <= OPENS_EACH, f"{ROUNDS * 8} hung reads by one principal held {widest} of root's {CHANNELS} threads"
    meanwhile = {"bob's first read (new session, new worker)": read(d, "bob", "/etc/hostname", False),
                 "bob's privileged read": read(d, "bob", str(d.log_file), True)}
    assert all("text" in r for r in meanwhile.values()), f"while alice's opens hang: {meanwhile}"
    time.sleep(max(0.0, first + ROOT_SECONDS + 5 - time.monotonic()))  # the policy gives each hung open up
    fuse.stdin.close()  # type: ignore[union-attr]  # "the server is back": every waiting open ends now
    fuse.wait(timeout=30)
    deadline = time.monotonic() + 30
    while stuck(d.helper_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stuck(d.helper_pid) == 0
    deadline, after = time.monotonic() + 20, {}
    while time.monotonic() < deadline:
        after = read(d, "alice", str(d.log_file), True)
        if "text" in after:
            break
        time.sleep(0.5)
    assert after.get("text") == LOG_TEXT, f"after the file system came back alice still gets {after}"
