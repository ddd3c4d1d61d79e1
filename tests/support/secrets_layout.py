"""A daemon whose secrets only root reaches, and a worker's view of them."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import rootns
from tests.support.osaccounts import Account, AccountFactory
from tests.support.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep
from tests.support.root_channels import as_policy

ALIAS = "mcpdalias"  # a second name for the service user's uid, in the helper's namespace only


@pytest.fixture(scope="module")
def layout() -> Iterator[tuple[PrivsepDaemon, Account, Account]]:
    """The daemon, its helper seeing an alias of ``mcpd``'s uid and a fresh account in group
    ``mcpd``; a third account, ``keyreader``, in the group a copy of the TLS key is given to.
    Yields the daemon, the group member and the key reader."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    factory = AccountFactory()
    folder = Path(tempfile.mkdtemp(prefix="mcpd-reach-"))
    d = None
    try:
        member, reader = factory.user(), factory.user()
        svc = pwd.getpwnam("mcpd")
        shell = rootns.etc_copy(str(folder), [f"{ALIAS}:x:{svc.pw_uid}:{svc.pw_gid}::/nonexistent:/usr/sbin/nologin"],
                                {grp.getgrgid(svc.pw_gid).gr_name: member.name})
        d = start_privsep(factory, helper_wrap=rootns.own_mount_namespace(shell))
        yield d, member, reader
    finally:
        if d is not None:
            stop_privsep(d)
        factory.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


def _through_worker(d: PrivsepDaemon, user: str, paths: list[str]) -> dict[str, str] | None:
    """As ``mcpd-policy``: spawn a worker as ``user`` and read ``paths`` through it; None when root
    refuses the spawn (reason ``daemon account``), else what each read returned."""
    with as_policy(d) as root:
        reply, fds = root.ask("spawn", user=user, limits='{"default_bytes": 4096}')
        if reply["ok"] is False:
            assert reply["error"]["details"]["reason"] == "daemon account", reply
            return None
        out: dict[str, str] = {}
        try:
            rootns.wait_exec(reply["pid"])
            with rootns.front_socket(fds[0]) as front:
                for path in paths:
                    got = rootns.ask(front, "files/read", path=path)
                    out[path] = got["result"]["text"][:60] if got.get("ok") else got["error"]["code"]
        finally:
            root.ask("kill", pid=reply["pid"])
            for fd in fds:
                os.close(fd)
    return out
