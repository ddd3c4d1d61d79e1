"""Running a ``linuxctl`` command's calls: connect with the resolved settings, await the
command's coroutine, and turn the client's error into ``CODE: message`` on stderr and its exit
status (1 to 4, docs/REFERENCE.md §6). What a command prints on success is :mod:`.output`'s.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

import click

from mcpd.client.api import Client
from mcpd.client.config import Settings, resolve
from mcpd.client.errors import MCPClientError
from mcpd.common.printable import printable

T = TypeVar("T")


def fail(exc: MCPClientError) -> NoReturn:
    """Print ``CODE: message`` (escaped: it may name a path) on stderr and exit with the error's
    status (1 to 4)."""
    click.echo(printable(f"{exc.code}: {exc.message}"), err=True)
    sys.exit(exc.exit_code)


def run(settings: Settings, fn: Callable[[Client], Awaitable[T]],
        on_error: Callable[[MCPClientError], object] | None = None) -> T:
    """Connect with ``settings``, run ``await fn(client)`` and return its value; errors exit via
    ``on_error`` (default :func:`fail`; ``linuxctl grep``'s exits 2, as grep does)."""

    async def go() -> T:
        url, token, cacert = resolve(settings)
        async with Client(url, token, cacert, settings.timeout, transport=settings.transport) as client:
            return await fn(client)

    try:
        return asyncio.run(go())
    except MCPClientError as exc:
        (on_error or fail)(exc)
        sys.exit(exc.exit_code)
