"""Which idle Streamable HTTP session makes room at a full cap (``mcp_session_evict_seconds``,
:meth:`mcpd.front.sessions.table.SessionManager.evict_idle`): only a ``/mcp`` one with no GET
stream and no request in flight, idle at least that long, the longest idle first, of the same
principal for its own cap. The daemon-level behaviour (404 for the evicted client, 429 when none
qualifies) is tested in tests/integration/test_streamable.py."""

from __future__ import annotations

import asyncio

import pytest

from mcpd.common.config import Config, ConfigError, from_dict
from mcpd.common.identity import Principal
from mcpd.front.mcp.dispatcher import Dispatcher
from mcpd.front.sessions.table import SessionManager, SessionRefused
from tests.support.sessions import manager as session_table

ALICE, BOB = Principal("alice", "alice", "t1"), Principal("bob", "bob", "t2")


def manager(per_principal: int = 3, total: int = 100, evict: float = 60.0) -> SessionManager:
    return SessionManager(Config(max_sessions=total, max_sessions_per_principal=per_principal,
                                 mcp_session_evict_seconds=evict),
                          Dispatcher(pool=None, privileged=None))  # type: ignore[arg-type]


def aged(m: SessionManager, who: Principal, seconds: float, kind: str = "mcp") -> str:
    s = m.open(who, kind=kind)
    s.last_active -= seconds
    return s.id


def live(m: SessionManager) -> set[str]:
    return {s.id for s in m.sessions()}


def test_the_longest_idle_of_the_principal_goes_first_and_only_past_the_threshold() -> None:
    m = manager()
    a = aged(m, ALICE, 100)
    b = aged(m, ALICE, 200)
    c = aged(m, ALICE, 30)  # idle, but not long enough
    bob = aged(m, BOB, 1000)
    m.open(ALICE, kind="mcp")
    assert b not in live(m) and {a, c, bob} <= live(m)
    new = live(m) - {a, c, bob}
    m.open(ALICE, kind="mcp")
    assert a not in live(m) and bob in live(m) and c in live(m)
    with pytest.raises(SessionRefused) as refused:
        m.open(ALICE, kind="mcp")  # c and the two new ones: none idle 60 s
    assert refused.value.status == 429
    assert new <= live(m)


def test_streams_requests_in_flight_and_sse_sessions_are_never_evicted() -> None:
    async def go() -> None:
        m = manager(per_principal=3)
        sse = aged(m, ALICE, 1000, kind="sse")
        streaming = m.open(ALICE, kind="mcp")
        streaming.last_active -= 1000
        streaming.stream_open = True
        busy = m.open(ALICE, kind="mcp")
        busy.last_active -= 1000
        task = asyncio.get_running_loop().create_future()
        busy.protocol._tasks[task] = None  # type: ignore[index]  # a request in flight
        with pytest.raises(SessionRefused):
            m.open(ALICE, kind="mcp")
        assert live(m) == {sse, streaming.id, busy.id}
        del busy.protocol._tasks[task]  # type: ignore[arg-type]
        m.open(ALICE, kind="sse")  # the /mcp session that is idle now makes room, for /sse too
        assert busy.id not in live(m) and busy.closed
    asyncio.run(go())


def test_the_total_cap_evicts_anyones_and_zero_turns_eviction_off() -> None:
    m = manager(per_principal=10, total=2)
    old = aged(m, BOB, 120)
    aged(m, BOB, 10)
    m.open(ALICE, kind="mcp")
    assert old not in live(m) and len(m) == 2
    off = manager(per_principal=1, evict=0)
    aged(off, ALICE, 10 ** 6)
    with pytest.raises(SessionRefused):
        off.open(ALICE, kind="mcp")


@pytest.mark.parametrize("value", [-1, float("nan")])
def test_a_negative_or_nan_threshold_is_refused(value: float) -> None:
    with pytest.raises(ConfigError, match="mcp_session_evict_seconds"):
        from_dict({"mcp_session_evict_seconds": value})


def test_a_principal_refused_for_its_own_cap_evicts_no_one_elses_session() -> None:
    """Rule (docs/REFERENCE.md §1.5 session caps; the eviction: at a full cap, an idle ``/mcp`` session makes
    room *for a new session*). Severity: low-medium (a principal at its own cap closes another
    principal's idle session and still gets 429: the victim loses its session for nothing, its
    client's next request is 404).

    ``SessionManager.open`` checks ``max_sessions`` first and evicts anyone's idle session to
    make room, then refuses the caller for ``max_sessions_per_principal``."""
    m = session_table(max_sessions=2, max_sessions_per_principal=1, mcp_session_evict_seconds=60.0)
    victim = m.open(Principal("bob", "bob", "t2"), kind="mcp")
    victim.last_active -= 120  # idle two minutes: the client comes back later
    m.open(Principal("mallory", "mallory", "t3"), kind="mcp")  # in use
    with pytest.raises(SessionRefused) as refused:
        m.open(Principal("mallory", "mallory", "t3"), kind="mcp")
    assert refused.value.status in (429, 503)
    assert not victim.closed, "bob's idle session was closed to make room for a session refused anyway"
