"""The policy process reads a worker's report of a privileged read (its audit record's outcome
and bytes) through a buffer: whatever way the worker, which may be compromised, sends it."""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any

import pytest

from mcpd.helper.wire import frames
from mcpd.helper.wire.errors import INTERNAL_ERROR, ToolError
from mcpd.policy.handover import await_report
from mcpd.policy.state import Worker


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair()
    yield Worker(pid=1, pidfd=-1, owner=("alice", "alice"), ctl=ours), theirs
    ours.close()
    theirs.close()


def test_a_report_split_anywhere_and_after_stale_ones_is_found(pair) -> None:
    w, worker = pair
    data = frames.encode({"id": 6, "code": None, "bytes": 1}) + frames.encode({"id": 7, "code": None, "bytes": 4096})

    def send() -> None:
        for i in range(0, len(data), 5):  # five bytes at a time
            worker.sendall(data[i:i + 5])
            time.sleep(0.002)

    t = threading.Thread(target=send)
    t.start()
    assert await_report(w, 7, 10.0) == {"id": 7, "code": None, "bytes": 4096}
    t.join()
    worker.sendall(frames.encode({"id": 8, "code": "FILE_NOT_FOUND", "bytes": 0}) * 2)
    assert await_report(w, 8, 10.0)["code"] == "FILE_NOT_FOUND"
    assert await_report(w, 8, 10.0)["id"] == 8  # the second, already in the buffer
    assert w.reports == bytearray()


def test_no_report_in_time_is_none_and_a_gone_worker_an_internal_error(pair) -> None:
    w, worker = pair
    assert await_report(w, 1, 0.05) is None
    worker.sendall(frames.encode({"id": 1})[:3])  # half a header, then the worker ends
    worker.close()
    with pytest.raises(ToolError) as err:
        await_report(w, 1, 5.0)
    assert err.value.code == INTERNAL_ERROR


def test_an_oversized_or_garbled_report_is_refused_before_it_is_read(pair) -> None:
    w, worker = pair
    worker.sendall(struct.pack("!I", 1 << 30))
    with pytest.raises(ToolError) as refused:  # the call fails (its record says so), nothing more is read
        await_report(w, 1, 5.0)
    assert refused.value.code == INTERNAL_ERROR and "malformed report" in refused.value.message
    w.reports.clear()
    worker.sendall(struct.pack("!I", 3) + b"[1]")
    with pytest.raises(ToolError) as refused:
        await_report(w, 1, 5.0)
    assert refused.value.code == INTERNAL_ERROR


def test_a_worker_is_forgotten_once_however_many_ask() -> None:
    """Two kill requests for one worker (or a kill racing the reaper) must not both close its
    pidfd: the second close would hit whatever that descriptor number was given to meanwhile."""
    import collections
    import types

    from mcpd.policy.workers import _forget

    ours, theirs = socket.socketpair()
    w = Worker(pid=42, pidfd=-1, owner=("alice", "alice"), ctl=ours)
    state: Any = types.SimpleNamespace(lock=threading.Lock(), workers={42: w}, exited=collections.OrderedDict())
    try:
        assert _forget(state, w) is True
        assert _forget(state, w) is False  # the second caller closes nothing
        assert state.workers == {} and state.exited[42] == ("alice", "alice")
        state.workers[42] = Worker(pid=42, pidfd=-1, owner=("bob", "bob"), ctl=theirs)  # the pid reused since
        assert _forget(state, w) is False  # an old Worker never forgets its successor
    finally:
        ours.close()
        theirs.close()


def test_reaping_while_a_kill_on_another_thread_closed_a_pidfd_never_raises() -> None:
    """Attack 13c (the accept loop's end, low likelihood): ``reap`` took its list of workers, then
    a kill on another thread (the revocation sweep's, a front's kill request, a late answer's)
    forgot one and closed its pidfd before ``reap`` looked at them: ``select`` raised ``EBADF``
    out of ``reap``, which the policy process's accept loop calls unguarded, ending it."""
    import os
    import types
    from typing import cast

    from mcpd.policy.state import State
    from mcpd.policy.workers import reap

    ours, theirs = socket.socketpair()
    r, w = os.pipe()
    os.close(w)
    os.close(r)  # (a number no longer open: as a pidfd closed by that kill)
    worker = Worker(pid=1, pidfd=r, owner=("alice", "alice"), ctl=ours)
    records: list[Any] = []
    state = types.SimpleNamespace(workers={1: worker}, lock=threading.Lock(), exited={},
                                  audit=types.SimpleNamespace(record=lambda *a, **k: records.append(a)))
    try:
        reap(cast(State, state))  # the list was taken before the kill forgot the worker
    finally:
        ours.close()
        theirs.close()
    assert records == []


def test_reaping_sees_an_ended_worker_whose_pidfd_number_is_past_1024() -> None:
    """``reap`` looks at every worker's pidfd whatever its number: ``select`` refuses descriptors
    past 1023 (``ValueError``), which a policy process with many workers' descriptors open
    reaches; its ended workers were then never forgotten."""
    import os
    import resource
    import subprocess
    import types
    from typing import cast

    from mcpd.policy.state import State
    from mcpd.policy.workers import reap

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2048:
        pytest.skip("needs 2048 descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    child = subprocess.Popen(["true"])
    pidfd = os.pidfd_open(child.pid)
    high = os.dup2(pidfd, 1500)
    os.close(pidfd)
    child.wait()
    ours, theirs = socket.socketpair()
    worker = Worker(pid=child.pid, pidfd=high, owner=("alice", "alice"), ctl=ours)
    records: list[Any] = []
    state = types.SimpleNamespace(workers={child.pid: worker}, lock=threading.Lock(), exited={},
                                  audit=types.SimpleNamespace(record=lambda *a, **k: records.append((a, k))))
    try:
        reap(cast(State, state))
    finally:
        theirs.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert state.workers == {} and state.exited == {child.pid: ("alice", "alice")}
    assert [a[0] for a, _ in records] == ["exit"]
    with pytest.raises(OSError):
        os.fstat(high)  # reap closed it
