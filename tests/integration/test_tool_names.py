"""Tool names (docs/REFERENCE.md §2.4): ``tool_names: portable`` lists ``files_read`` …; ``tools/call`` (and
``linuxctl call``) accept both spellings whatever is listed; unknown names stay ``-32602``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mcpd.common.config import ConfigError, from_dict
from tests.conftest import Daemon, SseSession
from tests.support.linuxctl import flags, linuxctl

pytestmark = pytest.mark.anyio

PORTABLE_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
SLASH = ["files/read", "files/list", "files/find", "files/filetype", "files/grep"]
PORTABLE = ["files_read", "files_list", "files_find", "files_filetype", "files_grep"]


async def _names_and_calls(d: Daemon, path: Path) -> tuple[list[str], dict[str, Any]]:
    async with SseSession(d) as s:
        await s.initialize()
        listed = [t["name"] for t in (await s.request("tools/list"))["result"]["tools"]]
        calls = {}
        for name in ("files/read", "files_read", "files_reed", "files\\read", "Files_read"):
            calls[name] = await s.request("tools/call", {"name": name, "arguments": {"path": str(path)}})
        return listed, calls


def _check_calls(calls: dict[str, Any]) -> None:
    for ok in ("files/read", "files_read"):
        assert calls[ok]["result"]["content"][0]["text"] == "x\n", ok
    for bad in ("files_reed", "files\\read", "Files_read"):
        assert calls[bad]["error"]["code"] == -32602, bad


async def test_default_lists_slash_names_and_accepts_both(daemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x\n")
    listed, calls = await _names_and_calls(daemon, tmp_path / "a.txt")
    assert listed == SLASH
    _check_calls(calls)


async def test_portable_lists_llm_safe_names_and_accepts_both(daemon_factory: Callable[..., Daemon],
                                                              tmp_path: Path) -> None:
    d = daemon_factory(tool_names="portable")
    (tmp_path / "a.txt").write_text("x\n")
    listed, calls = await _names_and_calls(d, tmp_path / "a.txt")
    assert listed == PORTABLE and all(PORTABLE_RE.fullmatch(n) for n in listed)
    _check_calls(calls)
    res = linuxctl(*flags(d), "call", "files/read", "--arg", "path=" + str(tmp_path / "a.txt"))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["content"][0]["text"] == "x\n"


def test_linuxctl_call_accepts_the_portable_spelling(daemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x\n")
    res = linuxctl(*flags(daemon), "call", "files_read", "--arg", "path=" + str(tmp_path / "a.txt"))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["content"][0]["text"] == "x\n"


def test_tool_names_option_validated() -> None:
    assert from_dict({"tool_names": "portable"}).tool_names == "portable"
    assert from_dict({}).tool_names == "slash"
    with pytest.raises(ConfigError, match="tool_names"):
        from_dict({"tool_names": "underscore"})
