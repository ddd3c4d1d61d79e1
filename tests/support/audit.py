"""Calls the audit tests make through the privilege-separated daemon, and waits for their records."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mcpd.client.api import Client
from tests.support.privsep_fixture import PrivsepDaemon
from tests.support.rootonly import root_prerequisite

REPO = Path(__file__).resolve().parents[2]


CALL_TIMEOUT = 30.0


def call(d: PrivsepDaemon, principal: str, path: Path | str, privileged: bool, tool: str = "files/read") -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with Client(d.url, d.tokens[principal], d.cacert, timeout=CALL_TIMEOUT) as c:
            return await c.call_tool(tool, {"path": str(path), "privileged": privileged}, check=False)

    return asyncio.run(go())


def mcpd(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mcpd.admin.cli", *args], capture_output=True, text=True,
                          timeout=60, check=check)


def logrotate(d: PrivsepDaemon, audit: Path | None = None, access: Path | None = None) -> None:
    """Run the real logrotate, forced, with the shipped file pointed at the test's logs (the audit
    log by default; a missing path is left alone, as `missingok` says)."""
    root_prerequisite(shutil.which("logrotate") is not None, "logrotate is not installed (apt-get install logrotate)")
    shipped = (REPO / "etc" / "logrotate.d" / "mcpd").read_text()
    conf = d.state_dir / "logrotate.conf"
    missing = d.state_dir / "no-such.jsonl"
    conf.write_text(shipped.replace("/var/log/mcpd/audit.jsonl", str(audit or d.audit_path))
                    .replace("/var/log/mcpd-front/access.jsonl", str(access or missing)))
    os.chmod(conf, 0o644)
    proc = subprocess.run(["logrotate", "-f", "-s", str(d.state_dir / "logrotate.state"), str(conf)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def wait_for_load(d: PrivsepDaemon, text: str, seconds: float = 15.0) -> None:
    """Wait until the policy process's last whole load of the grants file is ``text`` (its last
    loaded record, part of parts, carries ``text``'s SHA-256): a write made without SIGHUP is
    picked up within a second, so a test that starts earlier would see the file of the test before."""
    digest = hashlib.sha256(text.encode()).hexdigest()
    deadline = time.monotonic() + seconds
    while True:
        loads = [r for r in d.audit() if r.get("decision") == "loaded" and "sha256" in r and r.get("part") == r.get("parts")]
        if loads and loads[-1]["sha256"] == digest:
            return
        assert time.monotonic() < deadline, "the policy process did not load the grants file"
        time.sleep(0.1)


def wait_for_record(d: PrivsepDaemon, match: Any, seconds: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        found = [r for r in d.audit() if match(r)]
        if found:
            return found[-1]
        assert time.monotonic() < deadline, "no such audit record"
        time.sleep(0.1)
