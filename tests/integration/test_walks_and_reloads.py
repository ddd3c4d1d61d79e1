"""Privileged files/list and files/find around a reload of the grants file (real privsep daemon).

- A call is decided wholly under the grants in force when it arrived or wholly under the
  reloaded ones: the walker filters the entries by the very grants that decided the call, so a
  reload that removes or narrows the grant while the call is being decided never gives an
  answer of neither (an empty or cut listing of a folder the old grants showed whole and the
  new ones refuse).
- Walks right after a reload answer, while a test of another daemon on the same machine holds
  its own daemon's walkers stopped: every daemon's walkers run as the one account
  ``mcpd-walk``, and a test that stopped every process of that account hung the others'
  walks (``TIMEOUT`` at the call's deadline, then ``INTERNAL_ERROR`` when it killed them).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.osaccounts import AccountFactory
from tests.support.privsep_calls import client, wait_for
from tests.support.privsep_fixture import (  # noqa: F401  (fixture)
    HungWalks,
    PrivsepDaemon,
    children,
    privsep_daemon,
    start_privsep,
    stop_privsep,
)

pytestmark = pytest.mark.root

NO_GRANT = "no grant covers this path"
KEY = {"files/list": "path", "files/find": "root"}


def _reloads(d: PrivsepDaemon) -> int:
    return len([r for r in d.audit() if r.get("event") == "reload"])


def _grants(d: PrivsepDaemon, tools: dict[str, Any]) -> dict[str, Any]:
    return {"users": {d.accounts["alice"].name: {"privileged": {"tools": tools}}}}


def _load(d: PrivsepDaemon, grants: dict[str, Any]) -> None:
    """Write ``grants`` and wait (bounded) until the policy process loaded them: without SIGHUP,
    so the one reload is the one the policy process makes on seeing the file changed (within a
    second), and no second one follows."""
    before = _reloads(d)
    d.write_grants(grants, hup=False)
    wait_for(lambda: _reloads(d) > before, 30.0)


def _grant(d: PrivsepDaemon, tools: dict[str, Any]) -> None:
    """:func:`_load` grants giving alice the privileged ``tools`` only."""
    _load(d, _grants(d, tools))


def _answer(op: str, out: dict[str, Any]) -> tuple[str, list[str]]:
    """``("ok", the names or paths shown)`` or ``(code, [reason])``."""
    if "error" in out:
        return out["error"]["code"], [out["error"].get("details", {}).get("reason", "")]
    return "ok", sorted(e["name"] for e in out["entries"]) if op == "files/list" else \
        sorted(m["path"] for m in out["matches"])


def _call(d: PrivsepDaemon, op: str, path: Path, **args: Any) -> tuple[str, list[str]]:
    async def go() -> dict[str, Any]:
        async with client(d) as c:
            res = await c.call_tool(op, {KEY[op]: str(path), "privileged": True, **args}, check=False)
            return dict(res["structuredContent"])

    return _answer(op, asyncio.run(go()))


@pytest.fixture(scope="module")
def race_tree(privsep_daemon: PrivsepDaemon) -> Iterator[Path]:  # noqa: F811
    """``app/race`` (0700) holding ``kept`` and ``cut`` (0600), all root's."""
    folder = privsep_daemon.app / "race"
    folder.mkdir(mode=0o700)
    for name in ("kept", "cut"):
        (folder / name).write_text(f"{name}\n")
        os.chmod(folder / name, 0o600)
    yield folder
    privsep_daemon.write_grants(privsep_daemon.default_grants())


