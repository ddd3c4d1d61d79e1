"""Floods of requests carrying forged bearer tokens, for the tests that a token nobody issued
never takes capacity from the holders of valid ones.

Each flooding connection ends by itself at its deadline and closes its TLS stream fully, so
a test that floods leaves no socket open behind it (an unclosed one would surface later, as a
ResourceWarning in whatever test the same process runs next).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import ssl
import time
from collections.abc import Callable

PING = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'


async def _one_connection(host: str, port: int, ctx: ssl.SSLContext, until: float,
                          token: Callable[[int], str], first: int) -> None:
    """POST a ping to ``/message`` of a random session with ``token(i)`` (i = first, first+1, …)
    until the monotonic time ``until``, reading each answer whole; a refused or closed connection
    ends it quietly."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ctx, server_hostname=host), max(until - time.monotonic(), 1))
    except (TimeoutError, OSError):
        return
    i = first
    try:
        while time.monotonic() < until:
            i += 1
            writer.write((f"POST /message?session_id={secrets.token_hex(16)} HTTP/1.1\r\nHost: {host}\r\n"
                          f"Authorization: Bearer {token(i)}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(PING)}\r\n\r\n").encode() + PING)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 10)


class ForgedTokenFlood:
    """``connections`` connections flooding ``host:port`` with ``token(i)`` for ``seconds``.

    Use as ``async with ForgedTokenFlood(...) as flood:``; leaving the block waits for every
    connection to reach its deadline and close (``flood.until`` is that deadline, monotonic).
    """

    def __init__(self, host: str, port: int, ctx: ssl.SSLContext, *, connections: int, seconds: float,
                 token: Callable[[int], str]) -> None:
        self.host, self.port, self.ctx = host, port, ctx
        self.connections, self.seconds, self.token = connections, seconds, token
        self.until = 0.0
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> ForgedTokenFlood:
        self.until = time.monotonic() + self.seconds
        self._tasks = [asyncio.create_task(_one_connection(self.host, self.port, self.ctx, self.until, self.token,
                                                           k * 3)) for k in range(self.connections)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        _, pending = await asyncio.wait(self._tasks, timeout=self.seconds + 30)
        for task in pending:  # a connection stuck past its deadline: stopped, and closed by its finally
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def random_token(_: int) -> str:
    """A token-shaped static token nobody issued (a new one each time, so never cached)."""
    return f"mcpd_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"
