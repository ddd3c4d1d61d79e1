"""docs/REFERENCE.md §2.4: ``tools/list`` gives the tools whose every answer carries
``structuredContent`` an ``outputSchema`` (sessions of 2025-06-18 and later), and the real
answers of each tool, error results included, match it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.conftest import Daemon, SseSession
from tests.support.streamable import client, post, request

pytestmark = pytest.mark.anyio

STRUCTURED = {"files/list", "files/find", "files/filetype", "files/grep"}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "a.txt").write_text("hello world\nfoo.bar\r\nfoo again\n")
    (tmp_path / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "sub" / "b.log").write_text("nothing\nfoo at 2\n")
    (tmp_path / "bin.dat").write_bytes(b"foo\0foo\n")
    (tmp_path / "empty").write_bytes(b"")
    os.symlink("a.txt", tmp_path / "link")
    os.symlink("nowhere", tmp_path / "dangling")
    os.mkfifo(tmp_path / "fifo")
    return tmp_path


def calls(t: Path) -> list[tuple[str, dict[str, Any]]]:
    a, missing = str(t / "a.txt"), str(t / "missing")
    return [
        ("files/list", {"path": str(t)}),
        ("files/list", {"path": str(t), "limit": 2}),
        ("files/list", {"path": str(t / "link")}),
        ("files/list", {"path": missing}),
        ("files/list", {"path": "relative"}),
        ("files/find", {"root": str(t)}),
        ("files/find", {"root": str(t), "name": "*.txt", "type": "file", "max_results": 1}),
        ("files/find", {"root": a}),
        ("files/filetype", {"path": a}),
        ("files/filetype", {"path": str(t / "bin.dat")}),
        ("files/filetype", {"path": str(t / "empty")}),
        ("files/filetype", {"path": str(t / "link")}),
        ("files/filetype", {"path": str(t / "fifo")}),
        ("files/filetype", {"path": str(t / "sub")}),
        ("files/filetype", {"path": missing}),
        ("files/grep", {"pattern": "foo", "path": str(t)}),
        ("files/grep", {"pattern": "foo", "path": str(t), "context": 1, "max_matches": 1}),
        ("files/grep", {"pattern": "foo", "path": a, "invert": True}),
        ("files/grep", {"pattern": "(", "path": a}),
        ("files/grep", {"pattern": "foo", "path": str(t / "bin.dat")}),
        ("files/grep", {"pattern": "foo", "path": str(t), "cursor": "forged"}),
    ]


async def listed(s: SseSession) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in (await s.request("tools/list"))["result"]["tools"]}


@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25"])
async def test_every_answer_matches_the_advertised_output_schema(daemon: Daemon, tree: Path, version: str) -> None:
    async with SseSession(daemon) as s:
        await s.initialize(version)
        tools = await listed(s)
        assert {n for n, t in tools.items() if "outputSchema" in t} == STRUCTURED
        for name in STRUCTURED:
            schema = tools[name]["outputSchema"]
            assert schema["type"] == "object"
            jsonschema.Draft202012Validator.check_schema(schema)
        kinds: dict[str, set[bool]] = {name: set() for name in STRUCTURED}
        for i, (name, args) in enumerate(calls(tree)):
            result = (await s.request("tools/call", {"name": name, "arguments": args}, req_id=i))["result"]
            assert "structuredContent" in result, (name, args, result)
            jsonschema.validate(result["structuredContent"], tools[name]["outputSchema"],
                                cls=jsonschema.Draft202012Validator)
            kinds[name].add(bool(result.get("isError")))
        assert all(k == {True, False} for k in kinds.values()), kinds  # successes and errors, every tool


async def test_a_schema_refuses_what_the_tool_never_answers(daemon: Daemon) -> None:
    """The schemas say something: a result missing a field, or of the wrong type, fails them."""
    async with SseSession(daemon) as s:
        await s.initialize("2025-06-18")
        tools = await listed(s)
    bad = [("files/list", {"path": "/", "kind": "directory", "entries": [], "total": 0, "truncated": "no",
                           "note": None}),
           ("files/find", {"root": "/", "matches": [{"path": "/x"}]}),
           ("files/filetype", {"path": "/x", "type": "file", "size": -1, "mime": "text/plain"}),
           ("files/grep", {"error": {"message": "no code"}})]
    for name, value in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(value, tools[name]["outputSchema"], cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize("version", ["2024-11-05", "2025-03-26"])
async def test_no_output_schema_before_2025_06_18(daemon: Daemon, version: str) -> None:
    async with SseSession(daemon) as s:
        await s.initialize(version)
        assert not [t for t in (await listed(s)).values() if "outputSchema" in t]


async def test_files_read_declares_none(daemon: Daemon, tree: Path) -> None:
    """files/read answers structuredContent only with include_metadata: it declares no schema, so
    a client never expects structuredContent from a plain read."""
    async with SseSession(daemon) as s:
        await s.initialize("2025-11-25")
        assert "outputSchema" not in (await listed(s))["files/read"]
        result = (await s.request("tools/call", {"name": "files/read", "arguments": {"path": str(tree / "a.txt")}}))
        assert "structuredContent" not in result["result"]


async def test_the_stateless_era_lists_them_and_its_answers_match(daemon: Daemon, tree: Path) -> None:
    async with client(daemon) as c:
        r = await post(c, daemon, request("tools/list"))
        tools = {t["name"]: t for t in r.json()["result"]["tools"]}
        assert {n for n, t in tools.items() if "outputSchema" in t} == STRUCTURED
        for name, args in calls(tree)[::4]:
            r = await post(c, daemon, request("tools/call", {"name": name, "arguments": args}))
            jsonschema.validate(r.json()["result"]["structuredContent"], tools[name]["outputSchema"],
                                cls=jsonschema.Draft202012Validator)
