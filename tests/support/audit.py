"""Calls the audit tests make through the privilege-separated daemon, and waits for their records."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mcpd.client.api import Client
from mcpd.common.audit.head import Head, head_line
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


def rechain(path: Path, seq: int, old: bytes, new: bytes) -> None:
    """Forge the log ``path`` as whoever can write it could: in record ``seq``, ``old`` becomes
    ``new`` (the same length), and every later record's ``prev`` is recomputed, so the chain is
    whole again (``mcpd audit verify`` of the file alone passes). Written in place."""
    assert len(old) == len(new)
    lines = path.read_bytes().splitlines(keepends=True)
    prev = None
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if rec["seq"] == seq:
            assert old in line
            line = line.replace(old, new, 1)
        elif prev is not None:
            line = line.replace(rec["prev"].encode(), prev, 1)
        if prev is not None or rec["seq"] == seq:
            lines[i] = line
            prev = hashlib.sha256(line).hexdigest().encode()
    with open(path, "r+b") as f:
        f.write(b"".join(lines))


def forge_head(d: PrivsepDaemon) -> None:
    """Rewrite the policy process's head state in place to name the audit log's last line as it
    is now (what root, or the policy's account, could do after :func:`rechain`)."""
    head_path = d.state_dir / "helper" / "audit.head"
    head = Head.decode(head_path.read_bytes())
    last = d.audit_path.read_bytes().splitlines(keepends=True)[-1]
    with open(head_path, "r+b") as f:
        f.write(head_line(head.log, head.seq, hashlib.sha256(last).hexdigest(), head.dev, head.ino, head.end,
                          head.length))
