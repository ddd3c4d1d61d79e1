"""Recovery in seconds, not a throttle: SIGKILL of the policy process, and
separately of the root helper, while sessions read in a bounded loop on both routes.

The helper is restarted as its supervisor would (systemd's ``Restart=on-failure``, or ``mcpd
dev``'s watcher): by a thread here that starts a new one as soon as the old one has exited
(after ``MCPD_RESTART_DELAY`` seconds, default 0; ``mcpd dev`` waits 1). Then:

- every read that arrives 3 s or more after the kill succeeds, unprivileged and privileged (on a
  machine so loaded that the new helper took longer than 2 s to start: 1 s after it is back);
- no ``RATE_LIMITED`` at all: the reads that failed while the helper was down, and the workers
  started again afterwards to replace those lost with it, cost nothing of the principal's spawn
  bucket (the front's nor the policy process's);
- the account's workers are back to their number within 5 s of the kill (or as much later as the
  helper was).

And a start root refuses costs no token either: a principal bound to an account in group 0 is
refused PERMISSION_DENIED on every call, however many, never RATE_LIMITED.

Each run prints its fault figures (reads in the window, failures, failures 1 s and 3 s or more
after the kill, ``RATE_LIMITED`` answers, seconds until the helper and the pool were back):
``pytest tests/integration/test_helper_recovery.py -s``. Root only.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import pwd
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mcpd.client.api import Client, MCPClientError
from mcpd.common.config import POLICY_USER
from tests.support.osaccounts import AccountFactory
from tests.support.privsep_fixture import LOG_TEXT, PrivsepDaemon, children, proc_status, start_privsep, stop_privsep

pytestmark = pytest.mark.root

CALL_TIMEOUT = 30.0
BEFORE_SECONDS = 2.0  # reading before the kill (the pool fills)
AFTER_SECONDS = 10.0  # reading after it
PER_ACCOUNT = 4  # workers.per_account of the fixture's daemon
UNPRIVILEGED_SESSIONS = 4  # alice's, each reading in a loop (with the privileged ones, more than her workers)
PRIVILEGED_SESSIONS = 2
SETTLED = 3.0  # seconds after the kill from which every read must succeed
POOL_BACK = 5.0  # seconds after the kill by which the account's workers are back to their number
#: seconds the supervisor waits before it starts the helper again (systemd's RestartSec=; ``mcpd
#: dev`` waits 1 s): 0 here, so the settling time is not eaten by the wait on a loaded machine
RESTART_DELAY = float(os.environ.get("MCPD_RESTART_DELAY", "0"))


@dataclasses.dataclass
class Read:
    sent: float  # time.monotonic() when the call was sent
    code: str  # "ok" or the tool error's code (or the client's exception name)
    privileged: bool


@dataclasses.dataclass
class Figures:
    reads: int = 0  # sent after the kill
    failed: int = 0
    failed_after_1s: int = 0
    failed_after_3s: int = 0
    sent_after_1s: int = 0
    rate_limited: int = 0
    helper_back: float | None = None  # seconds from the kill until the new helper's socket was there
    pool_back: float | None = None  # seconds until the account's workers were as many as before
    codes: dict[str, int] = dataclasses.field(default_factory=dict)

    def line(self, what: str) -> str:
        return (f"{what}: {self.reads} reads after the kill, {self.failed} failed, {self.failed_after_1s} of "
                f"{self.sent_after_1s} sent >= 1 s after it failed, {self.failed_after_3s} >= 3 s; "
                f"{self.rate_limited} RATE_LIMITED; helper back in {self.helper_back} s, pool back in "
                f"{self.pool_back} s; codes {self.codes}")


class Supervisor:
    """Start the helper again as soon as it has exited (as systemd or ``mcpd dev`` would), until
    :meth:`stop`; :attr:`restarted` holds the monotonic time each new helper's socket appeared."""

    def __init__(self, d: PrivsepDaemon) -> None:
        self.d = d
        self.restarted: list[float] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stopping.is_set():
            helper = self.d.helper
            assert helper is not None
            try:
                helper.wait(timeout=0.2)
            except subprocess.TimeoutExpired:  # still running
                continue
            if self._stopping.wait(RESTART_DELAY):
                return
            self.d.start_helper()
            self.restarted.append(time.monotonic())

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=30)


