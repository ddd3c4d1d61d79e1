"""The official MCP Python SDK client against the real daemon over TLS (docs/REFERENCE.md §1, §2, §3), over
``/sse`` and over Streamable HTTP at ``/mcp``.

The SDK 2.x talks through ``httpx2``: ``sse_client`` gets an ``httpx_client_factory`` that builds an
``httpx2.AsyncClient`` trusting the private CA, and the bearer token goes in the headers.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import Daemon

pytestmark = pytest.mark.anyio


def factory(cafile: str) -> Any:
    def make(headers: dict[str, str] | None = None, timeout: httpx2.Timeout | None = None,
             auth: httpx2.Auth | None = None) -> httpx2.AsyncClient:
        ctx = ssl.create_default_context(cafile=cafile)
        return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, verify=ctx)

    return make


async def test_sdk_client_initializes_lists_tools_reads_file(daemon: Daemon, tmp_path: Path) -> None:
    p = tmp_path / "notes.txt"
    p.write_text("first line\nsecond line\n", encoding="utf-8")
    async with sse_client(f"{daemon.url}/sse", headers=daemon.auth(), timeout=20,
                          httpx_client_factory=factory(daemon.cacert)) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            assert init.server_info.name == "mcpd"
            assert init.capabilities.tools is not None
            tools = await session.list_tools()
            read_tool = next(t for t in tools.tools if t.name == "files/read")
            assert read_tool.input_schema["additionalProperties"] is False
            result = await session.call_tool("files/read", {"path": str(p)})
            assert not result.is_error
            assert result.content[0].text == "first line\nsecond line\n"  # type: ignore[union-attr]
            ranged = await session.call_tool("files/read", {"path": str(p), "start_line": 2})
            assert ranged.content[0].text == "second line\n"  # type: ignore[union-attr]
            failed = await session.call_tool("files/read", {"path": str(tmp_path / "missing")})
            assert failed.is_error
            assert failed.structured_content is not None
            assert failed.structured_content["error"]["code"] == "FILE_NOT_FOUND"
            await session.send_ping()


async def test_sdk_client_rejected_without_token(daemon: Daemon) -> None:
    with pytest.raises(BaseException) as info:
        async with sse_client(f"{daemon.url}/sse", timeout=10, httpx_client_factory=factory(daemon.cacert)):
            pass
    assert "401" in repr(info.value) or any("401" in repr(e) for e in getattr(info.value, "exceptions", []))


# -- Streamable HTTP at /mcp (docs/REFERENCE.md §1.6) ---------------------------------------------------------


def http_client(daemon: Daemon, token: str | None = None) -> httpx2.AsyncClient:
    """What ``streamable_http_client`` takes: an httpx2 client with the CA and the bearer header."""
    return httpx2.AsyncClient(headers=daemon.auth(token), timeout=httpx2.Timeout(20, read=60),
                              verify=ssl.create_default_context(cafile=daemon.cacert))


async def list_call_read(client: Any, p: Path) -> None:
    """What every client must manage: ``files/read`` listed, called (a success and a tool error)
    and the file read as a resource; ``p`` holds two lines."""
    tools = await client.list_tools()
    assert "files/read" in [t.name for t in tools.tools]
    result = await client.call_tool("files/read", {"path": str(p)})
    assert not result.is_error
    assert result.content[0].text == "first line\nsecond line\n"
    failed = await client.call_tool("files/read", {"path": str(p.parent / "missing")})
    assert failed.is_error and failed.structured_content is not None
    assert failed.structured_content["error"]["code"] == "FILE_NOT_FOUND"
    res = await client.read_resource(f"file://{p}")
    assert res.contents[0].text == "first line\nsecond line\n"


async def test_sdk_streamable_http_lists_calls_reads_resource(daemon: Daemon, tmp_path: Path) -> None:
    p = tmp_path / "notes.txt"
    p.write_text("first line\nsecond line\n", encoding="utf-8")
    async with http_client(daemon) as hc, streamable_http_client(f"{daemon.url}/mcp", http_client=hc) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            assert init.server_info.name == "mcpd"
            await list_call_read(session, p)
            await session.send_ping()


async def test_sdk_streamable_http_progress_arrives(daemon: Daemon, tmp_path: Path) -> None:
    for d in range(3):
        (tmp_path / f"d{d}").mkdir()
        for i in range(4000):
            (tmp_path / f"d{d}" / f"f{i}").touch()
    seen: list[float] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        seen.append(done)

    async with http_client(daemon) as hc, streamable_http_client(f"{daemon.url}/mcp", http_client=hc) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool("files/find", {"root": str(tmp_path), "name": "nomatch"},
                                             progress_callback=on_progress)
            assert not result.is_error
    assert seen and seen == sorted(seen)


async def test_sdk_streamable_http_rejected_with_bad_token(daemon: Daemon) -> None:
    with pytest.raises(BaseException) as info:
        async with http_client(daemon, token="wrong") as hc, \
                streamable_http_client(f"{daemon.url}/mcp", http_client=hc) as (read, write):
            async with ClientSession(read, write) as session:
                with anyio.fail_after(20):
                    await session.initialize()
    assert not isinstance(info.value, TimeoutError)  # refused at once (the 401 itself: test_streamable.py)


@pytest.mark.parametrize("mode", ["auto", "2026-07-28", "legacy"])
async def test_sdk_client_modes_list_call_read(daemon: Daemon, tmp_path: Path, mode: str) -> None:
    """``mcp.Client`` in auto mode (probes ``server/discover``), pinned to 2026-07-28 (stateless,
    no initialize) and legacy (initialize, session): the same tools, results and resource."""
    p = tmp_path / "notes.txt"
    p.write_text("first line\nsecond line\n", encoding="utf-8")
    async with http_client(daemon) as hc:
        async with Client(streamable_http_client(f"{daemon.url}/mcp", http_client=hc), mode=mode) as client:
            assert client.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
            await list_call_read(client, p)
