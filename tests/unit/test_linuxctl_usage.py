"""linuxctl usage errors exit 2; settings come from flags, environment, then config file
(docs/REFERENCE.md §6)."""

from __future__ import annotations

import os
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from mcpd.client import api as client
from mcpd.client import linuxctl
from mcpd.client.config import Settings, resolve
from mcpd.client.linuxctl.tools import build_arguments


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No MCPD_* / MCP_TOKEN in the environment and an empty XDG config folder."""
    for var in ("MCPD_URL", "MCP_TOKEN", "MCPD_CACERT", "MCPD_CONTEXT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "linuxctl" / "config.yaml"


def invoke(*args: str) -> click.testing.Result:
    """Run linuxctl in-process; a ``--token T`` pair goes in as ``MCP_TOKEN`` (on the command line
    linuxctl would warn that it shows in ps)."""
    argv, env = list(args), {}
    if "--token" in argv:
        i = argv.index("--token")
        env["MCP_TOKEN"] = argv[i + 1]
        del argv[i:i + 2]
    return CliRunner().invoke(linuxctl.main, argv, env=env)


def write_config(path: Path, text: str, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)


@pytest.mark.parametrize(
    "args",
    [
        ["get", "files"],                                   # missing PATH
        ["get", "files", "/etc/hosts", "--bogus"],          # unknown option
        ["get", "files", "/etc/hosts", "--start-line", "0"],
        ["get", "files", "/etc/hosts", "--end-line", "x"],
        ["get", "files", "/etc/hosts", "--offset", "-1"],
        ["get", "files", "/etc/hosts", "--limit", "0"],
        ["nosuchcommand"],
        ["call"],                                            # missing TOOL
        ["--timeout", "0", "tools"],
    ],
)
def test_usage_errors_exit_2(isolated: Path, args: list[str]) -> None:
    result = invoke("--url", "https://127.0.0.1:1", "--token", "t", *args)
    assert result.exit_code == 2, result.output


def test_usage_error_missing_token_exits_2(isolated: Path) -> None:
    result = invoke("--url", "https://127.0.0.1:1", "get", "files", "/etc/hosts")
    assert result.exit_code == 2
    assert result.stderr.startswith("USAGE_ERROR: no token")


def test_usage_error_missing_url_exits_2(isolated: Path) -> None:
    result = invoke("--token", "t", "tools")
    assert result.exit_code == 2
    assert result.stderr.startswith("USAGE_ERROR: no server URL")


def test_usage_error_plain_http_url_exits_2(isolated: Path) -> None:
    result = invoke("--url", "http://127.0.0.1:1", "--token", "t", "tools")
    assert result.exit_code == 2
    assert "TLS is required" in result.stderr


def test_usage_error_unreadable_cacert_exits_2(isolated: Path, tmp_path: Path) -> None:
    result = invoke("--url", "https://127.0.0.1:1", "--token", "t", "--cacert", str(tmp_path / "none.pem"), "tools")
    assert result.exit_code == 2
    assert result.stderr.startswith("USAGE_ERROR: cannot load CA file")


@pytest.mark.parametrize("extra", [["not json"], ["[1, 2]"], ["--arg", "novalue"], ["--arg", "=x"]])
def test_call_bad_arguments_exit_2(isolated: Path, extra: list[str]) -> None:
    result = invoke("--url", "https://127.0.0.1:1", "--token", "t", "call", "files/read", *extra)
    assert result.exit_code == 2, result.output


def test_call_arguments_merge_json_and_pairs() -> None:
    args = build_arguments('{"path": "/a", "limit": 3}', ("limit=5", "privileged=true", "path=/etc/hosts"))
    assert args == {"path": "/etc/hosts", "limit": 5, "privileged": True}
    assert build_arguments(None, ("path=not json", 'x="5"')) == {"path": "not json", "x": "5"}


def test_settings_fall_back_to_config_file(isolated: Path) -> None:
    write_config(isolated, "url: https://h:1\ntoken: file-token\ncacert: /ca.pem\n")
    got = resolve(Settings(url=None, token=None, cacert=None, timeout=1))
    assert got == ("https://h:1", "file-token", "/ca.pem")


def test_flags_and_environment_win_over_config_file(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(isolated, "url: https://file:1\ntoken: file-token\ncacert: /file.pem\n")
    monkeypatch.setenv("MCP_TOKEN", "env-token")
    runner = CliRunner()
    seen: dict[str, object] = {}

    @linuxctl.main.command("probe-settings")
    @click.pass_obj
    def probe(settings: Settings) -> None:
        seen["resolved"] = resolve(settings)

    try:
        result = runner.invoke(linuxctl.main, ["--url", "https://flag:2", "probe-settings"])
    finally:
        linuxctl.main.commands.pop("probe-settings")
    assert result.exit_code == 0, result.output
    assert seen["resolved"] == ("https://flag:2", "env-token", "/file.pem")


def test_config_file_with_token_readable_by_others_is_refused(isolated: Path) -> None:
    write_config(isolated, "url: https://h:1\ntoken: secret\n", mode=0o644)
    result = invoke("tools")
    assert result.exit_code == 2
    assert "readable by others" in result.stderr
    assert "secret" not in result.output


def test_config_file_unknown_key_is_refused(isolated: Path) -> None:
    write_config(isolated, "url: https://h:1\npassword: x\n")
    result = invoke("--token", "t", "tools")
    assert result.exit_code == 2


def test_url_gets_sse_suffix_once() -> None:
    assert client.sse_url("https://127.0.0.1:9091") == "https://127.0.0.1:9091/sse"
    assert client.sse_url("https://127.0.0.1:9091/") == "https://127.0.0.1:9091/sse"
    assert client.sse_url("https://127.0.0.1:9091/sse") == "https://127.0.0.1:9091/sse"
    assert client.sse_url("https://h/base") == "https://h/base/sse"
    assert client.sse_url("https://h/base/mcp") == "https://h/base/sse"  # the /mcp endpoint's sibling
    with pytest.raises(client.UsageError):
        client.sse_url("ftp://h/")


def test_endpoints_and_the_transport_a_url_names() -> None:
    assert client.endpoints("https://h:9091") == ("https://h:9091/mcp", "https://h:9091/sse", None)
    assert client.endpoints("https://h:9091/base/") == ("https://h:9091/base/mcp", "https://h:9091/base/sse", None)
    assert client.endpoints("https://h/mcp")[2] == "http" and client.endpoints("https://h/sse/")[2] == "sse"
    assert client.Client("https://h/sse", "t", transport="auto").transport == "sse"
    assert client.Client("https://h/mcp", "t", transport="auto").transport == "http"
    assert client.Client("https://h/mcp", "t", transport="sse").transport == "sse"  # an explicit choice wins
    with pytest.raises(client.UsageError):
        client.Client("https://h", "t", transport="websocket")


def test_exit_codes_of_the_error_family() -> None:
    assert client.ToolFailed("FILE_NOT_FOUND", "m", {}, {}).exit_code == 1
    assert client.UsageError("m").exit_code == 2
    assert client.AuthError("m").exit_code == 3
    assert client.ConnectError("m").exit_code == 4


def test_tool_failure_takes_code_from_structured_content() -> None:
    result = {
        "isError": True,
        "content": [{"type": "text", "text": "cannot read binary file"}],
        "structuredContent": {"error": {"code": "BINARY_FILE", "message": "cannot read binary file", "details": {}}},
    }
    exc = client.tool_failure(result)
    assert (exc.code, exc.message, exc.exit_code) == ("BINARY_FILE", "cannot read binary file", 1)


def resolved(*args: str) -> object:
    """What `linuxctl ARGS probe` would connect to: (url, token, cacert), or the usage error's exit."""
    seen: dict[str, object] = {}

    @linuxctl.main.command("probe-settings")
    @click.pass_obj
    def probe(settings: Settings) -> None:
        try:
            seen["resolved"] = resolve(settings)
        except client.UsageError as exc:
            seen["resolved"] = ("usage error", exc.message)

    try:
        result = CliRunner().invoke(linuxctl.main, [*args, "probe-settings"])
    finally:
        linuxctl.main.commands.pop("probe-settings")
    assert result.exit_code == 0, result.output
    return seen["resolved"]


