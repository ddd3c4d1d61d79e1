"""docs/REFERENCE.md §7.1: the W3C trace context of a request's ``_meta`` joins its record: the
front's access record (an unprivileged call) and the policy process's audit record (a privileged
one); a value breaking the W3C syntax (a forged one among them) is dropped and the call goes on."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from typing import Any

import httpx

from tests.support.privsep_fixture import PrivsepDaemon, privsep_daemon  # noqa: F401  (fixture)
from tests.support.streamable import META, as_daemon, headers, request

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"


def call(d: PrivsepDaemon, args: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """One stateless tools/call of files/read with ``meta`` added to its ``_meta``."""
    body = request("tools/call", {"name": "files/read", "arguments": args}, meta={**META, **meta})

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(d.cacert)), timeout=60,
                                     base_url=d.url) as c:
            r = await c.post("/mcp", json=body, headers=headers(as_daemon(d), body))
            assert r.status_code == 200, r.text
            return dict(r.json()["result"])

    return asyncio.run(go())


def access(d: PrivsepDaemon) -> list[dict[str, Any]]:
    text = d.access_path.read_text() if d.access_path.exists() else ""
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines() if line.strip()]


def last(records: Any, path: str, seconds: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        found = [r for r in records() if r.get("requested_path") == path]
        if found:
            return found[-1]
        assert time.monotonic() < deadline, f"no record of {path}"
        time.sleep(0.1)


def test_a_valid_trace_context_joins_the_access_and_the_audit_record(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    mine = str(d.log_file)  # (the account may not read it: refused by the kernel, recorded by the front)
    call(d, {"path": mine}, {"traceparent": PARENT, "tracestate": STATE})
    rec = last(lambda: access(d), mine)
    assert rec["traceparent"] == PARENT and rec["tracestate"] == STATE, rec
    res = call(d, {"path": str(d.log_file), "privileged": True}, {"traceparent": PARENT, "tracestate": STATE})
    assert not res.get("isError"), res
    rec = last(d.audit, str(d.log_file))
    assert rec["event"] == "accept" and rec["traceparent"] == PARENT and rec["tracestate"] == STATE, rec


def test_an_invalid_or_forged_trace_context_is_dropped_and_the_call_served(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    forged = [
        ({"traceparent": PARENT + '","user":"root'}, False),
        ({"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}, False),
        ({"traceparent": PARENT.upper()}, False),
        ({"traceparent": 7, "tracestate": STATE}, False),
        ({"traceparent": PARENT, "tracestate": 'a=1\n{"event":"accept"}'}, True),  # the parent alone kept
        ({"traceparent": PARENT, "tracestate": "a=" + "v" * 600}, True),
    ]
    for meta, parent_kept in forged:
        for privileged in (False, True):
            target = d.log_file
            before = len(d.audit()) if privileged else len(access(d))
            res = call(d, {"path": str(target), "privileged": privileged}, meta)
            assert not res.get("isError") or not privileged, (meta, res)
            records = d.audit if privileged else (lambda: access(d))
            deadline = time.monotonic() + 15
            while len(new := [r for r in records()[before:] if r.get("requested_path") == str(target)]) < 1:
                assert time.monotonic() < deadline, meta
                time.sleep(0.1)
            rec = new[-1]
            assert "tracestate" not in rec, (meta, rec)
            assert rec.get("traceparent") == (PARENT if parent_kept else None), (meta, rec)
            assert rec.get("user") != "root"
