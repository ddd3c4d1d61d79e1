"""How the pool starts and ends workers: the :class:`Spawner` interface, and :class:`LocalSpawner`,
the development spawner (workers as the daemon's own user, started by the front itself).

In production root's fork server starts workers as the caller's account, asked by the policy process
(:class:`mcpd.front.policy_client.spawner.PolicySpawner`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import subprocess
import sys
from typing import Protocol

from mcpd.common.config import ReadLimits


class Spawner(Protocol):
    """Starts and stops worker processes for an OS account.

    ``spawn`` returns the front's end of a connected ``AF_UNIX`` stream socketpair and the
    worker's pid; the pool owns the socket from then on. ``kill`` sends SIGKILL to a worker it
    spawned and returns once the process has been reaped (a no-op for an unknown or gone pid).
    Both may raise ``OSError`` or :class:`ToolError`.
    """

    async def spawn(self, os_user: str, token: str = "") -> tuple[socket.socket, int]: ...

    async def kill(self, pid: int) -> None: ...

    async def drop(self, pid: int) -> None:
        """End worker ``pid``, whose token no longer authenticates or which hung up (its socket is
        closed, so it exits at its next read if it has not): the policy process has such workers
        ended by itself (asking it with a token that no longer authenticates would be refused
        and recorded as an invalid token); a local spawner kills and reaps it."""
        ...

    async def alive(self) -> bool:
        """Whether new workers can be started now (asked after a worker ended mid-call)."""
        ...

    def generation(self) -> int:
        """A number that changes whenever every worker this spawner started may have ended
        together, through no doing of their principals (the policy process or root
        died, and its workers with it). A worker that ended on its own in an older generation
        than the current one was lost to that restart, and its replacement is no new start of
        its principal's (the pool does not charge it to the principal's spawn bucket)."""
        ...


class LocalSpawner:
    """Development spawner: workers run as the daemon's own user (``os_user`` is ignored).

    Args:
        limits: the read limits (bytes) handed to every worker on its command line.
        python: the interpreter to run (default: the current one).

    Children get only their socket (``pass_fds``), ``/dev/null`` as stdin/stdout, the daemon's
    stderr for tracebacks, a minimal environment, a new session (terminal signals do not reach
    them) and ``-I`` (isolated mode). Each child is watched through a pidfd and reaped as soon as
    it exits, so no zombie outlives its process.
    """

    def __init__(self, limits: ReadLimits, python: str = sys.executable) -> None:
        self._argv = [python, "-I", "-m", "mcpd.worker", "--limits", json.dumps(dataclasses.asdict(limits))]
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._exited: dict[int, asyncio.Future[None]] = {}

    async def spawn(self, os_user: str, token: str = "") -> tuple[socket.socket, int]:
        """Start one worker; see :class:`Spawner`. Raises ``OSError`` when the fork/exec fails."""
        loop = asyncio.get_running_loop()
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = subprocess.Popen(
                [*self._argv, "--fd", str(back.fileno()), "--parent", str(os.getpid())],
                pass_fds=(back.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                cwd="/",
                env={"PATH": os.defpath, "LANG": "C.UTF-8"},
                start_new_session=True,
            )
        except BaseException:
            front.close()
            raise
        finally:
            back.close()
        pidfd = os.pidfd_open(proc.pid)
        self._procs[proc.pid] = proc
        self._exited[proc.pid] = loop.create_future()
        loop.add_reader(pidfd, self._reap, loop, pidfd, proc.pid)
        return front, proc.pid

    def _reap(self, loop: asyncio.AbstractEventLoop, pidfd: int, pid: int) -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        proc = self._procs.pop(pid)
        proc.wait()  # the pidfd is readable: the child has exited, this does not block
        done = self._exited.pop(pid)
        if not done.done():
            done.set_result(None)

    async def kill(self, pid: int) -> None:
        """SIGKILL a worker this spawner started and wait until it is reaped; see :class:`Spawner`."""
        await self._end(pid)

    async def drop(self, pid: int) -> None:
        """As :meth:`kill`: nobody else ends these workers (see :class:`Spawner`)."""
        await self._end(pid)

    async def _end(self, pid: int) -> None:
        proc = self._procs.get(pid)
        done = self._exited.get(pid)
        if proc is None or done is None:
            return
        proc.kill()
        await asyncio.shield(done)

    async def alive(self) -> bool:
        """Always: these workers need nobody's help to start."""
        return True

    def generation(self) -> int:
        """Always 0: nothing ends these workers together but the front itself."""
        return 0

    def live_pids(self) -> list[int]:
        """Pids started by this spawner and not yet reaped (introspection for tests and status)."""
        return list(self._procs)
