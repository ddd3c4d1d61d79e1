"""Metrics and health (issue 14): ``/metrics`` and ``/healthz`` on a loopback listener of their
own, off by default; the exposition parses with prometheus-client's own parser and a read shows
up in the call counter, without paths or principals in any label."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from mcpd.client.api import Client
from tests.conftest import FRONT_ENV, Daemon


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_count_a_read_and_healthz_answers(daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    port = free_port()
    d = daemon_factory(metrics_listen=f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(timeout=10) as c:
        assert c.get(base + "/healthz").text == "ok\n"
        before = samples(c.get(base + "/metrics").text)

        async def read() -> None:
            async with Client(d.url, d.token, d.cacert) as mcp:
                await mcp.call_tool("files/read", {"path": "/etc/hostname"})
                await mcp.call_tool("files/read", {"path": str(tmp_path / "missing")}, check=False)
                text = c.get(base + "/metrics").text  # while the session is open
                assert samples(text)[("mcpd_sessions", (("transport", "sse"),))] == 1
                assert samples(text)[("mcpd_workers", ())] >= 1

        asyncio.run(read())
        after_text = c.get(base + "/metrics").text
        after = samples(after_text)
        key = ("mcpd_calls_total", (("code", "ok"), ("route", "unprivileged"), ("tool", "files/read")))
        assert after[key] == before.get(key, 0) + 1
        missing = ("mcpd_calls_total", (("code", "FILE_NOT_FOUND"), ("route", "unprivileged"), ("tool", "files/read")))
        assert after[missing] == before.get(missing, 0) + 1
        assert str(tmp_path) not in after_text and d.token not in after_text  # labels hold no path or secret
        assert c.get(base + "/other").status_code == 404


def test_metrics_are_off_by_default_and_never_on_a_public_address(daemon_factory: Callable[..., Daemon]) -> None:
    import subprocess
    import sys

    import yaml

    d = daemon_factory()
    text = d.config_path.read_text()
    assert "metrics_listen" not in text or 'metrics_listen: ""' in text
    bad = d.config_path.with_name("public-metrics.yaml")
    data = yaml.safe_load(text)
    data["metrics_listen"] = "0.0.0.0:9109"
    data["listen"]["port"] = free_port()
    bad.write_text(yaml.safe_dump(data))
    res = subprocess.run([sys.executable, "-m", "mcpd.front.server", "--config", str(bad)], capture_output=True,
                         text=True, timeout=60, env=FRONT_ENV)
    assert res.returncode == 78 and "not a loopback address" in res.stderr, res.stderr
