"""files/list, files/find, files/filetype (and the resource) on both routes through the real daemon:
the account worker, and the root helper under a grant whose ``tools:`` names the tool.
Also: find's progress notifications, and find's time budget setting the call deadline."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.client.api import Client, ResourceFailed, ToolFailed
from tests.conftest import Daemon, SseSession
from tests.support.privsep_fixture import LOG_TEXT, PrivsepDaemon, privsep_daemon  # noqa: F401

CALL_TIMEOUT = 60.0
GRANTED_TOOLS = ("files/read", "files/list", "files/find", "files/filetype")


def run(d: Any, token: str, fn: Callable[[Client], Any]) -> Any:
    async def go() -> Any:
        async with Client(d.url, token, d.cacert, timeout=CALL_TIMEOUT) as c:
            return await fn(c)

    return asyncio.run(go())


def call(d: Any, token: str, tool: str, **args: Any) -> dict[str, Any]:
    """The tool's ``structuredContent`` on success; on a tool error ``{"error": {...}}``."""
    res = run(d, token, lambda c: c.call_tool(tool, args, check=False))
    return dict(res["structuredContent"])


# -- unprivileged route: the account worker --------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "b.txt").write_text("b\r\nline\r\n")
    (tmp_path / ".hidden").write_text("h\n")
    (tmp_path / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "sub" / "deep" / "x.log").write_text("x\n")
    (tmp_path / "link").symlink_to("b.txt")
    (tmp_path / "sub" / "loop").symlink_to("..")
    return tmp_path


def test_list_unprivileged_entries_sorted_hidden_symlink_target(daemon: Daemon, tree: Path) -> None:
    out = call(daemon, daemon.token, "files/list", path=str(tree))
    names = [e["name"] for e in out["entries"]]
    assert names == [".hidden", "b.txt", "link", "sub"]
    link = next(e for e in out["entries"] if e["name"] == "link")
    assert (link["type"], link["target"]) == ("symlink", "b.txt")
    b = next(e for e in out["entries"] if e["name"] == "b.txt")
    assert b["size"] == 9 and b["permissions"].startswith("-") and b["mtime"].endswith("Z")
    limited = call(daemon, daemon.token, "files/list", path=str(tree), limit=2)
    assert [e["name"] for e in limited["entries"]] == [".hidden", "b.txt"]
    assert limited["truncated"] is True and limited["note"]


def test_find_unprivileged_by_name_and_symlink_loop_does_not_hang(daemon: Daemon, tree: Path) -> None:
    out = call(daemon, daemon.token, "files/find", root=str(tree), name="*.log")
    assert [m["path"] for m in out["matches"]] == [str(tree / "sub" / "deep" / "x.log")]
    followed = call(daemon, daemon.token, "files/find", root=str(tree), follow_symlinks=True, type="file")
    assert str(tree / "sub" / "deep" / "x.log") in [m["path"] for m in followed["matches"]]
    assert any("already visited" in e["reason"] for e in followed["errors"])
    assert followed["stopped"] is None


def test_filetype_unprivileged_text_crlf(daemon: Daemon, tree: Path) -> None:
    out = call(daemon, daemon.token, "files/filetype", path=str(tree / "b.txt"))
    assert out["text"] is True and out["mime"].startswith("text/") and out["line_endings"] == "CRLF"
    link = call(daemon, daemon.token, "files/filetype", path=str(tree / "link"))
    assert link["mime"] == "inode/symlink"


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("big")
    for d in range(12):
        sub = root / f"d{d:02}"
        sub.mkdir()
        for i in range(1000):
            (sub / f"f{i:04}.txt").touch()
    yield root


def test_find_progress_notifications_reach_the_client(daemon: Daemon, big_tree: Path) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    def on_progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    res = run(daemon, daemon.token, lambda c: c.call_tool(
        "files/find", {"root": str(big_tree), "name": "f0999.txt"}, on_progress=on_progress))
    assert len(res["structuredContent"]["matches"]) == 12
    assert len(seen) >= 2  # every 5000 entries of 12,012
    assert [s[0] for s in seen] == sorted(s[0] for s in seen) and seen[0][0] >= 5000
    assert all(s[2] and "entries scanned" in s[2] for s in seen)


