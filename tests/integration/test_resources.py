"""The file resource through the real daemon: template, resources/read with metadata,
URI query and params, error codes in ``data.code``, encodings, workspaces, many reads at once, and
the official MCP SDK."""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import json
import os
import ssl
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.sse import sse_client

from mcpd.client.api import Client, ResourceFailed, ToolFailed, read_resource_sync, text_of
from tests.conftest import Daemon
from tests.support.privsep_fixture import (  # noqa: F401  (fixture)
    LOG_TEXT,
    SECRET_TEXT,
    PrivsepDaemon,
    privsep_daemon,
)

pytestmark = pytest.mark.anyio

ENCODINGS = ("utf-8", "ascii", "latin-1", "cp1252", "utf-16", "auto")


def client(d: Daemon, token: str | None = None) -> Client:
    return Client(d.url, token or d.token, d.cacert, timeout=30)


def uri_of(path: Path, query: str = "") -> str:
    return "file://" + urllib.parse.quote(str(path)) + (f"?{query}" if query else "")


async def rpc_failure(c: Client, uri: str, **params: Any) -> ResourceFailed:
    with pytest.raises(ResourceFailed) as info:
        await c.read_resource(uri, **params)
    return info.value


async def test_resource_template_lists_file_uri(daemon: Daemon) -> None:
    async with client(daemon) as c:
        templates = await c.list_resource_templates()
        listed = await c.request("resources/list", {})
    assert [t["uriTemplate"] for t in templates] == ["file:///{+path}"]
    assert templates[0]["name"] and templates[0]["description"] and templates[0]["mimeType"] == "text/plain"
    assert listed == {"resources": []}


async def test_resource_read_returns_text_mime_type_and_metadata(daemon: Daemon, tmp_path: Path) -> None:
    data = b"name: mcpd\nport: 9091\n"
    p = tmp_path / "conf.yaml"
    p.write_bytes(data)
    async with client(daemon) as c:
        raw = await c.request("resources/read", {"uri": uri_of(p)})  # server default: metadata on
        plain = await c.read_resource(uri_of(p))  # the client asks for no metadata by default
    (item,) = raw["contents"]
    assert item["uri"] == uri_of(p) and item["text"] == data.decode()
    assert item["mimeType"] == "application/yaml"
    meta = item["_meta"]
    assert meta["sha256"] == hashlib.sha256(data).hexdigest()
    assert (meta["size"], meta["lines"], meta["language"], meta["encoding"]) == (len(data), 2, "yaml", "utf-8")
    assert meta["lastModified"].endswith("Z")
    assert "_meta" not in plain and plain["text"] == data.decode()


async def test_resource_mime_type_by_extension_text_plain_when_unknown(daemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "noext").write_text("x\n")
    async with client(daemon) as c:
        py = await c.read_resource(uri_of(tmp_path / "a.py"))
        other = await c.read_resource(uri_of(tmp_path / "noext"))
    assert py["mimeType"] == "text/x-python"
    assert other["mimeType"] == "text/plain"


async def test_resource_line_range_and_encoding_from_uri_query(daemon: Daemon, tmp_path: Path) -> None:
    p = tmp_path / "log.txt"
    p.write_bytes("".join(f"line {i} \u00e9\n" for i in range(1, 201)).encode("latin-1"))
    async with client(daemon) as c:
        raw = await c.request("resources/read", {"uri": uri_of(p, "start_line=50&end_line=52&encoding=latin-1")})
        off = await c.request("resources/read", {"uri": uri_of(p, "end_line=1&encoding=latin-1&include_metadata=false")})
    item = raw["contents"][0]
    assert "_meta" not in off["contents"][0]
    assert item["text"] == "line 50 \u00e9\nline 51 \u00e9\nline 52 \u00e9\n"
    meta = item["_meta"]
    assert (meta["linesReturned"], meta["totalLines"]) == (3, 200)
    assert meta["encoding"] == "latin-1"


