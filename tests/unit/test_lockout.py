"""Unit tests of the login lockout (SPEC §5.2; issue 5): slowed, then locked, then recovered,
per key, without touching other keys. A fake clock stands in for time: nothing sleeps."""

from __future__ import annotations

import threading

from mcpd.helper.lockout import Lockout, LockoutPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


POLICY = LockoutPolicy(free_failures=2, base_delay=0.5, max_delay=2.0, max_failures=5, lock_seconds=60.0)


def make() -> tuple[Lockout, Clock]:
    clock = Clock()
    return Lockout(POLICY, clock), clock


def test_repeated_failures_are_slowed_with_a_growing_delay() -> None:
    lock, _ = make()
    keys = ["user:alice", "peer:10.0.0.1"]
    delays = []
    for _ in range(4):
        delays.append(lock.delay_for(keys))
        lock.failure(keys)
    assert delays == [0.0, 0.0, 0.5, 1.0]
    assert lock.delay_for(keys) == 2.0


def test_delay_is_capped_at_max_delay() -> None:
    lock = Lockout(LockoutPolicy(free_failures=0, base_delay=1.0, max_delay=3.0, max_failures=100), Clock())
    for _ in range(10):
        lock.failure(["k"])
    assert lock.delay_for(["k"]) == 3.0


def test_lockout_after_max_failures_and_recovery_after_the_window() -> None:
    lock, clock = make()
    keys = ["user:alice", "peer:10.0.0.1"]
    for _ in range(5):
        assert lock.locked(keys) == 0.0
        lock.failure(keys)
    assert lock.locked(keys) == 60.0
    clock.now += 30
    assert lock.locked(["user:alice"]) == 30.0
    clock.now += 30
    assert lock.locked(keys) == 0.0
    assert lock.delay_for(keys) == 0.0  # forgotten, not merely unlocked


def test_lockout_of_one_user_leaves_other_users_unaffected() -> None:
    lock, _ = make()
    for _ in range(5):
        lock.failure(["user:alice", "peer:10.0.0.1"])
    assert lock.locked(["user:alice", "peer:10.0.0.2"]) > 0
    assert lock.locked(["user:bob", "peer:10.0.0.2"]) == 0.0
    assert lock.delay_for(["user:bob", "peer:10.0.0.2"]) == 0.0


def test_lockout_per_address_catches_many_accounts_from_one_address() -> None:
    lock, _ = make()
    for i in range(5):
        lock.failure([f"user:u{i}", "peer:10.0.0.9"])
    assert lock.locked(["user:fresh", "peer:10.0.0.9"]) > 0
    assert lock.locked(["user:fresh", "peer:10.0.0.8"]) == 0.0


def test_success_clears_the_user_key() -> None:
    lock, _ = make()
    for _ in range(4):
        lock.failure(["user:alice"])
    lock.success(["user:alice"])
    assert lock.delay_for(["user:alice"]) == 0.0


def test_table_is_bounded() -> None:
    lock = Lockout(LockoutPolicy(max_keys=10), Clock())
    for i in range(100):
        lock.failure([f"user:u{i}"])
    assert len(lock) == 10


def test_lockout_state_is_safe_under_threads() -> None:
    lock, _ = make()
    threads = [threading.Thread(target=lambda: [lock.failure(["user:t"]) for _ in range(100)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert lock.locked(["user:t"]) == 60.0
