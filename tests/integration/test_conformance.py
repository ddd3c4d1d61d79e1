"""The official MCP conformance suite (``@modelcontextprotocol/conformance``, server mode) against
``/mcp``, for what each revision requires (``--requirements 2025-11-25`` and ``2026-07-28``). The
suite has no option for a bearer token, so it talks to a local gateway (the test proxy of
``http_proxy.py``, plain HTTP on loopback) that adds the header and forwards to the daemon over
TLS, as a deployment would; the client's ``Host`` and ``Origin`` pass through unchanged, so the
suite's DNS-rebinding scenario meets mcpd's own ``allowed_hosts``/``allowed_origins`` checks.

Every scenario that applies to a file-reading server must pass; the others are listed, each with
its reason, in ``conformance-expected-failures.yaml`` (the suite also fails if one of those passes).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Daemon, _free_port
from tests.support import http_proxy
from tests.support.node_clients import conformance_bin

EXPECTED = Path(__file__).with_name("conformance-expected-failures.yaml")
MUST_PASS = {
    "2025-11-25": ("server-initialize", "ping", "tools-list", "resources-list", "server-sse-multiple-streams",
                   "dns-rebinding-protection"),
    "2026-07-28": ("tools-list", "resources-list", "dns-rebinding-protection", "server-sse-multiple-streams",
                   "sep-2164-resource-not-found", "http-header-validation", "input-required-result-unsupported-methods",
                   "input-required-result-validate-input"),
}


@pytest.mark.parametrize("requirements", sorted(MUST_PASS))
def test_conformance_suite_server_scenarios(daemon_factory: Callable[..., Daemon], tmp_path: Path,
                                            requirements: str) -> None:
    # (MCPD_CONFORMANCE_RESULTS: keep the suite's per-check results there, one folder per revision)
    results = Path(os.environ.get("MCPD_CONFORMANCE_RESULTS", str(tmp_path))) / requirements
    port = _free_port()
    d = daemon_factory(allowed_hosts="auto", allowed_origins=[f"http://127.0.0.1:{port}"])
    url, proxy = http_proxy.start(d, bearer=d.token, plain=True, port=port)
    try:
        res = subprocess.run([*conformance_bin(), "server", "--url", f"{url}/mcp", "--requirements", requirements,
                              "--expected-failures", str(EXPECTED), "-o", str(results)],
                             capture_output=True, text=True, timeout=900, env=dict(os.environ),
                             stdin=subprocess.DEVNULL)
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
    summary = res.stdout[res.stdout.find("=== SUMMARY ==="):]
    print(summary)
    assert res.returncode == 0, summary + res.stderr[-2000:]
    assert "Baseline check passed" in res.stdout
    for scenario in MUST_PASS[requirements]:
        assert f"✓ {scenario}:" in summary, scenario