def uid_pids(uid: int) -> list[int]:
    """Every live (not zombie) process whose real uid is ``uid`` (the account's workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                st = proc_status(int(entry))
                if st["Uid"].split()[0] == str(uid) and not st["State"].startswith("Z"):
                    found.append(int(entry))
            except (OSError, KeyError):
                pass
    return found


async def _reader(d: PrivsepDaemon, path: Path, privileged: bool, until: float, out: list[Read]) -> None:
    async with Client(d.url, d.tokens["alice"], d.cacert, timeout=CALL_TIMEOUT) as c:
        while time.monotonic() < until:
            sent = time.monotonic()
            try:
                res = await c.call_tool("files/read", {"path": str(path), "privileged": privileged}, check=False)
            except MCPClientError as exc:
                code = type(exc).__name__
            else:
                if res.get("isError"):
                    code = res["structuredContent"]["error"]["code"]
                else:
                    code = "ok" if res["content"][0]["text"] == LOG_TEXT else "WRONG_TEXT"
            out.append(Read(sent, code, privileged))


def run_fault(d: PrivsepDaemon, public: Path, kill: Callable[[], None]) -> tuple[Figures, list[Read], float]:
    """Read in a loop on every session, call ``kill`` after :data:`BEFORE_SECONDS`, go on for
    :data:`AFTER_SECONDS`; returns the figures, every read, and the kill's time."""
    alice = d.accounts["alice"].uid
    reads: list[Read] = []
    figures = Figures()
    supervisor = Supervisor(d)
    try:
        async def go() -> float:
            start = time.monotonic()
            until = start + BEFORE_SECONDS + AFTER_SECONDS
            tasks = [asyncio.create_task(_reader(d, public, False, until, reads)) for _ in range(UNPRIVILEGED_SESSIONS)]
            tasks += [asyncio.create_task(_reader(d, d.log_file, True, until, reads))
                      for _ in range(PRIVILEGED_SESSIONS)]
            await asyncio.sleep(BEFORE_SECONDS)
            # the pool's size: per_account workers (more sessions than that read at once); a
            # worker being replaced this moment may be counted too
            before = min(len(uid_pids(alice)), PER_ACCOUNT)
            assert before == PER_ACCOUNT, uid_pids(alice)
            kill()
            killed = time.monotonic()
            while figures.pool_back is None and time.monotonic() < until:  # bounded by the run
                await asyncio.sleep(0.05)
                if supervisor.restarted and len(uid_pids(alice)) >= before:
                    figures.pool_back = round(time.monotonic() - killed, 2)
            await asyncio.gather(*tasks)
            return killed

        killed = asyncio.run(go())
    finally:
        supervisor.stop()
    if supervisor.restarted:
        figures.helper_back = round(supervisor.restarted[0] - killed, 2)
    after = [r for r in reads if r.sent >= killed]
    figures.reads = len(after)
    figures.failed = sum(r.code != "ok" for r in after)
    figures.sent_after_1s = sum(r.sent >= killed + 1 for r in after)
    figures.failed_after_1s = sum(r.code != "ok" and r.sent >= killed + 1 for r in after)
    figures.failed_after_3s = sum(r.code != "ok" and r.sent >= killed + SETTLED for r in after)
    figures.rate_limited = sum(r.code == "RATE_LIMITED" for r in reads)
    figures.codes = dict(collections.Counter(r.code for r in after))
    return figures, reads, killed


