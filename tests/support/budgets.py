"""Daemons with small outgoing-byte budgets, stalled readers and the reads that fill them."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import Daemon
from tests.support.metrics import samples
from tests.support.net import free_port
from tests.support.streamable import headers as modern_headers
from tests.support.streamable import request as modern_request
from tests.support.streams import INIT, Raw, get, open_sse, reads_done, until

MIB = 1024 * 1024


ANSWER_MIB = 6  # each read's answer: about 6 MiB (its text, a few escapes and the envelope)


def answer_file(tmp_path: Path) -> Path:
    folder = tmp_path / "files"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "six-mib.txt"
    path.write_bytes((b"x" * 1023 + b"\n") * 1024 * ANSWER_MIB)
    os.chmod(tmp_path, 0o755)
    os.chmod(folder, 0o755)
    return path


def read_call(path: Path, rid: Any, progress: bool = False) -> dict[str, Any]:
    params: dict[str, Any] = {"name": "files/read", "arguments": {"path": str(path), "limit": ANSWER_MIB * MIB}}
    if progress:
        params["_meta"] = {"progressToken": f"p{rid}"}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


class Metrics:
    """The daemon's metrics listener."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.peak = 0.0

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return samples(httpx.get(self.base + "/metrics", timeout=10).text)

    def outgoing(self) -> float:
        """``mcpd_outgoing_bytes`` now (the highest seen is kept in ``peak``)."""
        value = self.scrape()[("mcpd_outgoing_bytes", ())]
        self.peak = max(self.peak, value)
        return value

    def hits(self, kind: str) -> float:
        return self.scrape()[("mcpd_limits_hit_total", (("limit", kind),))]


def daemon_with_metrics(daemon_factory: Callable[..., Daemon], tmp_path: Path,
                        **overrides: Any) -> tuple[Daemon, Metrics, Path, Path]:
    """A daemon with its metrics listener (``overrides`` in its config), a 6 MiB file and a small one."""
    port = free_port()
    d = daemon_factory(metrics_listen=f"127.0.0.1:{port}", **overrides)
    big = answer_file(tmp_path)
    small = big.parent / "small.txt"
    small.write_text("small\n")
    return d, Metrics(port), big, small


def stall(d: Daemon, c: httpx.Client, big: Path, answers: int, token: str | None = None,
          m: Metrics | None = None, pipelined: bool = False) -> tuple[Raw, str, list[int]]:
    """A ``/sse`` session whose client reads nothing past its endpoint event, with up to
    ``answers`` reads answered onto it, each waited for (its access record): the statuses of
    their POSTs (``404`` ends them: the session was closed). ``pipelined``: a request follows the
    ``GET`` on its connection, so the server keeps the stream rather than taking it over."""
    s, endpoint = open_sse(d, rcvbuf=4096, token=token, body=get(d, "/nowhere") if pipelined else b"")
    auth = d.auth(token)
    assert c.post(d.url + endpoint, json=INIT, headers=auth).status_code == 202
    statuses: list[int] = []
    for i in range(answers):
        before = reads_done(d)
        statuses.append(c.post(d.url + endpoint, json=read_call(big, i), headers=auth).status_code)
        if statuses[-1] != 202:
            break
        assert until(lambda: reads_done(d) > before, 60), "the read was not answered"
        if m is not None:
            m.outgoing()
    return s, endpoint, statuses


def bob_is_served(d: Daemon, c: httpx.Client, small: Path) -> None:
    """Bob (another principal) opens a Streamable HTTP session and reads a small file."""
    headers = {"Accept": "application/json, text/event-stream", **d.auth(d.other_token)}
    r = c.post(d.url + "/mcp", json=INIT, headers=headers)
    assert r.status_code == 200, r.text
    headers["Mcp-Session-Id"] = r.headers["mcp-session-id"]
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "files/read", "arguments": {"path": str(small)}}}
    r = c.post(d.url + "/mcp", json=call, headers=headers)
    assert r.status_code == 200 and r.json()["result"]["content"][0]["text"] == "small\n", r.text


def session_of(d: Daemon, c: httpx.Client, token: str | None = None, version: str | None = None) -> dict[str, str]:
    """A new Streamable HTTP session's headers for a JSON answer (``Accept: application/json``),
    of protocol ``version`` (``None``: :data:`tests.support.streams.INIT`'s)."""
    headers = {"Accept": "application/json", **d.auth(token)}
    init = INIT if version is None else {**INIT, "params": {**INIT["params"], "protocolVersion": version}}
    r = c.post(d.url + "/mcp", json=init, headers=headers)
    assert r.status_code == 200, r.text
    return {**headers, "Mcp-Session-Id": r.headers["mcp-session-id"]}


def stateless_read(d: Daemon, path: Path, rid: int, token: str | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """A 2026-07-28 (no session) read of ``path`` as JSON: the message and its headers."""
    message = modern_request("tools/call", {"name": "files/read", "arguments": {"path": str(path),
                                                                                  "limit": ANSWER_MIB * MIB}}, rid)
    headers = {**modern_headers(d, message), "Accept": "application/json", **d.auth(token)}
    return message, headers


def answer_ends(raw: Raw) -> tuple[int, bytes]:
    """Read the answer to its end: its status and body (cut short if the server dropped it)."""
    status, head = raw.head()
    length = int(head.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    body = raw.buf
    while len(body) < length and raw._more():
        body = raw.buf
    return status, body[:length]


