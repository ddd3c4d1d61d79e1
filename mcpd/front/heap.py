"""Giving the front's freed memory back to the system: the C heap's free pages (glibc
``malloc_trim``). When to do it is the session table's call
(``mcpd.front.sessions.table.SessionManager.give_back_memory``)."""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc only; elsewhere nothing to do
    except (OSError, AttributeError):
        return None


def trim_heap() -> bool:
    """Return the C heap's free pages to the system (glibc ``malloc_trim(0)``); ``False`` where
    the C library has no such call."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
