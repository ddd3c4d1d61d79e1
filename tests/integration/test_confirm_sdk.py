"""Step-up sign-in and approval with the official Python SDK (``mcp.Client``) as the requester's
client (docs/REFERENCE.md §4.7): pinned to 2026-07-28 (the SDK's multi-round-trip driver answers
the input-required result and retries) and legacy (2025-11-25 sessions: the server sends a
URL-mode ``elicitation/create`` during the call). The SDK's elicitation callback plays the user:
it opens the page it is given and signs in (or has the approver approve) before it accepts.
"""

from __future__ import annotations

import os
import secrets
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ElicitResult

from tests.support.confirm import sign_in
from tests.support.osaccounts import AccountFactory, ensure_user, pam_service
from tests.support.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep

pytestmark = [pytest.mark.root, pytest.mark.anyio]

PAM_FILE = Path(__file__).resolve().parents[2] / "etc/pam.d/mcpd"


@pytest.fixture(scope="module")
def sdkd() -> Iterator[tuple[PrivsepDaemon, dict[str, str]]]:
    """alice: files/read needs a fresh sign-in; files/list needs bob's approval."""
    if os.geteuid() != 0:
        pytest.skip("needs root: PAM service, OS accounts, root helper")
    factory = AccountFactory()
    d: PrivsepDaemon | None = None
    with pam_service(PAM_FILE) as service:
        try:
            d = start_privsep(factory, login={"pam_service": service, "answer_seconds": 0.0})
            passwords = {}
            for name in ("alice", "bob"):
                passwords[name] = secrets.token_urlsafe(12)
                ensure_user(d.accounts[name].name, password=passwords[name])
            grants = d.default_grants()
            tools = grants["users"][d.accounts["alice"].name]["privileged"]["tools"]
            tools["files/read"]["reauth_after"] = "1h"
            tools["files/list"]["approve"] = {"by": ["bob"]}
            d.write_grants(grants)
            time.sleep(1.0)
            yield d, passwords
        finally:
            if d is not None:
                stop_privsep(d)
            factory.cleanup()


def _client(d: PrivsepDaemon) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(headers={"Authorization": f"Bearer {d.tokens['alice']}"},
                              timeout=httpx2.Timeout(20, read=90), verify=ssl.create_default_context(cafile=d.cacert))


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
@pytest.mark.parametrize("tool", ["files/read", "files/list"])
async def test_sdk_client_completes_a_call_after_the_page(sdkd: Any, mode: str, tool: str) -> None:
    d, pw = sdkd
    asked: list[Any] = []

    async def on_elicit(context: Any, params: Any) -> ElicitResult:
        asked.append(params)
        who, decision = ("alice", "signin") if tool == "files/read" else ("bob", "approve")
        done = await anyio.to_thread.run_sync(lambda: sign_in(d, params.url, d.accounts[who].name, pw[who], decision))
        assert done.status_code == 200, done.text
        return ElicitResult(action="accept")

    path = str(d.log_file) if tool == "files/read" else str(d.app)
    async with _client(d) as hc:
        async with Client(streamable_http_client(f"{d.url}/mcp", http_client=hc), mode=mode,
                          elicitation_callback=on_elicit) as client:
            result = await client.call_tool(tool, {"path": path, "privileged": True})
    assert not result.is_error, result
    assert len(asked) == 1 and asked[0].mode == "url" and asked[0].url.startswith(d.url + "/confirm/")
    text = result.content[0].text
    assert text.startswith("app log line 1") if tool == "files/read" else "log.txt" in text
