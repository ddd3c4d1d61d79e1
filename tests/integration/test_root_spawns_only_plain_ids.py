"""Root starts nothing as an account whose uid or gid is not a plain id (docs/PRIVSEP.md section 3).

An account database entry may hold uid 4294967295 (``(uid_t) -1``): ``useradd`` refuses it, but
``/etc/passwd`` edited by hand, LDAP or sssd can hold it. Python's ``pwd`` gives it as ``-1``, and
``setresuid(-1, -1, -1)`` means "leave every uid as it is": a child of the fork server told to
become it stays root, with the helper's capabilities. Root refuses every uid and gid that is not
above 0 and below 4294967295, the policy process refuses it too, and the fork server's child
checks after ``setresuid`` that its ids are the ones asked for, or exits before ``exec``.

The entry is not written to the host's ``/etc/passwd`` (other sessions share it): the root
helper runs in a mount namespace of its own with a copy of ``/etc`` holding the extra line
(:mod:`tests.support.rootns`). The attackers: code as ``mcpd-policy`` on root's channel
asking for ``spawn``, and an administrator's ordinary act, a principal bound to that account.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.client.api import Client, text_of
from mcpd.common import identity
from mcpd.helper import forkserver
from tests.support import rootns
from tests.support.osaccounts import AccountFactory
from tests.support.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep
from tests.support.root_channels import as_policy

pytestmark = pytest.mark.root
NAME = "mcpdnoid"  # the account of uid 4294967295, in the helper's namespace only


@pytest.fixture(scope="module")
def minus_one() -> Iterator[PrivsepDaemon]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    factory = AccountFactory()
    folder = Path(tempfile.mkdtemp(prefix="mcpd-noid-"))
    d = None
    try:
        gid = factory.user().gid  # an ordinary group as the entry's primary gid
        shell = rootns.etc_copy(str(folder), [f"{NAME}:x:4294967295:{gid}::/nonexistent:/usr/sbin/nologin"])
        d = start_privsep(factory, helper_wrap=rootns.own_mount_namespace(shell))
        yield d
    finally:
        if d is not None:
            stop_privsep(d)
        factory.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


def test_root_spawns_no_worker_for_an_account_of_uid_4294967295(minus_one: PrivsepDaemon) -> None:
    """Code as ``mcpd-policy`` asks root's table for a worker as that account: refused, reason
    ``not a plain id``, and nothing starts (before: a worker of uid 0 that read the TLS key)."""
    d = minus_one
    with as_policy(d) as root:
        reply, fds = root.ask("spawn", user=NAME, limits='{"default_bytes": 4096}')
        try:
            if reply["ok"]:
                rootns.wait_exec(reply["pid"])
                with rootns.front_socket(fds[0]) as front:
                    key = rootns.ask(front, "files/read", path=str(d.state_dir / "tls" / "server.key"))
                root.ask("kill", pid=reply["pid"])
                pytest.fail(f"root spawned a worker for uid 4294967295; the TLS key read: {str(key)[:80]!r}")
        finally:
            for fd in fds:
                os.close(fd)
        assert reply["error"]["code"] == "PERMISSION_DENIED" and reply["error"]["details"]["reason"] == "not a plain id"
        error = root.refused("pam", user=NAME, password="x")  # the same accounts as spawn
        assert error["details"]["reason"] == "not a plain id", error


def test_a_principal_bound_to_that_account_reads_nothing_as_root(minus_one: PrivsepDaemon) -> None:
    """A principal in ``users.yaml`` bound to the account makes an *unprivileged* read of
    ``/etc/shadow`` through the front: refused (no worker), never root's rights."""
    d = minus_one
    users = identity.load_users(d.state_dir / "users.yaml")
    token, rec = identity.new_token()
    users["noid"] = identity.UserRecord(name="noid", os_user=NAME, tokens=[rec])
    identity.save_users(d.state_dir / "users.yaml", users)

    async def go() -> dict[str, Any]:
        async with Client(d.url, token, d.cacert, timeout=60) as c:
            res = await c.call_tool("files/read", {"path": "/etc/shadow"}, check=False)
        return {"error": res["structuredContent"]["error"]} if res.get("isError") else {"text": text_of(res)}

    deadline = time.monotonic() + 20
    while True:  # until the policy process has read users.yaml again
        try:
            got = asyncio.run(go())
            break
        except Exception:  # noqa: BLE001 - 401 until the reload
            assert time.monotonic() < deadline, "the new principal was never accepted"
            time.sleep(0.3)
    assert "text" not in got, f"an unprivileged read as that principal returned /etc/shadow: {got['text'][:30]!r}"
    assert got["error"]["code"] == "PERMISSION_DENIED", got


@pytest.mark.parametrize("uid", [-1, 0])
def test_the_fork_servers_child_stops_unless_its_ids_are_the_ones_asked(uid: int, tmp_path: Path) -> None:
    """The fork server's ``_become`` in a child of this (root) process: asked for uid -1 (which
    ``setresuid`` takes as "no change") or 0, it raises instead of going on as root."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    out = tmp_path / "outcome"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            forkserver._become(uid, 65533, [65533])
            out.write_text(f"became {os.getresuid()}")
        except OSError as exc:
            out.write_text(f"refused {exc}")
        finally:
            os._exit(0)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert out.read_text().startswith("refused"), out.read_text()