async def test_resource_params_line_range_encoding_and_metadata(daemon: Daemon, tmp_path: Path) -> None:
    p = tmp_path / "log.txt"
    p.write_bytes("".join(f"r{i} \u00e9\n" for i in range(1, 11)).encode("cp1252"))
    async with client(daemon) as c:
        item = await c.read_resource(uri_of(p), encoding="cp1252", include_metadata=True, line_range=(9, None))
        # params win over the URI query
        over = await c.read_resource(uri_of(p, "start_line=1&end_line=1&encoding=utf-8"), encoding="cp1252",
                                     line_range=(2, 2))
    assert item["text"] == "r9 \u00e9\nr10 \u00e9\n"
    assert item["_meta"]["lineRange"]["start"] == 9 and item["_meta"]["totalLines"] == 10
    assert over["text"] == "r2 \u00e9\n"


async def test_resource_percent_decoded_path(daemon: Daemon, tmp_path: Path) -> None:
    p = tmp_path / "with space \u00e9#?.txt"
    p.write_text("decoded\n")
    async with client(daemon) as c:
        item = await c.read_resource(uri_of(p))
    assert item["text"] == "decoded\n"


async def test_resource_missing_file_is_32002_with_file_not_found(daemon: Daemon, tmp_path: Path) -> None:
    async with client(daemon) as c:
        err = await rpc_failure(c, uri_of(tmp_path / "missing.txt"))
    assert (err.rpc_code, err.code) == (-32002, "FILE_NOT_FOUND")
    assert err.details == {"path": str(tmp_path / "missing.txt")}


@pytest.mark.parametrize(
    ("make_uri", "rpc_code", "code"),
    [
        (lambda t: uri_of(t), -32602, "NOT_A_REGULAR_FILE"),
        (lambda t: uri_of(t / "two.txt", "start_line=9"), -32602, "RANGE_OUT_OF_BOUNDS"),
        (lambda t: uri_of(t / "two.txt", "encoding=base64&start_line=1"), -32602, "INVALID_ARGUMENT"),
        (lambda t: uri_of(t / "two.txt", "encoding=klingon"), -32602, "INVALID_ARGUMENT"),
        (lambda t: uri_of(t / "two.txt", "bogus=1"), -32602, "INVALID_ARGUMENT"),
        (lambda t: uri_of(t / "two.txt", "start_line=0"), -32602, "INVALID_ARGUMENT"),
        (lambda t: "https://example.com/etc/passwd", -32602, "INVALID_ARGUMENT"),
        (lambda t: "file://otherhost/etc/passwd", -32602, "INVALID_ARGUMENT"),
        (lambda t: "file:///etc/pass%00wd", -32602, "INVALID_ARGUMENT"),
        (lambda t: "file:///etc/%ff", -32602, "INVALID_ARGUMENT"),
    ],
)
async def test_resource_error_codes_travel_in_data_code(
    daemon: Daemon, tmp_path: Path, make_uri: Callable[[Path], str], rpc_code: int, code: str
) -> None:
    (tmp_path / "two.txt").write_text("a\nb\n")
    (tmp_path / "bin").write_bytes(b"\x00\x01binary")
    async with client(daemon) as c:
        err = await rpc_failure(c, make_uri(tmp_path))
    assert (err.rpc_code, err.code) == (rpc_code, code)


