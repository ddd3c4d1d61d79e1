"""Attack 14 on today's changes (token-tagged pool, cancel grace, the total outgoing budget's
rule, idle-session eviction). Each test names the rule it checks and the severity of its flaw.

The flaws found are in :class:`mcpd.front.sessions.table.SessionManager`'s bookkeeping, which the
daemon drives from its event loop; they are shown on the manager itself, deterministically (on a
daemon they depend on when a dropped connection's writer next runs)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from mcpd.common.config import Config
from mcpd.common.identity import Principal
from mcpd.front.mcp.dispatcher import Dispatcher
from mcpd.front.sessions.table import SessionManager, SessionRefused
from mcpd.front.transport.answers import PostStream
from tests.conftest import Daemon
from tests.support.workers import slow_file
from tests.support.streamable import INIT, client, hdrs, open_session

KIB = 1024

pytestmark = pytest.mark.anyio


def manager(**cfg: object) -> SessionManager:
    return SessionManager(Config(**cfg), Dispatcher(pool=None, privileged=None))  # type: ignore[arg-type]


def test_a_cut_answer_still_being_released_does_not_get_a_second_principal_cut() -> None:
    """Rule (docs/REFERENCE.md §1.6 outgoing budgets; INTERNALS: past the total, the principal holding the
    most gives up its bytes, so stallers filling the total lose theirs rather than a reader charged
    next). Severity: medium (an innocent principal's answers are dropped).

    An answer being written (``PiecedAnswer``) that the total's rule cuts is released only when its
    writer runs again (its connection's abort takes effect on a later loop turn). Until then it
    still counts as held by its principal, so the next charge that passes the total "cuts" that
    principal again (giving up nothing) and then cuts the next largest holder, though once the
    first cut's bytes are released the total is far under the budget."""
    m = manager(principal_queue_bytes=1024 * KIB, total_queue_bytes=120 * KIB)
    cut: list[str] = []
    assert m.hold_answer("v1", 60 * KIB, lambda: cut.append("v1")) is None
    assert m.hold_answer("v2", 50 * KIB, lambda: cut.append("v2")) is None
    mallory = lambda: cut.append("mallory")  # noqa: E731
    assert m.hold_answer("mallory", 20 * KIB, mallory) is None  # 130 KiB > 120: v1, holding most, is cut
    assert cut == ["v1"]
    # (v1's writer has not run yet: its 60 KiB are still counted)
    assert m.hold_answer("mallory", 5 * KIB, mallory) is None  # 75 KiB once v1's are released
    assert cut == ["v1"], "a second principal was cut while the first cut's bytes were being released"


def test_a_principal_refused_for_its_own_cap_evicts_no_one_elses_session() -> None:
    """Rule (docs/REFERENCE.md §1.5 session caps; the eviction: at a full cap, an idle ``/mcp`` session makes
    room *for a new session*). Severity: low-medium (a principal at its own cap closes another
    principal's idle session and still gets 429: the victim loses its session for nothing, its
    client's next request is 404).

    ``SessionManager.open`` checks ``max_sessions`` first and evicts anyone's idle session to
    make room, then refuses the caller for ``max_sessions_per_principal``."""
    m = manager(max_sessions=2, max_sessions_per_principal=1, mcp_session_evict_seconds=60.0)
    victim = m.open(Principal("bob", "bob", "t2"), kind="mcp")
    victim.last_active -= 120  # idle two minutes: the client comes back later
    m.open(Principal("mallory", "mallory", "t3"), kind="mcp")  # in use
    with pytest.raises(SessionRefused) as refused:
        m.open(Principal("mallory", "mallory", "t3"), kind="mcp")
    assert refused.value.status in (429, 503)
    assert not victim.closed, "bob's idle session was closed to make room for a session refused anyway"


async def test_on_a_daemon_a_principal_at_its_cap_does_not_evict_anothers_idle_session(
        daemon_factory: Callable[..., Daemon]) -> None:
    """The same rule on a daemon (severity low-medium): ``max_sessions`` 2, one per principal,
    eviction after 1 s. Bob's session idles; alice, holding her one, asks for another at the full
    total: she is refused, and bob's session must still answer (before the fix it was closed to
    make room and his next request got 404)."""
    d = daemon_factory(max_sessions=2, max_sessions_per_principal=1, mcp_session_evict_seconds=1)
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with client(d) as c:
        bobs = await open_session(c, d, token=d.other_token)
        await asyncio.sleep(1.5)
        await open_session(c, d)
        r = await c.post("/mcp", json=INIT, headers=hdrs(d))
        assert r.status_code in (429, 503)
        r = await c.post("/mcp", json=ping, headers=hdrs(d, bobs, token=d.other_token))
        assert r.status_code == 200, "bob's idle session was evicted for a session that was refused"


async def test_a_session_whose_request_just_ended_is_not_evicted_as_idle(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """Rule (the eviction: a ``/mcp`` session with no request for ``mcp_session_evict_seconds``
    makes room at a full cap). Severity: low (a client that just got its answer loses its
    session; its next request is 404). Idleness was counted from the request's start, so a request
    that ran longer than the threshold (here a read cut by a 2 s worker deadline; a ``files/find``
    may run 60 s, the default threshold) left its session evictable the moment it was answered."""
    d = daemon_factory(max_sessions=1, mcp_session_evict_seconds=1, workers={"timeout_seconds": 2})
    path = slow_file(tmp_path)
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    slow = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "files/read", "arguments": {"path": str(path), "start_line": 3}}}
    async with client(d) as c:
        sid = await open_session(c, d)
        r = await c.post("/mcp", json=slow, headers=hdrs(d, sid))  # about 2 s, then TIMEOUT
        assert r.status_code == 200 and "TIMEOUT" in r.text, r.text
        await c.post("/mcp", json=INIT, headers=hdrs(d, token=d.other_token))  # bob, at the full total
        r = await c.post("/mcp", json=ping, headers=hdrs(d, sid))
        assert r.status_code == 200, "a session answered a moment ago was evicted as idle"


def test_a_cut_post_stream_counts_once_as_given_up() -> None:
    """Rule (the total's rule stops cutting once the total is under ``total_queue_bytes``).
    Severity: low (the total's rule stopped early, the total left passed). A POST event stream's
    cut releases its bytes at once (it closes); :meth:`SessionManager.cut` counted them a second
    time as released later by their writer, so ``still_over`` thought twice as much given up."""
    m = manager(principal_queue_bytes=1024 * KIB, total_queue_bytes=1024 * KIB, session_queue_bytes=1024 * KIB)
    stream = PostStream(100, 1024 * KIB, manager=m, owner="v1")
    stream.put({"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x" * (60 * KIB)}})
    held = m.outgoing.held("v1")
    assert held > 60 * KIB
    assert m.cut("v1", "queue_bytes_total") == held
    assert m.outgoing.total == 0 and stream.overflowed
