"""docs/REFERENCE.md §6 against the real daemon: `linuxctl` output, exit codes, settings; the client under it."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mcpd.admin import certs
from mcpd.client import api as client
from tests.support import http_proxy
from tests.support.linuxctl import LINUXCTL, flags, linuxctl, make_file


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_get_files_prints_content_exactly(daemon: Any, tmp_path: Path) -> None:
    data = "first\r\nsecond\n\u00e9t\u00e9 \u2028 last line without newline".encode()
    path = make_file(tmp_path, "exact.txt", data)
    res = linuxctl(*flags(daemon), "get", "files", str(path))
    assert res.returncode == 0, res.stderr
    assert res.stdout == data
    assert res.stderr == b""


def test_get_files_line_range(daemon: Any, tmp_path: Path) -> None:
    path = make_file(tmp_path, "lines.txt", b"l1\nl2\r\nl3\nl4")
    res = linuxctl(*flags(daemon), "get", "files", str(path), "--start-line", "2", "--end-line", "3")
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"l2\r\nl3\n"
    res = linuxctl(*flags(daemon), "get", "files", str(path), "--start-line", "4")
    assert (res.returncode, res.stdout) == (0, b"l4")


def test_get_files_byte_range(daemon: Any, tmp_path: Path) -> None:
    path = make_file(tmp_path, "bytes.txt", b"0123456789")
    res = linuxctl(*flags(daemon), "get", "files", str(path), "--offset", "3", "--limit", "4")
    assert (res.returncode, res.stdout) == (0, b"3456"), res.stderr


def test_tool_error_exits_1_with_code_on_stderr(daemon: Any, tmp_path: Path) -> None:
    res = linuxctl(*flags(daemon), "get", "files", str(tmp_path / "missing.txt"))
    assert res.returncode == 1
    assert res.stdout == b""
    assert res.stderr.startswith(b"FILE_NOT_FOUND: ")


def test_range_out_of_bounds_exits_1(daemon: Any, tmp_path: Path) -> None:
    path = make_file(tmp_path, "two.txt", b"a\nb\n")
    res = linuxctl(*flags(daemon), "get", "files", str(path), "--start-line", "3")
    assert res.returncode == 1
    assert res.stderr.startswith(b"RANGE_OUT_OF_BOUNDS: ")


def test_bad_token_exits_3(daemon: Any) -> None:
    res = linuxctl("--url", daemon.url, "--token", "mcpd_000000000000_" + "A" * 43, "--cacert",
                   str(daemon.cacert), "get", "files", "/etc/hosts")
    assert res.returncode == 3
    assert res.stderr.startswith(b"AUTH_FAILED: ")
    assert res.stdout == b""


def test_untrusted_certificate_exits_4(daemon: Any, tmp_path: Path) -> None:
    other = certs.make_pki(tmp_path / "other-ca", ["localhost", "127.0.0.1"])
    res = linuxctl("--url", daemon.url, "--token", daemon.token, "--cacert", str(other.ca_cert),
                   "get", "files", "/etc/hosts")
    assert res.returncode == 4
    assert res.stderr.startswith(f"TLS_ERROR: server {daemon.url} certificate not trusted".encode())


def test_closed_port_exits_4(tmp_path: Path) -> None:
    pki = certs.make_pki(tmp_path / "ca", ["127.0.0.1"])
    port = free_port()
    res = linuxctl("--url", f"https://127.0.0.1:{port}", "--token", "t", "--cacert", str(pki.ca_cert),
                   "get", "files", "/etc/hosts")
    assert res.returncode == 4
    assert res.stderr.startswith(f"CONNECT_FAILED: cannot reach server https://127.0.0.1:{port}".encode())


def test_settings_from_environment(daemon: Any, tmp_path: Path) -> None:
    path = make_file(tmp_path, "env.txt", b"from env")
    env = {"MCPD_URL": daemon.url, "MCP_TOKEN": daemon.token, "MCPD_CACERT": str(daemon.cacert)}
    res = linuxctl("get", "files", str(path), env=env)
    assert (res.returncode, res.stdout) == (0, b"from env"), res.stderr


def test_settings_from_config_file(daemon: Any, tmp_path: Path) -> None:
    path = make_file(tmp_path, "conf.txt", b"from config")
    conf = tmp_path / "xdg" / "linuxctl" / "config.yaml"
    conf.parent.mkdir(parents=True)
    conf.write_text(json.dumps({"url": daemon.url + "/sse", "token": daemon.token, "cacert": str(daemon.cacert)}))
    os.chmod(conf, 0o600)
    res = linuxctl("get", "files", str(path), home=tmp_path / "xdg")
    assert (res.returncode, res.stdout) == (0, b"from config"), res.stderr


def test_contexts_pick_the_server(daemon: Any, tmp_path: Path) -> None:
    path = make_file(tmp_path, "ctx.txt", b"from a context")
    conf = tmp_path / "xdg" / "linuxctl" / "config.yaml"
    conf.parent.mkdir(parents=True)
    conf.write_text(json.dumps({
        "current-context": "gone",
        "cacert": str(daemon.cacert),
        "contexts": {"here": {"url": daemon.url, "token": daemon.token},
                     "gone": {"url": f"https://127.0.0.1:{free_port()}", "token": daemon.token}},
    }))
    os.chmod(conf, 0o600)
    res = linuxctl("--context", "here", "get", "files", str(path), home=tmp_path / "xdg")
    assert (res.returncode, res.stdout) == (0, b"from a context"), res.stderr
    res = linuxctl("get", "files", str(path), home=tmp_path / "xdg")  # current-context: nothing listens
    assert res.returncode == 4 and res.stderr.startswith(b"CONNECT_FAILED: ")
    res = linuxctl("get", "files", str(path), home=tmp_path / "xdg", env={"MCPD_CONTEXT": "here"})
    assert (res.returncode, res.stdout) == (0, b"from a context"), res.stderr


def test_tools_lists_files_read(daemon: Any) -> None:
    res = linuxctl(*flags(daemon), "tools")
    assert res.returncode == 0, res.stderr
    assert any(line.split(b"\t")[0] == b"files/read" for line in res.stdout.splitlines())
    res = linuxctl(*flags(daemon), "tools", "--json")
    tools = json.loads(res.stdout)
    assert "files/read" in {t["name"] for t in tools}


def test_call_prints_result_json(daemon: Any, tmp_path: Path) -> None:
    path = make_file(tmp_path, "call.txt", b"a\nb\nc\n")
    res = linuxctl(*flags(daemon), "call", "files/read", json.dumps({"path": str(path)}), "--arg", "start_line=2")
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert result["content"][0]["text"] == "b\nc\n"
    assert not result.get("isError")


def test_call_tool_error_exits_1_and_prints_result(daemon: Any) -> None:
    res = linuxctl(*flags(daemon), "call", "files/read", "--arg", "path=relative/path")
    assert res.returncode == 1
    assert json.loads(res.stdout)["isError"] is True
    assert res.stderr.startswith(b"INVALID_ARGUMENT: ")


def test_client_matches_concurrent_responses_by_id(daemon: Any, tmp_path: Path) -> None:
    paths = [make_file(tmp_path, f"c{i}.txt", f"content {i}\n".encode() * (i + 1)) for i in range(8)]

    async def go() -> list[str]:
        async with client.Client(daemon.url, daemon.token, str(daemon.cacert)) as c:
            results = await asyncio.gather(*(c.call_tool("files/read", {"path": str(p)}) for p in paths))
            return [client.text_of(r) for r in results]

    texts = asyncio.run(go())
    assert texts == [p.read_text() for p in paths]


def test_client_raises_tool_failed_with_code(daemon: Any, tmp_path: Path) -> None:
    with pytest.raises(client.ToolFailed) as info:
        client.call_tool_sync(daemon.url, daemon.token, str(daemon.cacert), "files/read",
                              {"path": str(tmp_path / "nope")})
    assert (info.value.code, info.value.exit_code) == ("FILE_NOT_FOUND", 1)
    assert info.value.details.get("path") == str(tmp_path / "nope")


def test_client_initialize_reports_server_info(daemon: Any) -> None:
    async def go() -> dict[str, Any]:
        async with client.Client(daemon.url, daemon.token, str(daemon.cacert)) as c:
            assert await c.request("ping") == {}
            return await c.initialize()

    info = asyncio.run(go())
    assert info["serverInfo"]["name"] == "mcpd"
    assert info["protocolVersion"] == client.PROTOCOL_VERSION


def test_client_unknown_tool_is_rpc_error(daemon: Any) -> None:
    with pytest.raises(client.RPCError) as info:
        client.call_tool_sync(daemon.url, daemon.token, str(daemon.cacert), "no/such/tool", {})
    assert info.value.rpc_code == -32602


def test_privileged_flag_is_sent_never_downgraded(daemon: Any) -> None:
    # the fixture runs without a root helper: a privileged read must fail, never fall back (docs/REFERENCE.md §4.1)
    res = linuxctl(*flags(daemon), "get", "files", "/etc/hosts", "--privileged")
    assert res.returncode == 1
    assert res.stdout == b""
    assert res.stderr.startswith(b"HELPER_UNAVAILABLE: ")


def test_client_lost_stream_is_connect_error(daemon_factory: Any) -> None:
    d = daemon_factory()

    async def go() -> None:
        async with client.Client(d.url, d.token, d.cacert, timeout=20) as c:
            d.proc.kill()
            d.proc.wait(timeout=10)
            with pytest.raises(client.ConnectError) as info:
                await c.list_tools()
            assert info.value.exit_code == 4

    asyncio.run(go())


def test_client_and_server_report_the_package_version(daemon: Any) -> None:
    import importlib.metadata

    async def go() -> dict[str, Any]:
        async with client.Client(daemon.url, daemon.token, daemon.cacert) as c:
            assert c.server_info is not None
            return c.server_info

    info = asyncio.run(go())
    assert info["serverInfo"]["version"] == importlib.metadata.version("mcpd")


# -- transports: Streamable HTTP first, HTTP+SSE as the fallback ------------------------------------


@pytest.fixture
def no_mcp_server(daemon: Any) -> Any:
    """The daemon behind a proxy that answers 404 on /mcp: a server from before Streamable HTTP."""
    url, proc = http_proxy.start(daemon, hide=("/mcp",))
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def _get(url: str, daemon: Any, path: Path, *transport: str) -> subprocess.CompletedProcess[bytes]:
    return linuxctl("--url", url, "--token", daemon.token, "--cacert", str(daemon.cacert), *transport,
                    "get", "files", str(path))


@pytest.mark.parametrize("transport", [(), ("--transport", "auto"), ("--transport", "http"), ("--transport", "sse")])
def test_every_transport_reads_the_file(daemon: Any, tmp_path: Path, transport: tuple[str, ...]) -> None:
    path = make_file(tmp_path, "a.txt", b"one\ntwo\n")
    res = _get(daemon.url, daemon, path, *transport)
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"one\ntwo\n"


def test_auto_falls_back_to_sse_when_the_server_has_no_mcp(daemon: Any, no_mcp_server: str, tmp_path: Path) -> None:
    path = make_file(tmp_path, "a.txt", b"one\n")
    res = _get(no_mcp_server, daemon, path)
    assert (res.returncode, res.stdout) == (0, b"one\n"), res.stderr
    res = _get(no_mcp_server, daemon, path, "--transport", "http")  # forced: no fallback
    assert res.returncode == 1 and b"HTTP_404" in res.stderr
    res = linuxctl("--url", no_mcp_server, "--token", daemon.token, "--cacert", str(daemon.cacert),
                   "find", "files", str(tmp_path), "--name", "a.txt", "--progress")
    assert res.returncode == 0 and str(path).encode() in res.stdout


def test_auto_tries_mcp_first(daemon_factory: Any, tmp_path: Path) -> None:
    """With the only session slot held by an /sse stream, auto gets the 503 of /mcp's initialize
    (not a fallback status), which proves it asked /mcp first; sse gets /sse's own 503."""
    d = daemon_factory(max_sessions=1)
    path = make_file(tmp_path, "a.txt", b"one\n")

    async def hold() -> tuple[subprocess.CompletedProcess[bytes], ...]:
        async with client.Client(d.url, d.token, d.cacert, transport="sse"):
            return tuple([await asyncio.to_thread(_get, d.url, d, path, *t) for t in
                          [(), ("--transport", "http"), ("--transport", "sse")]])

    auto, http, sse = asyncio.run(hold())
    assert auto.returncode == 1 and b"POST" in auto.stderr and b"503" in auto.stderr
    assert http.returncode == 1 and b"POST" in http.stderr and b"503" in http.stderr
    assert sse.returncode == 1 and b"GET" in sse.stderr and b"503" in sse.stderr


