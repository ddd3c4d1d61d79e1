"""A person in the loop of privileged calls, driven over raw HTTP: 2026-07-28 ``tools/call``
requests that declare URL-mode elicitation, their input-required answers and retries, and the
confirmation page's form (its CSRF token read from the page's HTML)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpd.client.api import ssl_context
from tests.support.osaccounts import AccountFactory, ensure_user, pam_service
from tests.support.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep

PAM_FILE = Path(__file__).resolve().parents[2] / "etc/pam.d/mcpd"
V = "2026-07-28"
CAPS_URL = {"elicitation": {"url": {}}}


def call_body(path: str, caps: dict[str, Any] | None = None, rid: int = 1, state: str | None = None,
              action: str = "accept", why: str | None = None, tool: str = "files/read") -> dict[str, Any]:
    """One stateless ``tools/call`` of ``tool`` on ``path`` with ``privileged: true``; ``state``: a retry."""
    meta: dict[str, Any] = {"io.modelcontextprotocol/protocolVersion": V,
                            "io.modelcontextprotocol/clientCapabilities": CAPS_URL if caps is None else caps,
                            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}
    if why is not None:
        meta["dev.mcpd/reason"] = why
    params: dict[str, Any] = {"name": tool, "arguments": {"path": path, "privileged": True}, "_meta": meta}
    if state is not None:
        params["requestState"] = state
        params["inputResponses"] = {"mcpd_confirm": {"action": action}}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


def call(d: Any, token: str, body: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    """POST ``body`` to ``/mcp`` with ``token``; the JSON-RPC result."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json", "MCP-Protocol-Version": V, "Mcp-Method": "tools/call",
               "Mcp-Name": body["params"]["name"]}
    with httpx.Client(verify=ssl_context(d.cacert), timeout=timeout) as c:
        resp = c.post(d.url + "/mcp", json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    return resp.json()["result"]


def page_url(result: dict[str, Any]) -> str:
    """The confirmation page an input-required result points to."""
    assert result["resultType"] == "input_required", result
    req = result["inputRequests"]["mcpd_confirm"]
    assert req["method"] == "elicitation/create" and req["params"]["mode"] == "url"
    return str(req["params"]["url"])


def page(d: Any, url: str) -> httpx.Response:
    with httpx.Client(verify=ssl_context(d.cacert), timeout=30) as c:
        return c.get(url)


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, html
    return m.group(1)


def submit(d: Any, url: str, fields: dict[str, str], origin: str | None = "same") -> httpx.Response:
    """POST the page's form (``origin``: ``"same"`` for the page's own, None for none, or a value)."""
    headers = {}
    if origin == "same":
        headers["Origin"] = "https://" + url.split("/")[2]
    elif origin is not None:
        headers["Origin"] = origin
    with httpx.Client(verify=ssl_context(d.cacert), timeout=60) as c:
        return c.post(url, data=fields, headers=headers)


def sign_in(d: Any, url: str, user: str, password: str, decision: str = "signin") -> httpx.Response:
    """Open the page, then send its form with its CSRF token."""
    shown = page(d, url)
    assert shown.status_code == 200, shown.text
    return submit(d, url, {"csrf": csrf_of(shown.text), "user": user, "password": password, "decision": decision})


#: alice's tools as most of these tests want them: files/read needs a fresh sign-in (1h),
#: files/list bob's approval
SIGNIN_READ_APPROVED_LIST = {"files/read": {"reauth_after": "1h"}, "files/list": {"approve": {"by": ["bob"]}}}


@contextlib.contextmanager
def confirm_daemon(rules: dict[str, dict[str, Any]], login: dict[str, Any] | None = None,
                   **overrides: Any) -> Iterator[tuple[PrivsepDaemon, dict[str, str]]]:
    """The privsep daemon with the shipped PAM service, alice's default grants with ``rules``
    (tool -> keys added to its rule) and passwords for alice and bob: ``(daemon, passwords)``.
    Skips without root."""
    if os.geteuid() != 0:
        pytest.skip("needs root: PAM service, OS accounts, root helper")
    factory = AccountFactory()
    d: PrivsepDaemon | None = None
    with pam_service(PAM_FILE) as service:
        try:
            d = start_privsep(factory, login={"pam_service": service, "answer_seconds": 0.0, **(login or {})},
                              **overrides)
            passwords = {}
            for name in ("alice", "bob"):
                passwords[name] = secrets.token_urlsafe(12)
                ensure_user(d.accounts[name].name, password=passwords[name])
            grants = d.default_grants()
            tools = grants["users"][d.accounts["alice"].name]["privileged"]["tools"]
            for tool, keys in rules.items():
                tools[tool].update(keys)
            d.write_grants(grants)
            time.sleep(1.0)  # SIGHUP reload
            yield d, passwords
        finally:
            if d is not None:
                stop_privsep(d)
            factory.cleanup()
