"""Calls to the privilege-separated daemon's /sse endpoint as a client would make them, and bounded waits."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from mcpd.client.api import Client, text_of
from tests.support.privsep_fixture import PrivsepDaemon, proc_status


CALL_TIMEOUT = 30.0


RACE_SECONDS = float(os.environ.get("MCPD_RACE_SECONDS", "90"))


def client(d: PrivsepDaemon, principal: str = "alice") -> Client:
    return Client(d.url, d.tokens[principal], d.cacert, timeout=CALL_TIMEOUT)


async def read(c: Client, path: Path | str, privileged: bool = False, **args: Any) -> tuple[str | None, dict[str, Any]]:
    """``(text, {})`` on success, ``(None, error)`` on a tool error (``structuredContent.error``)."""
    res = await c.call_tool("files/read", {"path": str(path), "privileged": privileged, **args}, check=False)
    if res.get("isError"):
        return None, res["structuredContent"]["error"]
    return text_of(res), {}


def read_once(d: PrivsepDaemon, path: Path | str, privileged: bool = False, principal: str = "alice",
              **args: Any) -> tuple[str | None, dict[str, Any]]:
    async def go() -> tuple[str | None, dict[str, Any]]:
        async with client(d, principal) as c:
            return await read(c, path, privileged, **args)

    return asyncio.run(go())


def uid_pids(uid: int) -> list[int]:
    """Every live (not zombie) process whose real uid is ``uid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                st = proc_status(int(entry))
                if st["Uid"].split()[0] == str(uid) and not st["State"].startswith("Z"):
                    pids.append(int(entry))
            except (OSError, KeyError):
                pass
    return pids


def wait_for(predicate: Any, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)
