"""Helpers for the attacks13 probes: a client for the daemon named by STATE/coords.json."""
import json, os, sys
import httpx

STATE = os.environ.get("A13_STATE", "/tmp/a13d1")
C = json.load(open(f"{STATE}/coords.json"))
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "a13", "version": "1"}}}


def client(**kw):
    return httpx.Client(verify=C["cacert"], base_url=C["url"], timeout=kw.pop("timeout", 20), **kw)


def h(sid=None, token=None, accept="application/json, text/event-stream", **extra):
    out = {"Authorization": f"Bearer {token or C['token']}", "Accept": accept, "Content-Type": "application/json"}
    if sid:
        out["Mcp-Session-Id"] = sid
    out.update(extra)
    return out


def session(c, token=None):
    r = c.post("/mcp", json=INIT, headers=h(token=token))
    assert r.status_code == 200, r.text
    sid = r.headers["mcp-session-id"]
    c.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=h(sid, token=token))
    return sid


def rpc(c, sid, method, params=None, id=1, **kw):
    body = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        body["params"] = params
    return c.post("/mcp", json=body, headers=h(sid, **kw))
