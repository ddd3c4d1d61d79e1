"""Shared pieces of the MCP tasks tests (docs/REFERENCE.md §2.6): the revisions' constants, a
small tree, a file that takes files/grep many seconds, and waits for a worker to start and end."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import Daemon
from tests.support.streamable import META
from tests.support.workers import worker_pids

TASKS = "2025-11-25"  # (Rpc's default version)
EXT = "io.modelcontextprotocol/tasks"
#: the 2026-07-28 _meta of a client that declares the tasks extension
EXT_META = {**META, "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}}}
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def check_task(task: dict[str, Any], ttl: int, poll: int = 1000) -> None:
    assert isinstance(task["taskId"], str) and len(task["taskId"]) == 32
    assert ISO.fullmatch(task["createdAt"]) and ISO.fullmatch(task["lastUpdatedAt"])
    assert (task["ttl"], task["pollInterval"]) == (ttl, poll)


def small_tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.conf").write_text("port = 1\n")
    (root / "sub" / "b.conf").write_text("port = 2\n")
    (root / "c.txt").write_text("nothing\n")
    return root


def hole(tmp_path: Path) -> Path:
    """16 GiB, nearly all of it a hole: a files/grep of many seconds."""
    p = tmp_path / "hole.log"
    with open(p, "wb") as f:
        f.write(b"a\n" * 8192)
        f.truncate(16 * 1024 ** 3)
    return p


def slow_grep(path: Path) -> dict[str, Any]:
    return {"name": "files/grep", "arguments": {"pattern": "zzz", "path": str(path), "time_budget_seconds": 30}}


def slow_daemon(factory: Callable[..., Daemon], **extra: Any) -> Daemon:
    return factory(workers={"timeout_seconds": 3, "cancel_grace_seconds": 0.1},
                   read={"grep_file_bytes": 64 * 1024 ** 3}, **extra)


async def wait_worker(d: Daemon, before: set[int]) -> set[int]:
    for _ in range(200):
        if busy := worker_pids(d.pid) - before:
            return busy
        await asyncio.sleep(0.05)
    raise AssertionError("no worker started for the slow grep")


async def wait_gone(d: Daemon, busy: set[int], seconds: float = 10) -> None:
    for _ in range(int(seconds / 0.05)):  # the grep's own deadline is 30 s away
        if not busy & worker_pids(d.pid):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the worker of the task still runs")
