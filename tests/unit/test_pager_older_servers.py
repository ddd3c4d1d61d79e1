"""``linuxctl get files`` against a server older than ``decompress`` and ``encoding: base64``
(docs/REFERENCE.md §6): it still copies text files, and says plainly why it cannot copy a binary.

The server here is a script answering as such a server's ``files/read`` did (its
``INVALID_ARGUMENT`` for an unknown argument or encoding, word for word); the current server's
behaviour is tested through the real daemon in
``tests/integration/test_files_read_bytes_daemon.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mcpd.client import pager
from mcpd.client.errors import MCPClientError, ToolFailed

OLD_ENCODINGS = ("ascii", "auto", "cp1252", "latin-1", "utf-16", "utf-8")


class OlderServer:
    """``call_tool("files/read", ...)`` as a server without ``decompress`` and ``base64`` answers it."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.calls: list[dict[str, Any]] = []

    async def call_tool(self, name: str, args: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.calls.append(args)
        for key in args:
            if key not in ("path", "offset", "limit", "encoding", "include_metadata", "privileged"):
                raise ToolFailed("INVALID_ARGUMENT", f"unknown argument: {key}", {"argument": key}, {})
        if args.get("encoding", "utf-8") not in OLD_ENCODINGS:
            raise ToolFailed("INVALID_ARGUMENT", f"encoding must be one of {', '.join(OLD_ENCODINGS)}",
                             {"argument": "encoding"}, {})
        if b"\0" in self.data[:8192]:
            raise ToolFailed("BINARY_FILE", "cannot read binary file", {}, {})
        start, n = args["offset"], args["limit"]
        window = self.data[start:start + n]
        reply: dict[str, Any] = {"content": [{"type": "text", "text": window.decode()}]}
        if args.get("include_metadata"):
            reply["structuredContent"] = {"size": len(self.data), "encoding": "utf-8", "bom": False,
                                          "byteRange": {"start": start, "end": start + len(window)}}
        return reply


async def copy(server: OlderServer) -> bytes:
    return b"".join([chunk async for chunk in pager.read_pages(server, "/x", page_bytes=1000)])  # type: ignore[arg-type]


def test_a_text_file_still_copies_from_an_older_server() -> None:
    data = b"line of text\n" * 500
    server = OlderServer(data)
    assert asyncio.run(copy(server)) == data
    assert "decompress" in server.calls[0] and all("decompress" not in c for c in server.calls[1:])


def test_a_binary_file_from_an_older_server_says_why() -> None:
    server = OlderServer(b"\0\1\2" * 100)
    with pytest.raises(MCPClientError) as info:
        asyncio.run(copy(server))
    assert info.value.code == "UNSUPPORTED" and "older than this linuxctl" in info.value.message
