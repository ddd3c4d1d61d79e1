"""Calls into root's object table as the policy process, and the fixture that grants every path."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mcpd.client.api import Client, text_of
from tests.support.privsep_fixture import SECRET_TEXT, PrivsepDaemon


def call(d: PrivsepDaemon, tool: str, **args: Any) -> dict[str, Any]:
    """alice's privileged ``tool`` call: ``{"text": ...}`` for a read, else the structured
    content; ``{"error": {...}}`` on a tool error."""
    async def go() -> dict[str, Any]:
        async with Client(d.url, d.tokens["alice"], d.cacert, timeout=60) as c:
            res = await c.call_tool(tool, {**args, "privileged": True}, check=False)
        if res.get("isError"):
            return {"error": res["structuredContent"]["error"]}
        return {"text": text_of(res)} if tool == "files/read" else dict(res["structuredContent"])

    return asyncio.run(go())


def refused(reply: dict[str, Any], reason: str | None = None) -> bool:
    error = reply.get("error") or {}
    return error.get("code") == "PERMISSION_DENIED" and reason in (None, error.get("details", {}).get("reason"))


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture
def everywhere(privsep_daemon: PrivsepDaemon) -> Iterator[PrivsepDaemon]:  # noqa: F811
    """alice may read, list and find under ``/`` and ``/proc`` (restored afterwards)."""
    d = privsep_daemon
    rule = {"allowed": True, "paths": ["/", "/proc"]}
    tools = {t: dict(rule) for t in ("files/read", "files/list", "files/find")}
    d.write_grants({"users": {d.accounts["alice"].name: {"privileged": {"tools": tools}}}})
    _until(lambda: call(d, "files/read", path=str(d.secret)).get("text") == SECRET_TEXT, "the grants did not reload")
    try:
        yield d
    finally:
        d.write_grants(d.default_grants())
        _until(lambda: refused(call(d, "files/read", path=str(d.secret))), "the grants did not reload")
