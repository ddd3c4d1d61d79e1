"""Streamable HTTP clients of the tests: sessions of the 2025-06-18 era and modern requests, without SDK."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx

from tests.conftest import Daemon

ACCEPT_BOTH = "application/json, text/event-stream"


SID_RE = re.compile(r"^[0-9a-f]{32}$")


INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


def client(d: Daemon) -> httpx.AsyncClient:
    return httpx.AsyncClient(verify=d.ssl_context(), timeout=30, base_url=d.url)


def hdrs(d: Daemon, sid: str | None = None, token: str | None = None, accept: str = ACCEPT_BOTH,
         **extra: str) -> dict[str, str]:
    h = {**d.auth(token), "Accept": accept, "Content-Type": "application/json"}
    if sid is not None:
        h["Mcp-Session-Id"] = sid
    h.update({k.replace("_", "-"): v for k, v in extra.items()})
    return h


async def open_session(c: httpx.AsyncClient, d: Daemon, token: str | None = None,
                       version: str = "2025-06-18") -> str:
    body = {**INIT, "params": {**INIT["params"], "protocolVersion": version}}
    r = await c.post("/mcp", json=body, headers=hdrs(d, token=token))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["result"]["protocolVersion"] == version
    sid = r.headers["mcp-session-id"]
    assert SID_RE.fullmatch(sid)
    r = await c.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                     headers=hdrs(d, sid, token=token, **{"MCP-Protocol-Version": version}))
    assert r.status_code == 202 and r.content == b""
    return sid


def sse_messages(text: str) -> list[Any]:
    """The ``data:`` payloads of an event stream's ``message`` events."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = block.split("\n")
        if "event: message" in lines:
            out.append(json.loads("".join(x[len("data: "):] for x in lines if x.startswith("data: "))))
    return out


V = "2026-07-28"


META = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}


NAME_FIELD = {"tools/call": "name", "resources/read": "uri",
              "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}


def request(method: str, params: dict[str, Any] | None = None, rid: Any = 1, meta: dict[str, Any] | None = None,
            ) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": {**(params or {}), "_meta": meta or META}}


def headers(d: Daemon, body: dict[str, Any], **override: str | None) -> dict[str, str]:
    h: dict[str, str | None] = {**d.auth(), "Accept": ACCEPT_BOTH, "Content-Type": "application/json",
                                "MCP-Protocol-Version": V, "Mcp-Method": body["method"]}
    field = NAME_FIELD.get(body["method"])
    if field and isinstance(body["params"].get(field), str):
        h["Mcp-Name"] = body["params"][field]
    h.update({k.replace("_", "-"): v for k, v in override.items()})
    return {k: v for k, v in h.items() if v is not None}


async def post(c: httpx.AsyncClient, d: Daemon, body: Any, **override: str | None) -> httpx.Response:
    return await c.post("/mcp", json=body, headers=headers(d, body, **override))


def as_daemon(d: Any, principal: str = "alice", other: str = "bob") -> Daemon:
    """A :class:`Daemon` view of a privilege-separated one, for :class:`SseSession` (no process)."""
    return Daemon(d.url, d.tokens[principal], d.tokens[other], d.cacert, d.state_dir, d.config_path, proc=None)  # type: ignore[arg-type]


def raw_headers(pairs: dict[str, str], *repeated: tuple[str, str]) -> list[tuple[str, str]]:
    """``pairs`` as a header list, then the ``repeated`` ones (a header sent twice)."""
    return [*pairs.items(), *repeated]


class Rpc:
    """A session-era Streamable HTTP session of one principal (2025-11-25 unless told): one request
    a POST, answered as JSON; ``ok``/``err`` assert a result or an error, ``until_done`` polls a task."""

    def __init__(self, c: httpx.AsyncClient, d: Daemon, sid: str, token: str | None, version: str) -> None:
        self.c, self.d, self.sid, self.token, self.version = c, d, sid, token, version
        self.n = 0

    @classmethod
    async def open(cls, c: httpx.AsyncClient, d: Daemon, token: str | None = None, version: str = "2025-11-25") -> Rpc:
        return cls(c, d, await open_session(c, d, token=token, version=version), token, version)

    async def __call__(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.n += 1
        rid = self.n
        body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}
        r = await self.c.post("/mcp", json=body, headers=hdrs(self.d, self.sid, token=self.token,
                                                             **{"MCP-Protocol-Version": self.version}))
        assert r.status_code == 200, r.text
        reply: dict[str, Any] = r.json()
        assert reply["id"] == rid
        return reply

    async def ok(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = await self(method, params)
        assert "result" in reply, reply
        result: dict[str, Any] = reply["result"]
        return result

    async def err(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = await self(method, params)
        assert "error" in reply, reply
        error: dict[str, Any] = reply["error"]
        return error

    async def until_done(self, task_id: str) -> dict[str, Any]:
        for _ in range(400):
            task = await self.ok("tasks/get", {"taskId": task_id})
            if task["status"] != "working":
                return task
            await asyncio.sleep(0.05)
        raise AssertionError(f"task {task_id} still works")
