"""Config values a client's requests depend on are checked when the daemon starts: a ``base_path``
whose advertised endpoint could not work, and a non-positive header size cap, stop it there."""

from __future__ import annotations

import pytest

from mcpd.common.config import ConfigError, from_dict


@pytest.mark.parametrize("base", ["/files", "/a/b-c_d.e~f", "/x/.well-known", "/a..b"])
def test_plain_base_paths_are_accepted(base: str) -> None:
    assert from_dict({"base_path": base}).base_path == base


@pytest.mark.parametrize("base", ["/a%20b", "/a b", "/a//b", "/..", "/a/./b", "/.well-known", "/.WELL-KNOWN/x",
                                  "/a{b}", "/a?b", "/a#b", "files", "/files/"])
def test_base_paths_the_server_could_not_serve_as_advertised_are_refused(base: str) -> None:
    with pytest.raises(ConfigError, match="base_path"):
        from_dict({"base_path": base})


@pytest.mark.parametrize("value", [0, -1])
def test_the_header_size_cap_must_be_positive(value: int) -> None:
    with pytest.raises(ConfigError, match="max_header_bytes"):
        from_dict({"connections": {"max_header_bytes": value}})
    assert from_dict({}).connections.max_header_bytes == 65536


@pytest.mark.parametrize(("workers", "match"), [
    ({"spawns_per_second": 0}, "spawns_per_second"),
    ({"spawns_per_second": -1}, "spawns_per_second"),
    ({"spawns_per_second": float("nan")}, "expected a number"),
    ({"spawn_burst": 0}, "spawn_burst"),
    ({"spawn_burst": 3}, "spawn_burst: must be at least workers.per_account"),
    ({"per_account": 20}, "spawn_burst: must be at least workers.per_account"),
])
def test_the_worker_start_bucket_needs_a_rate_and_room_for_an_accounts_first_calls(
        workers: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        from_dict({"workers": workers})
    w = from_dict({}).workers
    assert (w.spawn_burst, w.spawns_per_second) == (16, 1.0) and w.spawn_burst >= w.per_account
    assert from_dict({"workers": {"per_account": 20, "spawn_burst": 20}}).workers.spawn_burst == 20


@pytest.mark.parametrize("key", ["principal_queue_bytes", "total_queue_bytes"])
@pytest.mark.parametrize("value", [0, -1])
def test_the_outgoing_byte_budgets_must_be_positive(key: str, value: int) -> None:
    with pytest.raises(ConfigError, match=key):
        from_dict({key: value})
    cfg = from_dict({})
    assert (cfg.principal_queue_bytes, cfg.total_queue_bytes) == (128 * 1024 * 1024, 512 * 1024 * 1024)


@pytest.mark.parametrize(("workers", "match"), [
    ({"cancel_grace_seconds": -0.1}, "cancel_grace_seconds: must be 0"),
    ({"cancel_grace_seconds": float("nan")}, "expected a number"),
    ({"cancel_grace_seconds": float("inf")}, "cancel_grace_seconds: must be 0"),
    ({"cancel_grace_seconds": 61}, "cancel_grace_seconds: must be 0"),
    ({"cancel_grace_seconds": "0.25"}, "expected a number"),
])
def test_the_cancel_grace_is_a_number_from_zero_to_sixty(workers: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        from_dict({"workers": workers})
    assert from_dict({}).workers.cancel_grace_seconds == 0.25
    assert from_dict({"workers": {"cancel_grace_seconds": 0}}).workers.cancel_grace_seconds == 0.0
    assert from_dict({"workers": {"cancel_grace_seconds": 10}}).workers.cancel_grace_seconds == 10.0
    # past workers.timeout_seconds is allowed: the grace never runs past a call's own deadline
    # (a find's time budget may exceed it; a short timeout_seconds must not refuse the default grace)
    short = from_dict({"workers": {"timeout_seconds": 0.05}})
    assert short.workers.cancel_grace_seconds == 0.25



@pytest.mark.parametrize("tasks", [
    {"max_per_principal": 0},
    {"default_ttl_seconds": 0},
    {"default_ttl_seconds": 4000},  # past max_ttl_seconds (3600)
    {"max_ttl_seconds": 86401, "default_ttl_seconds": 300},
    {"poll_interval_seconds": 0},
    {"poll_interval_seconds": 61},
])
def test_task_bounds_must_hold_together(tasks: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="tasks:"):
        from_dict({"tasks": tasks})
    got = from_dict({"tasks": {"max_per_principal": 2, "max_ttl_seconds": 10, "default_ttl_seconds": 10}}).tasks
    assert (got.max_per_principal, got.default_ttl_seconds, got.max_ttl_seconds) == (2, 10.0, 10.0)
