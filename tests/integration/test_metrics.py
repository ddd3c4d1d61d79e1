"""Metrics and health: ``/metrics`` and ``/healthz`` on a loopback listener of their
own, off by default; the exposition parses with prometheus-client's own parser and a read shows
up in the call counter, without paths or principals in any label."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mcpd.client.api import Client
from tests.conftest import FRONT_ENV, Daemon
from tests.support.metrics import samples
from tests.support.net import free_port


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


def test_metrics_export_pool_helper_logins_and_every_limit_hit(daemon_factory: Callable[..., Daemon]) -> None:
    """Every family the issue lists is exported and parses; each of the front's caps has its
    ``mcpd_limits_hit_total`` series from the start, and the ones hit here count up by exactly one."""
    import ssl

    from mcpd.front.metrics import LIMIT_KINDS
    from tests.support.streamable import INIT, client, hdrs, open_session

    port = free_port()
    d = daemon_factory(metrics_listen=f"127.0.0.1:{port}", max_sessions_per_principal=1, max_batch=2,
                       max_body_bytes=4096, connections={"max_per_address": 3})
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(timeout=10) as c:
        before = samples(c.get(base + "/metrics").text)
    families = {f.name: f.type for f in text_string_to_metric_families(httpx.get(base + "/metrics").text)}
    assert families["mcpd_calls"] == "counter" and families["mcpd_call_seconds"] == "histogram"
    for gauge in ("mcpd_sessions", "mcpd_workers", "mcpd_workers_busy", "mcpd_pool_queued"):
        assert families[gauge] == "gauge", gauge
    assert families["mcpd_limits_hit"] == "counter" and families["mcpd_logins_refused"] == "counter"
    assert "mcpd_helper_up" not in families  # no helper in this front: no up/down to report
    assert before[("mcpd_logins_refused_total", (("status", "401"),))] == 0
    for kind in LIMIT_KINDS:
        assert before[("mcpd_limits_hit_total", (("limit", kind),))] == 0, kind

    async def hit_limits() -> None:
        async with client(d) as mcp:
            sid = await open_session(mcp, d, version="2025-03-26")  # (batches end with 2025-06-18)
            assert (await mcp.post("/mcp", json=INIT, headers=hdrs(d))).status_code == 429
            r = await mcp.post("/mcp", content=b"[" + b" " * 5000 + b"]", headers=hdrs(d, sid))
            assert r.status_code == 413
            batch = [{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(3)]
            r = await mcp.post("/mcp", json=batch, headers=hdrs(d, sid, **{"MCP-Protocol-Version": "2025-03-26"}))
            assert r.status_code == 400 and r.json()["error"]["code"] == -32600  # refused whole, none run
            await mcp.delete("/mcp", headers=hdrs(d, sid))

    asyncio.run(hit_limits())
    ctx = ssl.create_default_context(cafile=d.cacert)
    held = []
    try:  # three TLS connections from 127.0.0.1 are its cap; the fourth is closed at once
        for _ in range(4):
            held.append(ctx.wrap_socket(socket.create_connection(d.host_port, timeout=10), server_hostname="127.0.0.1"))
        assert held[3].recv(1) == b""
    finally:
        for sock in held:
            sock.close()
    with httpx.Client(timeout=10) as c:
        text = c.get(base + "/metrics").text
    after = samples(text)
    hits = {kind: after[("mcpd_limits_hit_total", (("limit", kind),))] for kind in LIMIT_KINDS}
    assert hits["sessions_per_principal"] == 1 and hits["body_bytes"] == 1 and hits["connections_per_address"] == 1
    assert hits["batch"] == 1
    assert hits["sessions_total"] == 0 and hits["requests_per_day"] == 0
    assert after[("mcpd_pool_queued", ())] == 0 and after[("mcpd_workers_busy", ())] == 0


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


@pytest.mark.root
def test_helper_up_follows_the_root_helper() -> None:
    """With a root helper, ``mcpd_helper_up`` is 1 while it answers, 0 once it is gone, 1 again
    after a restart (bounded waits: the front notices a closed connection at once)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: starts the root helper")
    from tests.support.osaccounts import AccountFactory
    from tests.support.privsep_fixture import start_privsep, stop_privsep

    port = free_port()
    factory = AccountFactory()
    d = None
    try:
        d = start_privsep(factory, metrics_listen=f"127.0.0.1:{port}")

        def helper_up(expected: float) -> float:
            deadline = time.monotonic() + 30
            while True:
                value = samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)[("mcpd_helper_up", ())]
                if value == expected or time.monotonic() > deadline:
                    return value
                time.sleep(0.2)

        assert helper_up(1) == 1
        d.kill_helper()
        assert helper_up(0) == 0
        d.start_helper()
        assert helper_up(1) == 1
    finally:
        if d is not None:
            stop_privsep(d)
        factory.cleanup()