@pytest.fixture
def daemon() -> Iterator[tuple[PrivsepDaemon, Path]]:
    if os.geteuid() != 0:
        pytest.skip("needs root: starts the root helper and creates OS accounts")
    factory = AccountFactory()
    d = start_privsep(factory)
    public = d.srv / "public.txt"
    public.write_text(LOG_TEXT)
    os.chmod(public, 0o644)
    try:
        yield d, public
    finally:
        stop_privsep(d)
        factory.cleanup()


def policy_pid(d: PrivsepDaemon) -> int:
    uid = pwd.getpwnam(POLICY_USER).pw_uid
    found = children(d.helper_pid, uid)
    assert len(found) == 1, found
    return found[0]


def check(figures: Figures, reads: list[Read], killed: float) -> None:
    """The rules of the module docstring. What they measure is the front's recovery, not how long
    a new helper takes to start: on a machine so loaded that the new helper's socket took more
    than ``SETTLED - 1`` s to appear, both bounds count from its return instead (1 s for the reads,
    ``POOL_BACK - SETTLED + 1`` s for the pool)."""
    assert figures.helper_back is not None, figures.line("figures")
    settled = max(SETTLED, figures.helper_back + 1.0)
    late = [(round(r.sent - killed, 2), r.privileged, r.code) for r in reads
            if r.code != "ok" and r.sent >= killed + settled]
    assert late == [], (figures.line("figures"), late[:20])
    assert figures.rate_limited == 0, figures.line("figures")
    for privileged in (False, True):  # both routes were read after the settling time, and succeeded
        assert any(r.sent >= killed + settled and r.privileged is privileged and r.code == "ok" for r in reads)
    assert figures.pool_back is not None and figures.pool_back <= settled + POOL_BACK - SETTLED, \
        figures.line("figures")


def test_a_killed_policy_process_costs_reads_only_the_restart(daemon: tuple[PrivsepDaemon, Path]) -> None:
    d, public = daemon
    figures, reads, killed = run_fault(d, public, lambda: os.kill(policy_pid(d), signal.SIGKILL))
    print("\n" + figures.line("SIGKILL of the policy process"))
    check(figures, reads, killed)


def test_a_killed_root_helper_costs_reads_only_the_restart(daemon: tuple[PrivsepDaemon, Path]) -> None:
    d, public = daemon
    figures, reads, killed = run_fault(d, public, lambda: os.kill(d.helper_pid, signal.SIGKILL))
    print("\n" + figures.line("SIGKILL of the root helper"))
    check(figures, reads, killed)


def test_workers_root_refuses_cost_no_spawn_token_in_the_front_or_the_policy_process() -> None:
    """A principal bound to an account root refuses workers for (a member of group 0): each call
    asks for a worker and is refused PERMISSION_DENIED by root; more calls than both spawn
    buckets hold (the front's 16, the policy process's 32) are each refused so, never
    RATE_LIMITED, since nothing was started."""
    if os.geteuid() != 0:
        pytest.skip("needs root: starts the root helper and creates OS accounts")
    from mcpd.common import identity

    factory = AccountFactory()
    d = start_privsep(factory)
    try:
        wheel = factory.user(groups=("root",))
        users_file = d.state_dir / "users.yaml"
        users = identity.load_users(users_file)
        token, record = identity.new_token()
        users["wheel"] = identity.UserRecord(name="wheel", os_user=wheel.name, tokens=[record])
        identity.save_users(users_file, users)
        calls = 2 * 2 * 16 + 8  # past the policy process's bucket (twice the front's burst, 16)

        async def go() -> list[tuple[str, str | None]]:
            async with Client(d.url, token, d.cacert, timeout=CALL_TIMEOUT) as c:
                out = []
                for _ in range(calls):
                    res = await c.call_tool("files/read", {"path": "/etc/hostname"}, check=False)
                    err = res["structuredContent"]["error"]
                    out.append((err["code"], err["details"].get("reason")))
                return out

        got = asyncio.run(go())
        assert collections.Counter(got) == {("PERMISSION_DENIED", "root account"): calls}, collections.Counter(got)
    finally:
        stop_privsep(d)
        factory.cleanup()