async def test_resource_privileged_without_helper_is_helper_unavailable(daemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    async with client(daemon) as c:
        err = await rpc_failure(c, uri_of(tmp_path / "f"), privileged=True)
        via_query = await rpc_failure(c, uri_of(tmp_path / "f", "privileged=true"))
    assert err.code == via_query.code == "HELPER_UNAVAILABLE"


async def test_resource_localhost_and_single_slash_forms_are_absolute(daemon: Daemon, tmp_path: Path) -> None:
    p = tmp_path / "abs.txt"
    p.write_text("abs\n")
    async with client(daemon) as c:
        a = await c.read_resource("file://localhost" + str(p))
        b = await c.read_resource("file:" + str(p))
    assert a["text"] == b["text"] == "abs\n"


# -- encodings: the same documented answer through the resource and files/read -------------------

SAMPLES: dict[str, bytes] = {
    "latin1": "caf\u00e9 na\u00efve\n".encode("latin-1"),
    "cp1252_80": b"price \x80 5\n",
    "cp1252_81": b"odd \x81 byte\n",
    "utf16le_bom": codecs.BOM_UTF16_LE + "h\u00e9llo\n".encode("utf-16-le"),
    "utf16be_bom": codecs.BOM_UTF16_BE + "h\u00e9llo\n".encode("utf-16-be"),
    "utf8_bom": codecs.BOM_UTF8 + "h\u00e9llo\n".encode(),
    "invalid_utf8": b"abc \xc3\x28 def\n",
}
ERR = "ENCODING_ERROR"
#: sample → encoding argument → text, or ERR (``auto`` is checked separately: detector-dependent).
EXPECTED: dict[str, dict[str, str]] = {
    "latin1": {"utf-8": ERR, "ascii": ERR, "latin-1": "caf\u00e9 na\u00efve\n",
               "cp1252": "caf\u00e9 na\u00efve\n", "utf-16": ERR},
    "cp1252_80": {"utf-8": ERR, "ascii": ERR, "latin-1": "price \x80 5\n", "cp1252": "price \u20ac 5\n"},
    "cp1252_81": {"utf-8": ERR, "ascii": ERR, "latin-1": "odd \x81 byte\n", "cp1252": ERR, "utf-16": ERR},
    # a BOM wins over any encoding argument and is stripped
    "utf16le_bom": {e: "h\u00e9llo\n" for e in ENCODINGS},
    "utf16be_bom": {e: "h\u00e9llo\n" for e in ENCODINGS},
    "utf8_bom": {e: "h\u00e9llo\n" for e in ENCODINGS},
    "invalid_utf8": {"utf-8": ERR, "ascii": ERR, "latin-1": "abc \u00c3( def\n", "cp1252": "abc \u00c3( def\n",
                     "utf-16": ERR},
}
CASES = [(s, e, want) for s, table in EXPECTED.items() for e, want in table.items()]


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("encodings")
    for name, data in SAMPLES.items():
        (root / name).write_bytes(data)
    return root


@pytest.mark.parametrize(("sample", "encoding", "want"), CASES)
async def test_encoding_answers_resource_and_files_read(
    daemon: Daemon, samples: Path, sample: str, encoding: str, want: str
) -> None:
    path = samples / sample
    async with client(daemon) as c:
        tool = await c.call_tool("files/read", {"path": str(path), "encoding": encoding}, check=False)
        try:
            got: str = (await c.read_resource(uri_of(path), encoding=encoding))["text"]
        except ResourceFailed as exc:
            got = exc.code
            assert exc.details["requestedEncoding"] == encoding and exc.details["detectedEncoding"]
    tool_got = tool["structuredContent"]["error"]["code"] if tool.get("isError") else text_of(tool)
    assert got == tool_got == want


@pytest.mark.parametrize("sample", ["latin1", "cp1252_80", "cp1252_81", "invalid_utf8"])
async def test_encoding_auto_uses_the_encoding_named_by_encoding_error(daemon: Daemon, samples: Path,
                                                                       sample: str) -> None:
    path = samples / sample
    async with client(daemon) as c:
        err = await rpc_failure(c, uri_of(path), encoding="utf-8")
        auto = await c.read_resource(uri_of(path), encoding="auto", include_metadata=True)
    assert auto["_meta"]["encoding"] == err.details["detectedEncoding"]
    assert auto["text"] == SAMPLES[sample].decode(err.details["detectedEncoding"])


# -- workspaces ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ws_daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.conftest import start_daemon, stop_daemon

    base = tmp_path_factory.mktemp("ws")
    ws = base / "ws"
    (ws / "notes").mkdir(parents=True)
    (ws / "notes" / "todo.md").write_text("todo\n")
    (ws / "top.txt").write_text("top\n")
    (base / "ws-evil").mkdir()
    (base / "ws-evil" / "x").write_text("outside\n")
    (base / "outside.txt").write_text("outside\n")
    d = start_daemon(base / "d", workspaces={"alice": str(ws)}, default_workspace="")
    yield d, ws
    stop_daemon(d)


@pytest.mark.parametrize(
    ("uri", "text"),
    [
        ("file:notes/todo.md", "todo\n"),
        ("file:./notes/../top.txt", "top\n"),
        ("file:notes/./../notes/todo.md", "todo\n"),
        ("file:notes%2Ftodo.md", "todo\n"),
    ],
)
async def test_workspace_relative_uri_resolved_inside(ws_daemon: Any, uri: str, text: str) -> None:
    d, _ = ws_daemon
    async with client(d) as c:
        item = await c.read_resource(uri, include_metadata=True)
    assert item["text"] == text and item["uri"] == uri


async def test_workspace_does_not_change_absolute_uris(ws_daemon: Any) -> None:
    d, ws = ws_daemon
    async with client(d) as c:
        item = await c.read_resource(uri_of(ws.parent / "outside.txt"))
    assert item["text"] == "outside\n"


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("file:../outside.txt", "path leaves the workspace"),
        ("file:notes/../../outside.txt", "path leaves the workspace"),
        ("file:../ws/top.txt", "path leaves the workspace"),  # leaves, even if it comes back
        ("file:..%2Fws-evil/x", "path leaves the workspace"),
        ("file:~/outside.txt", "~ is not expanded"),
        ("file:~root/.bashrc", "~ is not expanded"),
        ("file:%2F%2Fetc/passwd", "must not start with /"),
        ("file:%2Fetc/passwd", "must not start with /"),
    ],
)
async def test_workspace_escapes_are_permission_denied_with_reason(ws_daemon: Any, uri: str, reason: str) -> None:
    d, _ = ws_daemon
    async with client(d) as c:
        err = await rpc_failure(c, uri)
    assert err.code == "PERMISSION_DENIED"
    assert reason in err.details["reason"]


