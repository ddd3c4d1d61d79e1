"""The policy process kills a worker once, however many ask: kill requests from the front, the
deadline of a privileged call and the reaper may race for one worker; only the first of them
kills it, closes its descriptors and writes its ``kill`` record.

A worker's pidfd is a plain descriptor number: closed a second time, it would close whatever the
process was given that number meanwhile (another principal's worker socket, a kept file)."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import subprocess
import threading
import types
from typing import Any, cast

from mcpd.policy.state import State, Worker
from mcpd.policy.workers import kill_worker


def test_two_kills_of_one_worker_kill_close_and_record_it_once() -> None:
    """Two ``kill_worker`` requests for one worker that both found it theirs (the first has not
    yet taken it out of the table when the second looks): the second does nothing, and a
    descriptor opened since at the number of the worker's pidfd stays open."""
    child = subprocess.Popen(["sleep", "60"])
    pidfd = os.pidfd_open(child.pid)
    ours, theirs = socket.socketpair()
    w = Worker(pid=child.pid, pidfd=pidfd, owner=("alice", "alice"), ctl=ours)
    killed: list[int] = []
    records: list[tuple[str, dict[str, Any]]] = []

    def root_kill(pid: int) -> None:  # root's part: SIGKILL through the pidfd it holds
        killed.append(pid)
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)

    state = types.SimpleNamespace(
        lock=threading.Lock(), workers={child.pid: w}, exited=collections.OrderedDict(),
        root=types.SimpleNamespace(kill=root_kill),
        audit=types.SimpleNamespace(record=lambda event, **fields: records.append((event, fields))))
    devnull, reused = os.open(os.devnull, os.O_RDONLY), -1
    try:
        kill_worker(cast(State, state), w, "asked by the front")
        assert child.wait(timeout=10) == -signal.SIGKILL
        reused = os.dup2(devnull, pidfd)  # a descriptor given the pidfd's number meanwhile
        kill_worker(cast(State, state), w, "asked by the front")  # the second request, already past its check
        try:
            os.fstat(reused)
        except OSError:
            raise AssertionError("the second kill closed a descriptor the worker no longer had") from None
        assert killed == [child.pid]
        assert [(event, fields["pid"], fields["reason"]) for event, fields in records] == [
            ("kill", child.pid, "asked by the front")]
        assert state.workers == {} and state.exited[child.pid] == ("alice", "alice")
    finally:
        for fd in (devnull, reused):
            with contextlib.suppress(OSError):
                os.close(fd)
        child.kill()
        child.wait()
        theirs.close()
