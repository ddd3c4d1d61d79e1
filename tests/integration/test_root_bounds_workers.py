"""Root keeps its own bound on the workers it starts (docs/PRIVSEP.md section 3, ``spawn``).

The policy process bounds spawns per principal (a token bucket, and ``SPAWN_FACTOR x
per_account`` alive) so that a compromised front cannot fork without end; root must not rely on
it: code as ``mcpd-policy`` on root's channel (or a helper started by hand, where no unit caps
tasks) asking root's ``spawn`` again and again got as many interpreters as it asked for (40 of
40 for one account, 524 MiB). Root counts its children itself: at most
``ACCOUNT_FACTOR x workers.per_account`` (64 here: four principals sharing an account at their
policy bound) workers alive for one account and
:data:`~mcpd.helper.monitor.CHILDREN` workers and walkers in all; past that a spawn is refused
``busy``, and a kill makes room again.
"""

from __future__ import annotations

import os

import pytest

from mcpd.helper.monitor import ACCOUNT_FACTOR
from tests.support.privsep_fixture import PrivsepDaemon, privsep_daemon  # noqa: F401  (fixture)
from tests.support.root_channels import as_policy

pytestmark = pytest.mark.root
N = 70  # spawns asked for one account: past root's bound (bounded: the machine is shared)
PER_ACCOUNT = 4  # workers.per_account of the fixture's mcpd.yaml


def test_root_bounds_the_workers_one_account_may_have(privsep_daemon: PrivsepDaemon) -> None:  # noqa: F811
    """Code as ``mcpd-policy`` asks for 70 workers as bob: at most 64 start, the rest are refused
    ``busy``; alice still gets one meanwhile, and once one of bob's is killed bob gets one again."""
    d = privsep_daemon
    made: list[tuple[int, list[int]]] = []
    refused: list[dict[str, object]] = []
    bound = ACCOUNT_FACTOR * PER_ACCOUNT
    with as_policy(d) as root:
        try:
            for _ in range(N):
                reply, fds = root.ask("spawn", user=d.accounts["bob"].name, limits="{}")
                if reply["ok"]:
                    made.append((reply["pid"], fds))
                else:
                    refused.append(reply["error"])
            assert 0 < len(made) <= bound, f"root started {len(made)} workers for one account on request"
            assert len(refused) == N - len(made) and {e["details"]["reason"] for e in refused} == {"busy"}, refused
            reply, fds = root.ask("spawn", user=d.accounts["alice"].name, limits="{}")  # another account: served
            assert reply["ok"] is True, reply
            made.append((reply["pid"], fds))
            assert root.ask("spawn", user=d.accounts["bob"].name, limits="{}")[0]["ok"] is False  # bob: still full
            pid, fds = made.pop(0)  # one of bob's
            root.ask("kill", pid=pid)
            for fd in fds:
                os.close(fd)
            reply, fds = root.ask("spawn", user=d.accounts["bob"].name, limits="{}")  # room again
            assert reply["ok"] is True, reply
            made.append((reply["pid"], fds))
        finally:
            for pid, fds in made:
                root.ask("kill", pid=pid)
                for fd in fds:
                    os.close(fd)