async def test_workspace_none_configured_refuses_relative_uris(ws_daemon: Any) -> None:
    d, _ = ws_daemon
    async with client(d, d.other_token) as c:  # bob: not listed, default_workspace ""
        err = await rpc_failure(c, "file:top.txt")
    assert (err.rpc_code, err.code) == (-32602, "INVALID_ARGUMENT")


# -- many reads on one client; sync wrapper; SDK -----------------------------------------------------


async def test_gather_50_resource_reads_on_one_client(daemon: Daemon, tmp_path: Path) -> None:
    paths = []
    for i in range(50):
        p = tmp_path / f"f{i:02}.txt"
        p.write_text(f"file {i}\n" * (i + 1))
        paths.append(p)
    async with client(daemon) as c:
        items = await asyncio.gather(*(c.read_resource(uri_of(p), include_metadata=True) for p in paths))
    for i, item in enumerate(items):
        assert item["text"] == f"file {i}\n" * (i + 1)
        assert item["_meta"]["lines"] == i + 1


def test_read_resource_sync_wrapper(daemon: Daemon, tmp_path: Path) -> None:
    p = tmp_path / "s.txt"
    p.write_text("one\ntwo\n")
    item = read_resource_sync(daemon.url, daemon.token, daemon.cacert, uri_of(p), line_range=(2, 2))
    assert item["text"] == "two\n"
    with pytest.raises(ToolFailed) as info:
        read_resource_sync(daemon.url, daemon.token, daemon.cacert, uri_of(tmp_path / "nope"))
    assert info.value.code == "FILE_NOT_FOUND" and info.value.exit_code == 1


def sdk_factory(cafile: str) -> Any:
    def make(headers: dict[str, str] | None = None, timeout: httpx2.Timeout | None = None,
             auth: httpx2.Auth | None = None) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth,
                                  verify=ssl.create_default_context(cafile=cafile))

    return make


async def test_sdk_reads_resource_template_and_resource_with_metadata(daemon: Daemon, tmp_path: Path) -> None:
    data = b"#!/bin/sh\necho hi\n"
    p = tmp_path / "run"
    p.write_bytes(data)
    os.chmod(p, 0o644)
    async with sse_client(f"{daemon.url}/sse", headers=daemon.auth(), timeout=20,
                          httpx_client_factory=sdk_factory(daemon.cacert)) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            templates = await session.list_resource_templates()
            assert [t.uri_template for t in templates.resource_templates] == ["file:///{+path}"]
            result = await session.read_resource(uri_of(p))
    (item,) = result.contents
    dumped = item.model_dump(by_alias=True)
    assert dumped["text"] == data.decode() and dumped["mimeType"] == "text/plain"
    assert dumped["_meta"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert dumped["_meta"]["language"] == "shell"


async def test_resource_reads_count_against_principal_limits(daemon_factory: Callable[..., Daemon],
                                                             tmp_path: Path) -> None:
    d = daemon_factory(limits={"default": {"requests_per_day": 2, "max_file_bytes": 16}})
    (tmp_path / "small").write_text("tiny\n")
    (tmp_path / "big").write_text("x" * 100)
    async with client(d) as c:
        assert (await c.read_resource(uri_of(tmp_path / "small")))["text"] == "tiny\n"
        too_big = await rpc_failure(c, uri_of(tmp_path / "big"))
        spent = await rpc_failure(c, uri_of(tmp_path / "small"))
    assert too_big.code == "FILE_TOO_LARGE"
    assert spent.code == "RATE_LIMITED" and spent.details["retryAfter"] > 0


async def _mcp_read(d: PrivsepDaemon, who: str, uri: str, **params: Any) -> dict[str, Any]:
    """``resources/read`` of ``uri`` as ``who`` over a fresh /mcp session; the reply object."""
    auth = {"Authorization": f"Bearer {d.tokens[who]}", "Accept": "application/json",
            "Content-Type": "application/json"}
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=d.cacert), base_url=d.url, timeout=60) as c:
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "a13", "version": "1"}}}
        r = await c.post("/mcp", json=init, headers=auth)
        assert r.status_code == 200, r.text
        h = {**auth, "Mcp-Session-Id": r.headers["mcp-session-id"]}
        await c.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=h)
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "resources/read",
                                       "params": {"uri": uri, **params}}, headers=h)
        assert r.status_code == 200, r.text
        reply: dict[str, Any] = r.json()
        await c.delete("/mcp", headers=h)
        return reply


