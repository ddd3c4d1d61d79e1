"""How the session table counts a cut answer: an answer still being released after its cut
is not cut a second time for another principal, and a cut POST stream counts once as given up.
Shown on :class:`mcpd.front.sessions.table.SessionManager` itself, deterministically (on a
daemon they depend on when a dropped connection's writer next runs)."""

from __future__ import annotations

import pytest

from mcpd.front.transport.answers import PostStream
from tests.support.sessions import manager

KIB = 1024

pytestmark = pytest.mark.anyio


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
