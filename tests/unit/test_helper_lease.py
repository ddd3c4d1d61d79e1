"""The front's share of its connections to the root helper (``PolicyChannel.lease``), as
``PolicyBackend`` answers a call that cannot get one: a walk past its principal's share is refused
``RATE_LIMITED`` at once, a read waits and ends ``TIMEOUT``; each counts under its own limit kind.
No helper is needed: a call that gets no connection never reaches one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mcpd.common.identity import Principal
from mcpd.front import metrics
from mcpd.front.policy_client import backend as backend_module
from mcpd.front.policy_client.backend import PolicyBackend
from mcpd.front.policy_client.channel import CALL_CONNECTIONS, CALL_SHARE, PolicyChannel
from mcpd.helper.wire.errors import RATE_LIMITED, TIMEOUT, ToolError

ALICE = Principal(name="alice", os_user="alice", token_id="0123456789ab")


def hits(kind: str) -> float:
    return float(metrics.LIMITS_HIT.labels(kind)._value.get())


def backend(tmp_path: Path) -> tuple[PolicyChannel, PolicyBackend]:
    channel = PolicyChannel(str(tmp_path / "no-helper.sock"), reply_cap=1 << 20)
    return channel, PolicyBackend(channel, pool=None, timeout=0.0)  # type: ignore[arg-type]  # never reached


def call(b: PolicyBackend, op: str) -> ToolError:
    with pytest.raises(ToolError) as info:
        asyncio.run(b.call("mcpd_0123456789ab_" + "x" * 43, ALICE, "s" * 32, "127.0.0.1", op, {"path": "/etc/hostname"}))
    return info.value


def test_a_walk_past_the_principals_share_is_refused_at_once(tmp_path: Path) -> None:
    channel, b = backend(tmp_path)
    for _ in range(CALL_SHARE):  # alice's hung walks hold her whole share
        channel.calls.add("alice")
    before = hits("privileged_per_principal")
    err = call(b, "files/find")
    assert err.code == RATE_LIMITED and "share" in err.message
    assert hits("privileged_per_principal") == before + 1


@pytest.mark.parametrize("own", [True, False])
def test_a_read_that_gets_no_connection_in_its_time_ends_timeout_and_is_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own: bool) -> None:
    monkeypatch.setattr(backend_module, "DEADLINE_MARGIN", 0.05)  # the call's wait: 0.1 s, not 10
    channel, b = backend(tmp_path)
    for i in range(CALL_SHARE if own else CALL_CONNECTIONS):  # alice's own calls, or others' calls hold every one
        channel.calls.add("alice" if own else f"other{i}")
    before = hits("helper_connections")
    err = call(b, "files/read")
    assert err.code == TIMEOUT
    assert ("its share" in err.message) is own and (f"all {CALL_CONNECTIONS}" in err.message) is not own
    assert hits("helper_connections") == before + 1
    assert channel.calls.held("alice") == (CALL_SHARE if own else 0)  # the wait took nothing