def _refused(reply: dict[str, Any], code: str) -> None:
    assert "result" not in reply, reply
    assert reply["error"]["data"]["code"] == code, reply
    assert SECRET_TEXT not in json.dumps(reply) and "do not leak" not in json.dumps(reply)


async def test_resource_symlinks_and_tricks_leak_nothing_across_accounts(privsep_daemon: PrivsepDaemon) -> None:
    """The file resource on the real daemon (docs/REFERENCE.md §1.6, §3, §4.3–4.4, §5.1): a symlink alice
    plants in her own home (her workspace) to bob's private file, or to root's secret, reads as
    alice's account would (the kernel refuses); ``..``, percent-encoding and double slashes in a
    privileged URI are judged on the cleaned path (outside the grant: refused), and a privileged
    read through alice's symlink is refused though the link's target is granted."""
    d = privsep_daemon
    alice, bob = d.accounts["alice"], d.accounts["bob"]
    private = Path(bob.home) / "a13-private.txt"
    private.write_text(SECRET_TEXT)
    os.chown(private, bob.uid, bob.uid)
    os.chmod(private, 0o600)
    links = {"to-bob": private, "to-secret": d.secret, "to-log": d.log_file}
    for name, target in links.items():
        link = Path(alice.home) / f"a13-{name}"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        os.lchown(link, alice.uid, alice.uid)
    try:
        for uri in ("file:a13-to-bob", f"file://{alice.home}/a13-to-bob", f"file://{private}",
                    "file:a13-to-secret", f"file://{d.secret}"):
            _refused(await _mcp_read(d, "alice", uri), "PERMISSION_DENIED")
        app = str(d.app)
        for uri in (f"file://{app}/../secret", f"file://{app}/%2e%2e/secret", f"file://{app}%2F..%2Fsecret",
                    f"file:///{app}//..//secret", f"file://{app}-evil/x", f"file://{alice.home}/a13-to-log",
                    "file:a13-to-log", f"file://{alice.home}/a13-to-secret"):
            reply = await _mcp_read(d, "alice", uri, privileged=True)
            _refused(reply, "PERMISSION_DENIED")
        # existence is not revealed: a missing file outside the grant, or inside a folder alice
        # cannot search, is refused exactly like a present one
        for uri, privileged in ((f"file://{app}-evil/x", True), (f"file://{app}-evil/missing", True),
                                (f"file://{app}/log.txt", False), (f"file://{app}/missing", False)):
            reply = await _mcp_read(d, "alice", uri, privileged=privileged)
            _refused(reply, "PERMISSION_DENIED")
        ok = await _mcp_read(d, "alice", f"file://{app}//log.txt?privileged=true")
        assert ok["result"]["contents"][0]["text"] == LOG_TEXT
        _refused(await _mcp_read(d, "bob", f"file://{app}/log.txt", privileged=True), "PERMISSION_DENIED")
    finally:
        for name in links:
            (Path(alice.home) / f"a13-{name}").unlink(missing_ok=True)
        private.unlink(missing_ok=True)
