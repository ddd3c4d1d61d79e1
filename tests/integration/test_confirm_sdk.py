"""Step-up sign-in and approval with the official Python SDK (``mcp.Client``) as the requester's
client (docs/REFERENCE.md §4.7): pinned to 2026-07-28 (the SDK's multi-round-trip driver answers
the input-required result and retries) and legacy (2025-11-25 sessions: the server sends a
URL-mode ``elicitation/create`` during the call). The SDK's elicitation callback plays the user:
it opens the page it is given and signs in (or has the approver approve) before it accepts.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ElicitResult

from tests.support.confirm import SIGNIN_READ_APPROVED_LIST, confirm_daemon, sign_in
from tests.support.privsep_fixture import PrivsepDaemon

pytestmark = [pytest.mark.root, pytest.mark.anyio]



@pytest.fixture(scope="module")
def sdkd() -> Iterator[tuple[PrivsepDaemon, dict[str, str]]]:
    """alice: files/read needs a fresh sign-in; files/list needs bob's approval."""
    with confirm_daemon(SIGNIN_READ_APPROVED_LIST) as found:
        yield found


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
