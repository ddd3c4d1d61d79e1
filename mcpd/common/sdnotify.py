"""systemd readiness notification (``sd_notify(3)``) for ``Type=notify`` units.

A datagram ``READY=1`` to ``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract namespace).
Outside systemd (no ``NOTIFY_SOCKET``) it does nothing.
"""

from __future__ import annotations

import os
import socket


def notify(state: str = "READY=1") -> bool:
    """Send ``state`` to systemd; return whether it was sent (``False`` outside systemd or on error)."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        try:
            s.sendto(state.encode("ascii"), addr)
        except OSError:
            return False
    return True