def test_http_session_is_deleted_on_exit_and_progress_streams(daemon_factory: Any, tmp_path: Path) -> None:
    d = daemon_factory(max_sessions=1)  # each run must give its session back, or the next gets 503
    (tmp_path / "tree").mkdir()
    tree = make_file(tmp_path / "tree", "x", b"").parent
    for i in range(3):
        (tree / f"d{i}").mkdir()
        for j in range(4000):
            (tree / f"d{i}" / f"f{j}").touch()
    for _ in range(3):
        res = linuxctl("--url", d.url, "--token", d.token, "--cacert", str(d.cacert), "--transport", "http",
                       "find", "files", str(tree), "--name", "f3999", "--progress")
        assert res.returncode == 0, res.stderr
        assert res.stdout.count(b"f3999") == 3 and b"entries scanned" in res.stderr


def test_token_from_a_file_or_stdin_and_a_warning_for_one_on_the_command_line(daemon: Any, tmp_path: Path) -> None:
    """A token given as --token shows in ps: linuxctl warns; --token-file FILE and - (stdin) don't."""
    path = make_file(tmp_path, "a.txt", b"one\n")
    base = ["--url", daemon.url, "--cacert", str(daemon.cacert)]
    flagged = linuxctl(*base, "--token", daemon.token, "get", "files", str(path), token_flag=True)
    assert flagged.returncode == 0 and flagged.stdout == b"one\n"
    assert b"warning: --token on the command line" in flagged.stderr
    token_file = tmp_path / "token"
    token_file.write_text(daemon.token + "\n")
    os.chmod(token_file, 0o600)
    from_file = linuxctl(*base, "--token-file", str(token_file), "get", "files", str(path))
    assert (from_file.returncode, from_file.stdout, from_file.stderr) == (0, b"one\n", b"")
    env = {k: v for k, v in os.environ.items() if k not in ("MCPD_URL", "MCP_TOKEN", "MCPD_CACERT")}
    env["XDG_CONFIG_HOME"] = "/nonexistent-linuxctl-config"
    from_stdin = subprocess.run([LINUXCTL, *base, "--token-file", "-", "get", "files", str(path)],
                                input=(daemon.token + "\n").encode(), capture_output=True, env=env, timeout=60)
    assert (from_stdin.returncode, from_stdin.stdout, from_stdin.stderr) == (0, b"one\n", b"")
    both = linuxctl(*base, "--token", daemon.token, "--token-file", str(token_file), "tools", token_flag=True)
    assert both.returncode == 2 and b"not both" in both.stderr
