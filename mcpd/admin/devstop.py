"""How ``mcpd dev`` stops: the first SIGINT, SIGTERM or SIGHUP becomes :class:`DevStop` in the
main thread, a second one ends the process at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from types import FrameType


class DevStop(BaseException):
    """A stop signal (SIGINT, SIGTERM, SIGHUP) reached ``mcpd dev``; ``args[0]`` is its number."""


@contextlib.contextmanager
def stop_signals(on_hangup: Callable[[], None] | None = None) -> Iterator[None]:
    """While inside, the first SIGINT, SIGTERM or SIGHUP raises :class:`DevStop` in the main
    thread (SIGHUP calls ``on_hangup`` instead when given); while that stop runs, another SIGINT
    or SIGTERM ends the process at once (exit 128 + the signal's number: the kernel then ends its
    children, see :mod:`mcpd.admin.devroot`), another SIGHUP is ignored (a closed terminal may
    send two: the kernel's and the shell's).

    SIGINT is caught even when this process started with it ignored (an asynchronous command of
    a non-interactive shell, ``mcpd dev &`` in a script, inherits it ignored), so it always
    stops ``mcpd dev``; SIGHUP stays ignored when it was (``nohup``). The previous handlers come
    back on leaving."""
    stopping: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP and on_hangup is not None:
            on_hangup()
            return
        if stopping:
            if signum != signal.SIGHUP:
                os._exit(128 + signum)
            return
        stopping.append(signum)
        raise DevStop(signum)

    caught = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        caught.append(signal.SIGHUP)
    previous = {sig: signal.signal(sig, stop) for sig in caught}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
