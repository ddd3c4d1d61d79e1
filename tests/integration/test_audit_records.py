"""Records an auditor can prove (SPEC §7), with the real daemon: the root helper's chained audit
log across a real logrotate run with the shipped configuration, ``mcpd audit verify`` over it,
and tampering caught at the right line. Root only (the helper runs as root)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mcpd.client.api import Client, text_of
from tests.integration.privsep_fixture import PrivsepDaemon, privsep_daemon  # noqa: F401  (fixture)

pytestmark = pytest.mark.root
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


def logrotate(d: PrivsepDaemon) -> None:
    """Run the real logrotate, forced, with the shipped file pointed at the test's audit log."""
    if shutil.which("logrotate") is None:
        pytest.skip("logrotate is not installed (apt-get install logrotate)")
    shipped = (REPO / "etc" / "logrotate.d" / "mcpd").read_text()
    conf = d.state_dir / "logrotate.conf"
    conf.write_text(shipped.replace("/var/log/mcpd/audit.jsonl", str(d.audit_path)))
    os.chmod(conf, 0o644)
    proc = subprocess.run(["logrotate", "-f", "-s", str(d.state_dir / "logrotate.state"), str(conf)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shipped_logrotate_uses_create_never_copytruncate() -> None:
    lines = [ln.split("#")[0].split() for ln in (REPO / "etc" / "logrotate.d" / "mcpd").read_text().splitlines()]
    words = [w for ln in lines for w in ln]
    assert "create" in words and "copytruncate" not in words and "delaycompress" in words


def test_chain_of_a_real_run_with_rotation_in_the_middle_verifies(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    for principal in ("alice", "bob", "alice"):
        call(d, principal, d.log_file, privileged=True)
    before = d.audit_path.read_bytes().splitlines(keepends=True)
    assert len(before) >= 3
    logrotate(d)
    rotated = d.audit_path.with_name(d.audit_path.name + ".1")
    assert rotated.read_bytes().splitlines(keepends=True)[-len(before):] == before
    assert d.audit_path.stat().st_size == 0 and (d.audit_path.stat().st_mode & 0o777) == 0o600
    for principal in ("alice", "bob"):
        call(d, principal, d.log_file, privileged=True)
    after = d.audit_path.read_bytes().splitlines(keepends=True)
    first = json.loads(after[0])
    assert first["prev"] == hashlib.sha256(before[-1]).hexdigest()
    assert first["seq"] == json.loads(before[-1])["seq"] + 1
    total = len(rotated.read_bytes().splitlines()) + len(after)
    out = mcpd("audit", "verify", str(rotated), str(d.audit_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{total} records" in out.stdout
    by_config = mcpd("audit", "verify", "--config", str(d.config_path))  # the rotated set, found by itself
    assert by_config.returncode == 0 and f"{total} records" in by_config.stdout, by_config.stdout + by_config.stderr


def _tampered(d: PrivsepDaemon, tmp_path: Path, change: Any) -> tuple[Path, Path]:
    rotated = d.audit_path.with_name(d.audit_path.name + ".1")
    old, new = tmp_path / "audit.jsonl.1", tmp_path / "audit.jsonl"
    shutil.copyfile(rotated, old)
    lines = d.audit_path.read_bytes().splitlines(keepends=True)
    new.write_bytes(b"".join(change(lines)))
    return old, new


@pytest.mark.parametrize("kind,change,line", [
    ("edited", lambda ls: [ls[0].replace(b'"decision":"', b'"decision":"x', 1)] + ls[1:], 1),
    ("deleted", lambda ls: ls[:1] + ls[2:], 2),
    ("reordered", lambda ls: [ls[1], ls[0]] + ls[2:], 1),
    ("truncated", lambda ls: ls[:-1] + [ls[-1][:-20]], -1),
])
def test_tampering_with_a_real_log_is_named_at_its_line(privsep_daemon: PrivsepDaemon, tmp_path: Path, kind: str,
                                                         change: Any, line: int) -> None:
    d = privsep_daemon
    rotated = d.audit_path.with_name(d.audit_path.name + ".1")
    if not rotated.exists():
        pytest.skip("needs the rotation test of this module first")
    while len(d.audit_path.read_bytes().splitlines()) < 4:
        call(d, "alice", d.log_file, privileged=True)
    old, new = _tampered(d, tmp_path, change)
    count = len(new.read_bytes().splitlines())
    out = mcpd("audit", "verify", str(old), str(new))
    assert out.returncode == 1
    assert out.stdout.startswith(f"{new}:{count if line == -1 else line}: {kind}"), out.stdout
