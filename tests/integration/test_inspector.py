"""The MCP Inspector CLI (``@modelcontextprotocol/inspector``, from the npm registry) against the
real daemon: lists the tools, calls ``files/read`` and reads the resource over ``/sse``
(``--transport sse``) and over Streamable HTTP at ``/mcp`` (``--transport http``), in the session
era and in the stateless one (``--protocol-era modern``, and ``auto``, which must pick it)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Daemon
from tests.support.node_clients import inspector_bin

RUN_TIMEOUT = 120


def inspector(d: Daemon, path: str, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NODE_EXTRA_CA_CERTS": d.cacert}
    return subprocess.run([*inspector_bin(), f"{d.url}{path}", "--header", f"Authorization: Bearer {token or d.token}",
                           "--format", "json", *args], capture_output=True, text=True, env=env,
                          timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL)


def result(res: subprocess.CompletedProcess[str]) -> Any:
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)["result"]


@pytest.mark.parametrize(("path", "transport", "era"), [
    ("/sse", "sse", "legacy"), ("/mcp", "http", "legacy"), ("/mcp", "http", "modern"), ("/mcp", "http", "auto"),
])
def test_inspector_lists_calls_reads(daemon: Daemon, tmp_path: Path, path: str, transport: str, era: str) -> None:
    f = tmp_path / "hello.txt"
    f.write_text("hello\n")
    opts = ["--transport", transport, "--protocol-era", era]
    tools = result(inspector(daemon, path, *opts, "--method", "tools/list"))
    assert "files/read" in [t["name"] for t in tools["tools"]]
    called = result(inspector(daemon, path, *opts, "--method", "tools/call",
                              "--tool-name", "files/read", "--tool-arg", f"path={f}"))
    assert called["content"][0]["text"] == "hello\n"
    read = result(inspector(daemon, path, *opts, "--method", "resources/read", "--uri", f"file://{f}"))
    assert read["contents"][0]["text"] == "hello\n"
    # (modern pins 2026-07-28 with no fallback: it fails unless server/discover offers that version)


@pytest.mark.parametrize(("path", "transport", "says"), [("/sse", "sse", "(401)"), ("/mcp", "http", "invalid token")])
def test_inspector_reports_a_bad_token(daemon: Daemon, path: str, transport: str, says: str) -> None:
    # --stored-auth-only: the Inspector may not open a browser for OAuth; it reports the 401's reason.
    res = inspector(daemon, path, "--transport", transport, "--stored-auth-only", "--method", "tools/list",
                    token="mcpd_000000000000_" + "A" * 43)
    assert says in res.stdout + res.stderr