CONTEXTS = """\
cacert: /top.pem
current-context: prod
contexts:
  prod:
    url: https://prod:1
    token: prod-token
  staging:
    url: https://staging:2
    cacert: /staging.pem
  bare: {}
"""


def test_contexts_current_and_chosen(isolated: Path) -> None:
    write_config(isolated, CONTEXTS)
    assert resolved("--token", "t") == ("https://prod:1", "t", "/top.pem")  # current-context, top-level CA
    assert resolved() == ("https://prod:1", "prod-token", "/top.pem")
    assert resolved("--context", "staging", "--token", "t") == ("https://staging:2", "t", "/staging.pem")
    assert resolved("--context", "staging", "--url", "https://flag:3", "--token", "t") == \
        ("https://flag:3", "t", "/staging.pem")  # flags win over the context
    kind, message = resolved("--context", "nope")  # type: ignore[misc]
    assert kind == "usage error" and "no context 'nope'" in message and "bare, prod, staging" in message


def test_explicit_context_beats_environment_but_env_token_fills_it(isolated: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(isolated, CONTEXTS)
    monkeypatch.setenv("MCPD_URL", "https://env:4")
    monkeypatch.setenv("MCP_TOKEN", "env-token")
    assert resolved() == ("https://env:4", "env-token", "/top.pem")  # no --context: environment first
    assert resolved("--context", "prod") == ("https://prod:1", "prod-token", "/top.pem")
    assert resolved("--context", "staging") == ("https://staging:2", "env-token", "/staging.pem")
    monkeypatch.setenv("MCPD_CONTEXT", "staging")
    assert resolved() == ("https://staging:2", "env-token", "/staging.pem")


@pytest.mark.parametrize("text", [
    "contexts:\n  a:\n    url: https://a:1\n    password: x\n",   # unknown key in a context
    "contexts: [a, b]\n",                                        # not a mapping
    "current-context: ghost\ncontexts:\n  a: {url: 'https://a:1'}\n",
    "contexts:\n  a: {url: 5}\n",
])
def test_bad_context_files_exit_2(isolated: Path, text: str) -> None:
    write_config(isolated, text)
    assert invoke("--token", "t", "tools").exit_code == 2


def test_token_in_a_context_needs_a_private_file(isolated: Path) -> None:
    write_config(isolated, "contexts:\n  a:\n    url: https://a:1\n    token: secret\n", mode=0o640)
    result = invoke("--context", "a", "tools")
    assert result.exit_code == 2 and "readable by others" in result.stderr and "secret" not in result.output


def test_contexts_command_lists_them(isolated: Path) -> None:
    write_config(isolated, CONTEXTS)
    result = invoke("contexts")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == ["  bare\t", "* prod\thttps://prod:1", "  staging\thttps://staging:2"]


def test_help_documents_config_file_contexts_and_completion() -> None:
    text = invoke("--help").output
    for needle in ("~/.config/linuxctl/config.yaml", "current-context", "--context NAME", "MCPD_CONTEXT",
                   "_LINUXCTL_COMPLETE=bash_source linuxctl", "chmod 600"):
        assert needle in text
    assert "SPEC" not in text


def test_completion_script_is_generated() -> None:
    import subprocess
    import sys

    exe = str(Path(sys.executable).parent / "linuxctl")
    res = subprocess.run([exe], env={**os.environ, "_LINUXCTL_COMPLETE": "bash_source"}, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and "complete -o nosort -F _linuxctl_completion linuxctl" in res.stdout


def test_no_spec_section_numbers_in_any_help() -> None:
    def walk(cmd: click.Command, path: list[str]) -> None:
        text = CliRunner().invoke(linuxctl.main, [*path, "--help"]).output
        assert "SPEC" not in text, path
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(linuxctl.main, [])
