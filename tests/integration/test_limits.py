"""Per-principal limits through the real daemon (issue 5; docs/REFERENCE.md §2.5 ``RATE_LIMITED``,
``FILE_TOO_LARGE``): quota per UTC day with ``retryAfter``, the user's max file size as that call's
response cap, and counters that survive a daemon restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from mcpd.client.api import Client, ToolFailed
from tests.conftest import Daemon, start_daemon, stop_daemon

QUOTA = 3
MAX_BYTES = 100


def limits(save_every: int) -> dict[str, Any]:
    return {"tiers": {"small": {"requests_per_day": QUOTA, "max_file_bytes": MAX_BYTES}},
            "users": {"alice": "small"}, "save_every": save_every}


def read(d: Daemon, token: str, path: Path) -> str:
    async def go() -> str:
        async with Client(d.url, token, d.cacert, 30) as c:
            result = await c.call_tool("files/read", {"path": str(path)})
            return str(result["content"][0]["text"])

    return asyncio.run(go())


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    small, big = tmp_path / "small.txt", tmp_path / "big.txt"
    small.write_text("ok\n")
    big.write_text("x" * 60 + "\n" + "y" * 60 + "\n")
    return small, big


def test_limits_rate_limited_after_the_daily_quota_with_retry_after(tmp_path: Path, files: tuple[Path, Path]) -> None:
    small, _ = files
    d = start_daemon(tmp_path / "s", limits=limits(1))
    try:
        for _ in range(QUOTA):
            assert read(d, d.token, small) == "ok\n"
        with pytest.raises(ToolFailed) as info:
            read(d, d.token, small)
        assert info.value.code == "RATE_LIMITED"
        assert isinstance(info.value.details["retryAfter"], int) and 0 < info.value.details["retryAfter"] <= 86400
        assert read(d, d.other_token, small) == "ok\n"  # bob: default tier, unlimited
    finally:
        stop_daemon(d)


def test_limits_file_too_large_past_the_users_max_file_bytes(tmp_path: Path, files: tuple[Path, Path]) -> None:
    small, big = files
    d = start_daemon(tmp_path / "s", limits=limits(1))
    try:
        with pytest.raises(ToolFailed) as info:
            read(d, d.token, big)
        assert info.value.code == "FILE_TOO_LARGE"
        assert info.value.details["limit"] == MAX_BYTES
        assert read(d, d.other_token, big).startswith("x" * 60)  # bob has the daemon's own cap
        assert read(d, d.token, small) == "ok\n"
    finally:
        stop_daemon(d)


@pytest.mark.parametrize("save_every", [1, 1000])
def test_limits_counters_survive_a_daemon_restart(tmp_path: Path, files: tuple[Path, Path], save_every: int) -> None:
    """save_every 1: saved as counted; 1000: saved at shutdown only."""
    small, _ = files
    d = start_daemon(tmp_path / "s", limits=limits(save_every))
    try:
        for _ in range(QUOTA):
            read(d, d.token, small)
    finally:
        stop_daemon(d)
    assert (tmp_path / "s" / "limits-counters.json").exists()
    d = start_daemon(tmp_path / "s", limits=limits(save_every))  # same folder, same principal names
    try:
        with pytest.raises(ToolFailed) as info:
            read(d, d.token, small)
        assert info.value.code == "RATE_LIMITED"
    finally:
        stop_daemon(d)