class HeldSpawns:
    """While active, daemon ``d``'s fork server (the helper's one root child, which forks every
    walker) is stopped (SIGSTOP), so a decided walk waits for its walker; :meth:`wait_walk`
    returns once a walk request is waiting on the fork server's socket (seen through a copy of
    that socket taken with ``pidfd_getfd`` and peeked, never read). Leaving lets it go on
    (SIGCONT) and the request is served as usual."""

    def __init__(self, d: PrivsepDaemon) -> None:
        servers = children(d.helper_pid, 0)
        assert len(servers) == 1, servers
        self.pidfd = os.pidfd_open(servers[0])
        socks = [int(n) for n in os.listdir(f"/proc/{servers[0]}/fd")
                 if os.readlink(f"/proc/{servers[0]}/fd/{n}").startswith("socket:")]
        assert len(socks) == 1, socks  # its channel to the helper; nothing else while idle
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.syscall(438, self.pidfd, socks[0], 0)  # pidfd_getfd
        assert fd >= 0, os.strerror(ctypes.get_errno())
        self.sock = socket.socket(fileno=fd)

    def __enter__(self) -> HeldSpawns:
        signal.pidfd_send_signal(self.pidfd, signal.SIGSTOP)
        return self

    def wait_walk(self, seconds: float) -> bool:
        """Whether a walk request reached the stopped fork server within ``seconds``."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0 and select.select([self.sock], [], [], left)[0]:
            if b'"walk"' in self.sock.recv(4096, socket.MSG_PEEK):
                return True
            time.sleep(0.01)  # another request (a worker's spawn) is ahead of it: it stays held
        return False

    def __exit__(self, *exc: Any) -> None:
        signal.pidfd_send_signal(self.pidfd, signal.SIGCONT)
        self.sock.close()
        os.close(self.pidfd)


@pytest.mark.parametrize("change", ["removed", "narrowed"])
@pytest.mark.parametrize("op", ["files/find", "files/list"])
def test_a_call_racing_a_reload_is_decided_wholly_under_one_policy(privsep_daemon: PrivsepDaemon,  # noqa: F811
                                                                   race_tree: Path, op: str, change: str) -> None:
    """Old grants: ``op`` on ``app``; new grants: ``op`` removed, or narrowed to
    ``app/race/kept``. The call on ``app/race`` is decided under the old grants and its walker's
    start is held (:class:`HeldSpawns`); the new grants are written and their reload recorded
    while no walker of the daemon exists; then the walker starts. The answer is the old one
    whole (both entries), never one neither grants give (an empty or cut listing), and comes
    back well inside its deadline."""
    d = privsep_daemon
    old_answer = ("ok", sorted(["cut", "kept"]) if op == "files/list" else
                  sorted(str(race_tree / n) for n in ("cut", "kept")))
    new_tools = {"files/read" if change == "removed" else op: {"allowed": True, "paths": [
        str(d.app if change == "removed" else race_tree / "kept")]}}
    _grant(d, {op: {"allowed": True, "paths": [str(d.app)]}})
    assert _call(d, op, race_tree) == old_answer  # a walker can start: the fork server is idle
    result: list[tuple[str, list[str]]] = []
    ready, go = threading.Event(), threading.Event()

    def caller() -> None:
        async def run() -> dict[str, Any]:
            async with client(d) as c:
                await c.call_tool("files/list", {"path": str(d.app)}, check=False)  # alice's worker, spawned now
                ready.set()
                go.wait(30)
                res = await c.call_tool(op, {KEY[op]: str(race_tree), "privileged": True}, check=False)
                return dict(res["structuredContent"])

        result.append(_answer(op, asyncio.run(run())))

    thread = threading.Thread(target=caller, daemon=True)
    thread.start()
    assert ready.wait(30), "no session"
    started = time.monotonic()
    with HeldSpawns(d) as held:
        walkers = set(d.walkers())  # an earlier call's, not reaped yet by the stopped fork server
        go.set()
        assert held.wait_walk(30), f"{op} was not decided within 30 s"
        _grant(d, new_tools)  # recorded while the decided call waits for its walker
        assert set(d.walkers()) == walkers
    thread.join(60)
    took = time.monotonic() - started
    assert result, f"{op} did not answer within 60 s"
    assert result[0] == old_answer, result
    assert took < 30, f"{op} took {took:.1f} s"  # its deadline is 20 s; it never waits it out
    assert _call(d, op, race_tree) == ("PERMISSION_DENIED", [NO_GRANT])  # the next call: the new grants


def test_walks_after_a_reload_answer_while_another_daemons_walks_hang(privsep_daemon: PrivsepDaemon,  # noqa: F811
                                                                       race_tree: Path) -> None:
    """Another daemon (as another test session's) has its walkers stopped by :class:`HungWalks`
    (its own find hangs till its deadline). Meanwhile this daemon reloads grants that add
    files/find, and finds and lists sent at once answer: refused until the reload, then the
    entries, never ``TIMEOUT`` or ``INTERNAL_ERROR``."""
    d = privsep_daemon
    factory = AccountFactory()
    other = None
    try:
        other = start_privsep(factory)
        rule = {"allowed": True, "paths": [str(other.app)]}
        _grant(other, {"files/find": rule})
        _load(d, d.default_grants())  # loaded before the lists below: whatever an earlier test left
        assert _call(d, "files/find", race_tree) == ("PERMISSION_DENIED", [NO_GRANT])
        hung: list[tuple[str, list[str]]] = []
        with HungWalks(other) as stopper:
            hanging = threading.Thread(target=lambda: hung.append(
                _call(other, "files/find", other.app, time_budget_seconds=1)), daemon=True)
            hanging.start()
            wait_for(lambda: bool(stopper.stopped), 30.0)  # the other daemon's walker is stopped
            grants = d.default_grants()
            grants["users"][d.accounts["alice"].name]["privileged"]["tools"]["files/find"] = {
                "allowed": True, "paths": [str(d.app)]}
            d.write_grants(grants)
            found = sorted(str(race_tree / n) for n in ("cut", "kept"))
            answers, granted = [], 0
            end = time.monotonic() + 60
            while granted < 3 and time.monotonic() < end:  # bounded
                find = _call(d, "files/find", race_tree, time_budget_seconds=2)
                listed = _call(d, "files/list", race_tree)
                answers.append((find, listed))
                assert listed == ("ok", ["cut", "kept"]), answers
                assert find in (("PERMISSION_DENIED", [NO_GRANT]), ("ok", found)), answers
                assert not (granted and find[0] != "ok"), answers  # once loaded, it stays
                granted += find[0] == "ok"
            assert granted == 3, answers
            hanging.join(60)
        assert [code for code, _ in hung] == ["TIMEOUT"], hung
    finally:
        if other is not None:
            stop_privsep(other)
        factory.cleanup()
        d.write_grants(d.default_grants())
