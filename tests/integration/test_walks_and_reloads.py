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
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.privsep_fixture import (  # noqa: F401  (fixture)
    HungWalks,
    PrivsepDaemon,
    privsep_daemon,
    start_privsep,
    stop_privsep,
)
from tests.integration.test_privsep import client, wait_for
from tests.osaccounts import AccountFactory

pytestmark = pytest.mark.root

NO_GRANT = "no grant covers this path"
KEY = {"files/list": "path", "files/find": "root"}
#: deny globs in the old grants: each new pattern costs the decision a compile, so the first
#: decision under freshly loaded grants takes about a second, and a reload lands inside it
SLOW_DENIES = 2000
ATTEMPTS = 5  # races set up until one reload lands between the decision and the walk


def _reloads(d: PrivsepDaemon) -> int:
    return len([r for r in d.audit() if r.get("event") == "reload"])


def _grants(d: PrivsepDaemon, tools: dict[str, Any]) -> dict[str, Any]:
    return {"users": {d.accounts["alice"].name: {"privileged": {"tools": tools}}}}


def _grant(d: PrivsepDaemon, tools: dict[str, Any]) -> None:
    """Write alice's privileged tools and wait (bounded) until the policy process loaded them:
    without SIGHUP, so the one reload is the one the policy process makes on seeing the file
    changed (within a second), and no second one follows."""
    before = _reloads(d)
    d.write_grants(_grants(d, tools), hup=False)
    wait_for(lambda: _reloads(d) > before, 30.0)


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


@pytest.mark.parametrize("change", ["removed", "narrowed"])
@pytest.mark.parametrize("op", ["files/find", "files/list"])
def test_a_call_racing_a_reload_is_decided_wholly_under_one_policy(privsep_daemon: PrivsepDaemon,  # noqa: F811
                                                                   race_tree: Path, op: str, change: str) -> None:
    """Old grants: ``op`` on ``app`` (with many slow deny globs that cover nothing here); new
    grants: ``op`` removed, or narrowed to ``app/race/kept``. The call on ``app/race`` is sent,
    then the new grants are written (the policy process reloads a changed file within a second,
    as on SIGHUP). A race counts when the reload was recorded before any walker of the daemon
    existed and the call was still decided under the old grants. Every answer is the old one
    (both entries) or the new one (refused, no grant) and comes back well inside its deadline;
    a counted race answers the old one whole."""
    d = privsep_daemon
    old_answer = ("ok", sorted(["cut", "kept"]) if op == "files/list" else
                  sorted(str(race_tree / n) for n in ("cut", "kept")))
    new_answer = ("PERMISSION_DENIED", [NO_GRANT])
    new_tools = {"files/read" if change == "removed" else op: {"allowed": True, "paths": [
        str(d.app if change == "removed" else race_tree / "kept")]}}
    raced: list[tuple[str, list[str]]] = []
    seen: list[tuple[str, tuple[str, list[str]]]] = []
    for _ in range(ATTEMPTS):
        tag = secrets.token_hex(4)  # fresh patterns: not compiled yet by an earlier attempt
        denies = [f"/srv/**/z*y*x*w*v{tag}{i}" for i in range(SLOW_DENIES)]
        _grant(d, {op: {"allowed": True, "paths": [str(d.app)], "deny": denies}})
        before = _reloads(d)
        result: list[tuple[str, list[str]]] = []
        ready, go = threading.Event(), threading.Event()

        def caller() -> None:
            async def run() -> dict[str, Any]:
                async with client(d) as c:
                    ready.set()
                    go.wait(30)
                    res = await c.call_tool(op, {KEY[op]: str(race_tree), "privileged": True}, check=False)
                    return dict(res["structuredContent"])

            result.append(_answer(op, asyncio.run(run())))

        thread = threading.Thread(target=caller, daemon=True)
        started = time.monotonic()
        thread.start()
        assert ready.wait(30), "no session"
        go.set()
        d.write_grants(_grants(d, new_tools), hup=False)
        walker_first = False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # bounded: which came first, the reload or the walker?
            if _reloads(d) > before:
                walker_first = walker_first or bool(d.walkers())
                break
            if d.walkers():
                walker_first = True
            time.sleep(0.005)
        thread.join(60)
        took = time.monotonic() - started
        assert result, f"{op} did not answer within 60 s"
        answer = result[0]
        seen.append(("walker first" if walker_first else "reload first", answer))
        assert answer in (old_answer, new_answer), seen
        assert took < 30, f"{op} took {took:.1f} s"  # its deadline is 20 s; it never waits it out
        if answer == old_answer and not walker_first:
            raced.append(answer)
            break
    print(f"{op}, grant {change}: {seen}")
    assert raced, f"no reload landed between a decision and its walk in {ATTEMPTS} attempts: {seen}"


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
        d.write_grants(d.default_grants())
        wait_for(lambda: _call(d, "files/find", race_tree)[1] == [NO_GRANT], 30.0)
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