async def _raw_find(daemon: Daemon, root: Path, meta: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every message up to the find's reply on a raw session."""
    async with SseSession(daemon) as s:
        await s.initialize()
        params: dict[str, Any] = {"name": "files/find", "arguments": {"root": str(root), "name": "nomatch"}}
        if meta is not None:
            params["_meta"] = meta
        r = await s.post({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
        assert r.status_code == 202
        got: list[dict[str, Any]] = []
        while True:
            m = await s.next_message(timeout=CALL_TIMEOUT)
            got.append(m)
            if m.get("id") == 7:
                return got


@pytest.mark.anyio
async def test_find_progress_only_with_progress_token(daemon: Daemon, big_tree: Path) -> None:
    with_token = await _raw_find(daemon, big_tree, {"progressToken": "tok-1"})
    progress = [m for m in with_token if m.get("method") == "notifications/progress"]
    assert progress and all(m["params"]["progressToken"] == "tok-1" for m in progress)
    without = await _raw_find(daemon, big_tree, None)
    assert [m for m in without if m.get("method") == "notifications/progress"] == []


def test_find_time_budget_sets_the_call_deadline(daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    d = daemon_factory(workers={"timeout_seconds": 0.05})  # less than starting a worker takes
    (tmp_path / "a.txt").write_text("a\n")
    read = call(d, d.token, "files/read", path=str(tmp_path / "a.txt"))
    assert read["error"]["code"] == "TIMEOUT"  # the default deadline applies to other tools
    found = call(d, d.token, "files/find", root=str(tmp_path), name="a.txt", time_budget_seconds=30)
    assert [m["path"] for m in found["matches"]] == [str(tmp_path / "a.txt")]


# -- privileged route: the root helper under a grant --------------------------------------------


def _wait(predicate: Callable[[], bool], seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def granted(privsep_daemon: PrivsepDaemon) -> PrivsepDaemon:  # noqa: F811
    """alice: read/list/find/filetype on ``app`` with ``app/private`` denied; extra root-only files."""
    d = privsep_daemon
    (d.app / "sub" / "deep").mkdir(parents=True)
    (d.app / "sub" / "deep" / "deep.txt").write_text("deep\n")
    (d.app / "private").mkdir()
    (d.app / "private" / "hidden.txt").write_text("hidden\n")
    (d.app / ".dot").write_text("dot\n")
    (d.app / "sub" / "private-ish").write_text("allowed\n")
    for p in d.app.rglob("*"):
        os.chmod(p, 0o700 if p.is_dir() else 0o600)
    rule = {"allowed": True, "paths": [str(d.app)], "deny": [str(d.app / "private")]}
    tools = {t: dict(rule) for t in GRANTED_TOOLS}
    d.write_grants({"users": {d.accounts["alice"].name: {"privileged": {"tools": tools}}}})
    token = d.tokens["alice"]
    _wait(lambda: "error" not in call(d, token, "files/find", root=str(d.app), privileged=True))
    return d


def test_privileged_list_shows_only_granted_entries(granted: PrivsepDaemon) -> None:
    d = granted
    out = call(d, d.tokens["alice"], "files/list", path=str(d.app), privileged=True)
    assert [e["name"] for e in out["entries"]] == [".dot", "log.txt", "sub"]  # not "private", not even its name
    unpriv = call(d, d.tokens["alice"], "files/list", path=str(d.app))
    assert unpriv["error"]["code"] == "PERMISSION_DENIED"  # the kernel: app is 0700 root


def test_privileged_find_never_enters_or_names_denied_entries(granted: PrivsepDaemon) -> None:
    d = granted
    out = call(d, d.tokens["alice"], "files/find", root=str(d.app), privileged=True)
    paths = [m["path"] for m in out["matches"]]
    assert str(d.app / "sub" / "deep" / "deep.txt") in paths
    assert str(d.app / "sub" / "private-ish") in paths
    assert not [p for p in paths if p.startswith(str(d.app / "private"))]
    assert "hidden" not in repr(out)


def test_privileged_find_outside_the_grant_is_denied(granted: PrivsepDaemon) -> None:
    d = granted
    out = call(d, d.tokens["alice"], "files/find", root=str(d.srv), privileged=True)
    assert out["error"]["code"] == "PERMISSION_DENIED"
    denied = call(d, d.tokens["alice"], "files/list", path=str(d.app / "private"), privileged=True)
    assert denied["error"]["code"] == "PERMISSION_DENIED"
    bob = call(d, d.tokens["bob"], "files/find", root=str(d.app), privileged=True)
    assert bob["error"]["details"]["reason"] == "no grant covers this path"


def test_privileged_filetype_inside_and_outside_the_grant(granted: PrivsepDaemon) -> None:
    d = granted
    out = call(d, d.tokens["alice"], "files/filetype", path=str(d.log_file), privileged=True)
    assert out["text"] is True and out["mime"] == "text/plain" and out["line_endings"] == "LF"
    outside = call(d, d.tokens["alice"], "files/filetype", path=str(d.secret), privileged=True)
    assert outside["error"]["code"] == "PERMISSION_DENIED"


def test_unprivileged_find_reports_unenterable_directory_and_goes_on(granted: PrivsepDaemon) -> None:
    d = granted
    out = call(d, d.tokens["alice"], "files/find", root=str(d.srv))
    assert {"path": str(d.app), "reason": "permission denied"} in out["errors"]
    assert str(d.app) in [m["path"] for m in out["matches"]]  # named by its parent listing, not entered
    assert str(d.log_file) not in [m["path"] for m in out["matches"]]


def test_privileged_resource_read_with_metadata_and_refusal(granted: PrivsepDaemon) -> None:
    d = granted
    uri = f"file://{d.log_file}"
    item = run(d, d.tokens["alice"], lambda c: c.read_resource(uri, include_metadata=True, privileged=True))
    assert item["text"] == LOG_TEXT and item["_meta"]["size"] == len(LOG_TEXT)

    async def refused(c: Client) -> ResourceFailed | None:
        try:
            await c.read_resource(f"file://{d.secret}", privileged=True)
        except ResourceFailed as exc:
            return exc
        return None

    err = run(d, d.tokens["alice"], refused)
    assert err is not None and err.code == "PERMISSION_DENIED" and err.rpc_code == -32602  # refused, not internal


def test_privileged_tool_not_named_in_grant_is_denied(granted: PrivsepDaemon) -> None:
    d = granted
    rule = {"allowed": True, "paths": [str(d.app)]}
    d.write_grants({"users": {d.accounts["alice"].name: {"privileged": {"tools": {"files/read": rule}}}}})
    token = d.tokens["alice"]
    try:
        _wait(lambda: "error" in call(d, token, "files/list", path=str(d.app), privileged=True))
        err = call(d, token, "files/find", root=str(d.app), privileged=True)["error"]
        assert err["code"] == "PERMISSION_DENIED" and err["details"]["reason"] == "no grant covers this path"
    finally:
        tools = {t: {"allowed": True, "paths": [str(d.app)], "deny": [str(d.app / "private")]} for t in GRANTED_TOOLS}
        d.write_grants({"users": {d.accounts["alice"].name: {"privileged": {"tools": tools}}}})
        _wait(lambda: "error" not in call(d, token, "files/list", path=str(d.app), privileged=True))


def test_tool_failed_exposes_code(daemon: Daemon, tmp_path: Path) -> None:
    with pytest.raises(ToolFailed) as info:
        run(daemon, daemon.token, lambda c: c.call_tool("files/list", {"path": str(tmp_path / "none")}))
    assert info.value.code == "FILE_NOT_FOUND"
