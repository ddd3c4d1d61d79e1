"""The TypeScript SDK's ``StreamableHTTPClientTransport`` (``@modelcontextprotocol/sdk``, from the
npm registry) against ``/mcp``: lists the tools, calls ``files/read`` (a success and a tool error),
reads the resource and ends its session with ``DELETE``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.conftest import Daemon
from tests.support.node_clients import node, node_dir

SCRIPT = Path(__file__).with_name("ts_sdk_client.mjs")


def test_ts_sdk_streamable_http_client(daemon: Daemon, tmp_path: Path) -> None:
    f = tmp_path / "hello.txt"
    f.write_text("hello\n")
    env = {**os.environ, "NODE_EXTRA_CA_CERTS": daemon.cacert, "MCPD_TEST_NODE_DIR": str(node_dir())}
    res = subprocess.run([node(), str(SCRIPT), f"{daemon.url}/mcp", daemon.token, str(f)], capture_output=True,
                         text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["protocolVersion"] == "2025-11-25" and len(out["sessionId"]) == 32
    assert "files/read" in out["tools"]
    assert (out["text"], out["missing"], out["resource"]) == ("hello\n", "FILE_NOT_FOUND", "hello\n")
