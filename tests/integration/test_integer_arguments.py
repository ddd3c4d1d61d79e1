"""Integers as JSON has them: an ``offset``, ``limit``, ``start_line`` or
``end_line`` of 2^64, 2^100 or 10^400 is an integer on every process it passes (the front, the
policy process, the worker), on both transports and both routes, and reads as the contract says:
an offset at or past the end is ``""`` however large, a huge limit or end line is clamped to the
end of the file, a start line past the end is ``RANGE_OUT_OF_BOUNDS`` naming that exact number.

Root only: the real root helper, policy process and account workers (the privileged route
crosses the policy process, the unprivileged one only the worker)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.client.api import Client, text_of
from tests.support.privsep_fixture import LOG_TEXT, PrivsepDaemon, privsep_daemon  # noqa: F401 (fixture)

pytestmark = pytest.mark.root
CALL_TIMEOUT = 30.0
HUGE = (2**64, 2**100, 10**400)
LINES = LOG_TEXT.count("\n")


@pytest.fixture(scope="module")
def public(privsep_daemon: PrivsepDaemon) -> Iterator[Path]:  # noqa: F811
    """A file every account may read (the unprivileged route reads as alice's account)."""
    path = privsep_daemon.srv / "public.txt"
    path.write_text(LOG_TEXT)
    os.chmod(path, 0o644)
    yield path
    path.unlink()


def expected(name: str, value: int) -> tuple[str | None, dict[str, Any]]:
    """What ``files/read`` of LOG_TEXT answers for ``{name: value}``: ``(text, {})`` or
    ``(None, {code, details})``."""
    if name == "offset":
        return "", {}
    if name == "start_line":
        return None, {"code": "RANGE_OUT_OF_BOUNDS", "details": {"start_line": value, "totalLines": LINES}}
    return LOG_TEXT, {}  # limit, end_line: clamped to the end


async def read_all(d: PrivsepDaemon, transport: str, path: Path, privileged: bool) -> list[tuple[str, int, Any]]:
    """Every (argument, value) of the matrix read once on one session; returns the mismatches."""
    wrong: list[tuple[str, int, Any]] = []
    async with Client(d.url, d.tokens["alice"], d.cacert, timeout=CALL_TIMEOUT, transport=transport) as c:
        assert c.transport == transport
        for name in ("offset", "limit", "start_line", "end_line"):
            for value in HUGE:
                res = await c.call_tool("files/read", {"path": str(path), "privileged": privileged, name: value},
                                        check=False)
                if res.get("isError"):
                    err = res["structuredContent"]["error"]
                    got: tuple[str | None, dict[str, Any]] = (None, {"code": err["code"], "details": err["details"]})
                else:
                    got = (text_of(res), {})
                if got != expected(name, value):
                    wrong.append((name, value, got))
    return wrong


@pytest.mark.parametrize("transport", ["sse", "http"])
@pytest.mark.parametrize("privileged", [False, True], ids=["unprivileged", "privileged"])
def test_huge_integers_read_as_the_contract_says(privsep_daemon: PrivsepDaemon, public: Path,  # noqa: F811
                                                 transport: str, privileged: bool) -> None:
    d = privsep_daemon
    path = d.log_file if privileged else public
    wrong = asyncio.run(read_all(d, transport, path, privileged))
    assert wrong == [], [(n, str(v)[:24], g) for n, v, g in wrong]


@pytest.fixture(scope="module")
def find_granted(privsep_daemon: PrivsepDaemon) -> Iterator[PrivsepDaemon]:  # noqa: F811
    """alice may also find under ``app`` (privileged), once the policy process has loaded it."""
    d = privsep_daemon
    grants = d.default_grants()
    grants["users"][d.accounts["alice"].name]["privileged"]["tools"]["files/find"] = {
        "allowed": True, "paths": [str(d.app)]}
    d.write_grants(grants)

    async def loaded() -> None:
        async with Client(d.url, d.tokens["alice"], d.cacert, timeout=CALL_TIMEOUT) as c:
            deadline = time.monotonic() + CALL_TIMEOUT
            while True:  # bounded: the policy process reloads a changed grants file within a second
                res = await c.call_tool("files/find", {"root": str(d.app), "privileged": True}, check=False)
                if not res.get("isError") or time.monotonic() > deadline:
                    return
                await asyncio.sleep(0.2)

    asyncio.run(loaded())
    yield d
    d.write_grants(d.default_grants())


@pytest.mark.parametrize("privileged", [False, True], ids=["unprivileged", "privileged"])
def test_a_huge_find_depth_is_no_depth_limit_on_the_walk_routes(find_granted: PrivsepDaemon, public: Path,
                                                                privileged: bool) -> None:
    """The same rule for ``files/find`` (``max_depth`` has no upper bound): the worker, and the
    policy process passing the call to the walker, keep 2^64 an integer."""
    d = find_granted
    root = d.app if privileged else d.srv
    want = str(d.log_file if privileged else public)

    async def go() -> dict[str, Any]:
        async with Client(d.url, d.tokens["alice"], d.cacert, timeout=CALL_TIMEOUT) as c:
            res = await c.call_tool("files/find", {"root": str(root), "name": Path(want).name, "max_depth": 2**64,
                                                   "privileged": privileged}, check=False)
            return dict(res["structuredContent"])

    out = asyncio.run(go())
    assert [m["path"] for m in out.get("matches", [])] == [want], out


def test_a_front_sending_a_huge_time_budget_gets_the_walkers_refusal(find_granted: PrivsepDaemon) -> None:
    """Code as the service user (a compromised front) sends the policy process a privileged find
    whose ``time_budget_seconds`` is 10^400 (the front itself refuses it): the policy process
    computes the walk's deadline without overflowing and the walker refuses the argument, as
    every other process does (before: the deadline's float() raised, INTERNAL_ERROR, and the
    walker root had started was left without its call)."""
    from tests.support.root_channels import as_mcpd

    d = find_granted
    req = {"type": "privileged_call", "id": 1, "token": d.tokens["alice"], "session": "s", "peer": "p",
           "op": "files/find", "args": {"root": str(d.app), "time_budget_seconds": 10**400}}
    answer = as_mcpd(d, "frame", req)
    assert answer["closed"] is False, answer
    err = answer["reply"]["error"]
    assert (err["code"], err["details"].get("argument")) == ("INVALID_ARGUMENT", "time_budget_seconds"), err
