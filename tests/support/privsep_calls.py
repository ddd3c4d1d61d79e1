"""Calls to the privilege-separated daemon's /sse endpoint as a client would make them, and bounded waits."""

from __future__ import annotations

import asyncio
import os
import signal
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


def bob_reads_on_both_routes(d: PrivsepDaemon, times: int = 3) -> list[tuple[str | None, dict[str, Any]]]:
    """bob, on new workers (his old ones killed first): an unprivileged read of a file of his own
    and a privileged read of the root-only file, ``times`` times each; the (text, error) pairs in
    order. Shows that another account is still served after an attack on the workers."""
    for pid in d.workers("bob"):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not d.workers("bob"))
    own = os.path.join(d.accounts["bob"].home, "note.txt")
    if not os.path.exists(own):
        with open(own, "w") as f:
            f.write("bob's note\n")
        os.chown(own, d.accounts["bob"].uid, d.accounts["bob"].gid)

    async def go() -> list[tuple[str | None, dict[str, Any]]]:
        async with client(d, "bob") as c:
            out = []
            for _ in range(times):
                out.append(await read(c, own))
                out.append(await read(c, d.log_file, privileged=True))
            return out

    return asyncio.run(go())
