"""Node-based MCP clients for the interoperability tests, installed from the npm registry on first
use into ``$MCPD_TEST_NODE_DIR`` (default ``/tmp/mcpd-test-node``), pinned to known versions: the
MCP Inspector, the conformance suite, the TypeScript SDK, and Node 22 itself (the ``node`` package),
which they need whatever Node the machine has.

Without ``npm`` on PATH the tests that need them are skipped (and say so); an install that fails is
a test failure, since CI reaches the registry.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

PACKAGES = {
    "node": "22.23.3",
    "@modelcontextprotocol/inspector": "2.12.0",
    "@modelcontextprotocol/conformance": "0.2.0-alpha.12",
    "@modelcontextprotocol/sdk": "1.32.2",
}
INSTALL_TIMEOUT = 600


def node_dir() -> Path:
    """Where the pinned packages are installed (created on first use)."""
    base = Path(os.environ.get("MCPD_TEST_NODE_DIR", "/tmp/mcpd-test-node"))
    if shutil.which("npm") is None:
        pytest.skip("npm is not on PATH")
    marker = base / ".installed"
    wanted = " ".join(f"{k}@{v}" for k, v in sorted(PACKAGES.items()))
    if not marker.exists() or marker.read_text() != wanted:
        base.mkdir(parents=True, exist_ok=True)
        res = subprocess.run(["npm", "install", "--prefix", str(base), "--no-audit", "--no-fund",
                              "--engine-strict=false", *wanted.split()],
                             capture_output=True, timeout=INSTALL_TIMEOUT)
        assert res.returncode == 0, res.stderr.decode(errors="replace")[-2000:]
        marker.write_text(wanted)
    return base


def node() -> str:
    """The pinned Node 22 binary."""
    return str(node_dir() / "node_modules/.bin/node")


def inspector_bin() -> list[str]:
    """The command that runs the MCP Inspector's CLI mode."""
    return [node(), str(node_dir() / "node_modules/.bin/mcp-inspector"), "--cli"]


def conformance_bin() -> list[str]:
    """The command that runs the official MCP conformance suite."""
    return [node(), str(node_dir() / "node_modules/.bin/conformance")]
