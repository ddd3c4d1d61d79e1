"""Shared fixtures: the real daemon over TLS on 127.0.0.1, and a small raw HTTP/SSE helper.

``daemon`` (session scope) and ``daemon_factory`` (per test, config overrides) start
``python -m mcpd.front.server --config FILE`` as a subprocess with a temp state folder holding a
private CA, a server certificate, ``mcpd.yaml`` and ``users.yaml`` with two principals:
``alice`` (``token``) and ``bob`` (``other_token``), both mapped to the current OS account.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import pwd
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from mcpd.admin import certs
from mcpd.common import identity
from tests.support.net import free_port as _free_port

START_TIMEOUT = 30.0

#: The environment of a plain fixture front. As root it needs the escape from "the front never runs
#: as root" (mcpd/front/server.py): these fronts run without a helper, principals mapped to the
#: current account, reading files in that account's private temporary folders. The privilege
#: separation fixture (tests/support/privsep_fixture.py) runs its front as the service user.
FRONT_ENV = {**os.environ, "MCPD_ALLOW_ROOT_FRONT": "1"}
EVENT_TIMEOUT = 20.0


def pytest_configure(config: pytest.Config) -> None:
    """Started as an asynchronous command of a non-interactive shell (``bash scripts/test.sh >
    log 2>&1 &`` from a script), pytest has SIGINT and SIGQUIT ignored, and every process a test
    starts would inherit that (a daemon a test stops with SIGINT would not stop). Give them the
    dispositions of a run in the foreground."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


# -- root-only tests: run, or fail, as root -----------------------------------------------------------

#: Fixtures that need root (the root helper, real OS accounts): a test using one, directly or
#: through another fixture, is root-only, as if marked ``root``.
ROOT_FIXTURES = frozenset({"privsep_daemon", "os_accounts"})
#: Where those fixtures and their helpers live: a skip raised in these files comes from them.
ROOT_FIXTURE_FILES = frozenset({Path(__file__).parent / "support" / "osaccounts.py",
                                Path(__file__).parent / "support" / "privsep_fixture.py"})


#: Test files that install or purge mcpd system-wide (the .deb into /opt, /etc/mcpd and the
#: service accounts every privilege-separation test shares): marked ``serial``, so
#: ``scripts/test.sh`` runs them alone after the parallel part.
SERIAL_FILES = frozenset({"test_package.py"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``root`` every test that uses one of :data:`ROOT_FIXTURES` (so ``-m "not root"``
    leaves it out, and the rule of :func:`pytest_runtest_makereport` applies to it), and
    ``serial`` every test of :data:`SERIAL_FILES`."""
    for item in items:
        if item.path.name in SERIAL_FILES and item.get_closest_marker("serial") is None:
            item.add_marker(pytest.mark.serial)
        if item.get_closest_marker("root") is None and ROOT_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.root)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                               call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Not root, a root-only test skips; as root it must run: its skip (a tool missing, a fixture
    that could not start) is reported as a failure, so that a run as root (CI's) never hides a
    root-only test that did not run. Root-only: marked ``root`` (or using a root fixture, see
    :func:`pytest_collection_modifyitems`), or skipped from one of :data:`ROOT_FIXTURE_FILES`.

    The opt-out, for a skip that is right even as root: ``@pytest.mark.root_may_skip(reason)``
    on the test, the reason saying why."""
    report: pytest.TestReport = yield
    if not report.skipped or hasattr(report, "wasxfail") or os.geteuid() != 0:
        return report
    if item.get_closest_marker("root_may_skip") is not None:
        return report
    from_fixture = call.excinfo is not None and any(
        Path(str(entry.path)) in ROOT_FIXTURE_FILES for entry in call.excinfo.traceback)
    if item.get_closest_marker("root") is not None or from_fixture:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"a root-only test skipped in a run as root ({report.when}): {reason}\n"
                           "as root it must run; mark it root_may_skip(reason) only if the skip is right even as root")
    return report


@pytest.fixture(autouse=True, scope="module")
def _collect_a_files_garbage() -> Iterator[None]:
    """Collect garbage once a test file's tests are done, so that a socket or transport a file
    left unclosed is reported (as ResourceWarning, an error here) in that file's last test,
    not in whichever test of another file the same process happens to run next."""
    yield
    gc.collect()


@dataclass
class Daemon:
    """A running ``mcpd serve`` subprocess and what a client needs to reach it."""

    url: str
    token: str
    other_token: str
    cacert: str
    state_dir: Path
    config_path: Path
    proc: subprocess.Popen[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("https://").split(":")
        return host, int(port)

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.cacert)

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}

    def log(self) -> str:
        return (self.state_dir / "daemon.log").read_text(errors="replace")


def _wait_ready(d: Daemon) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    host, port = d.host_port
    while time.monotonic() < deadline:
        if d.proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {d.proc.returncode}:\n{d.log()}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"daemon did not start:\n{d.log()}")


def start_daemon(state_dir: Path, **overrides: Any) -> Daemon:
    """Create a state folder under ``state_dir`` and start the daemon; ``overrides`` go into mcpd.yaml."""
    state_dir.mkdir(parents=True, exist_ok=True)
    pki = certs.make_pki(state_dir, ["localhost", "127.0.0.1"])
    me = pwd.getpwuid(os.geteuid()).pw_name
    users: dict[str, identity.UserRecord] = {}
    tokens: dict[str, str] = {}
    for name in ("alice", "bob"):
        plain, rec = identity.new_token()
        tokens[name] = plain
        users[name] = identity.UserRecord(name=name, os_user=me, tokens=[rec])
    identity.save_users(state_dir / "users.yaml", users)
    port = _free_port()
    cfg: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "tls": {"cert": str(pki.server_cert), "key": str(pki.server_key)},
        "users_file": "users.yaml",
        "grants_file": "mcp-sudo.yaml",
        "helper_socket": "",
        "audit_log": "audit.jsonl",
        "access_log": "access.jsonl",
        "state_dir": ".",
    }
    cfg.update(overrides)
    config_path = state_dir / "mcpd.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    log = open(state_dir / "daemon.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcpd.front.server", "--config", str(config_path)],
        stdout=log, stderr=subprocess.STDOUT, cwd=state_dir, env=FRONT_ENV,
    )
    log.close()
    d = Daemon(f"https://127.0.0.1:{port}", tokens["alice"], tokens["bob"], str(pki.ca_cert), state_dir,
               config_path, proc)
    try:
        _wait_ready(d)
    except BaseException:
        stop_daemon(d)
        raise
    return d


def stop_daemon(d: Daemon) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    if d.proc.poll() is None:
        d.proc.terminate()
        try:
            d.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("mcpd"), keepalive_seconds=1.0)
    yield d
    stop_daemon(d)


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def make(**overrides: Any) -> Daemon:
        d = start_daemon(tmp_path / f"d{len(started)}", **overrides)
        started.append(d)
        return d

    yield make
    for d in started:
        stop_daemon(d)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- raw HTTP/SSE helper ---------------------------------------------------------------------------


@dataclass
class Event:
    """One SSE event; ``event == "comment"`` for a comment line (``data`` is its text)."""

    event: str
    data: str


class SseSession:
    """A raw client session: ``GET /sse`` read incrementally by a background task, POSTs by hand.

    Use as ``async with SseSession(daemon) as s:``; ``s.endpoint`` is the endpoint event's data.
    """

    def __init__(self, d: Daemon, token: str | None = None, client: httpx.AsyncClient | None = None) -> None:
        self.d = d
        self.token = token or d.token
        self._own_client = client is None
        self.client = client or httpx.AsyncClient(verify=d.ssl_context(), timeout=EVENT_TIMEOUT)
        self.events: asyncio.Queue[Event | None] = asyncio.Queue()
        self.endpoint = ""
        self._next_id = 0
        self._reader: asyncio.Task[None] | None = None
        self._stream_cm: Any = None
        self.response: httpx.Response | None = None
        self.pending: dict[Any, Any] = {}

    async def __aenter__(self) -> SseSession:
        self._stream_cm = self.client.stream("GET", f"{self.d.url}/sse", headers=self.d.auth(self.token))
        self.response = await self._stream_cm.__aenter__()
        if self.response.status_code != 200:
            raise RuntimeError(f"GET /sse: {self.response.status_code}")
        self._reader = asyncio.create_task(self._read())
        ev = await self.next_event()
        if ev.event != "endpoint":
            raise RuntimeError(f"first event {ev}")
        self.endpoint = ev.data
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
            self._reader = None
        if self._stream_cm is not None:
            await self._stream_cm.__aexit__(None, None, None)
            self._stream_cm = None
        if self._own_client:
            await self.client.aclose()

    async def _read(self) -> None:
        assert self.response is not None
        event, data = "message", []
        try:
            async for line in self.response.aiter_lines():
                if line.startswith(":"):
                    await self.events.put(Event("comment", line[1:].strip()))
                elif line == "":
                    if data:
                        await self.events.put(Event(event, "\n".join(data)))
                    event, data = "message", []
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
        except (httpx.HTTPError, asyncio.CancelledError):
            pass
        finally:
            self.events.put_nowait(None)

    async def next_event(self, timeout: float = EVENT_TIMEOUT, skip_comments: bool = True) -> Event:
        """The next event (comments skipped unless asked); raises ``EOFError`` when the stream ended."""
        while True:
            ev = await asyncio.wait_for(self.events.get(), timeout)
            if ev is None:
                self.events.put_nowait(None)
                raise EOFError("stream ended")
            if ev.event == "comment" and skip_comments:
                continue
            return ev

    async def next_message(self, timeout: float = EVENT_TIMEOUT) -> Any:
        ev = await self.next_event(timeout)
        if ev.event != "message":
            raise RuntimeError(f"unexpected event {ev}")
        return json.loads(ev.data)

    async def post(self, body: Any, raw: bytes | None = None, headers: dict[str, str] | None = None,
                   token: str | None = None, path: str | None = None) -> httpx.Response:
        h = {"Content-Type": "application/json", **self.d.auth(token or self.token)}
        h.update(headers or {})
        content = raw if raw is not None else json.dumps(body).encode()
        return await self.client.post(f"{self.d.url}{path or self.endpoint}", content=content, headers=h)

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    async def request(self, method: str, params: dict[str, Any] | None = None, req_id: Any = None) -> Any:
        """POST one request and wait for the reply with its id (other messages are kept in ``pending``)."""
        rid = self.new_id() if req_id is None else req_id
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        r = await self.post(msg)
        if r.status_code != 202:
            raise RuntimeError(f"POST {method}: {r.status_code} {r.text}")
        return await self.reply(rid)

    async def reply(self, rid: Any) -> Any:
        key = json.dumps(rid)
        while key not in self.pending:
            m = await self.next_message()
            if isinstance(m, dict) and "id" in m:
                self.pending[json.dumps(m["id"])] = m
        return self.pending.pop(key)

    async def initialize(self, version: str = "2025-06-18") -> Any:
        reply = await self.request("initialize", {
            "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}})
        await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return reply


def open_raw(d: Daemon, timeout: float = EVENT_TIMEOUT) -> ssl.SSLSocket:
    """A raw TLS socket to the daemon (for requests httpx will not send, or a client that stops reading)."""
    host, port = d.host_port
    sock = socket.create_connection((host, port), timeout=timeout)
    return d.ssl_context().wrap_socket(sock, server_hostname=host)


def read_status(sock: ssl.SSLSocket) -> int:
    """Read a response's status line and headers from ``sock``; return the status code."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            break
        buf += chunk
    return int(buf.split(b" ", 2)[1])


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants that are alive now (from ``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def tree_rss_kib(pid: int) -> int:
    """Resident memory (KiB, ``VmRSS``) of ``pid`` and all its descendants together."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        except OSError:
            continue
    return total


def slow_read(folder: Path, rid: Any) -> dict[str, Any]:
    """A ``files/read`` request that keeps a worker busy for seconds: a line far past the end of a
    16 GiB file that is a hole (counting its lines takes that long; it holds no disk space),
    written into ``folder`` (made readable to the daemon's workers)."""
    huge = folder / "huge.log"
    if not huge.exists():
        with open(huge, "wb") as f:
            f.write(b"a\n" * 8192)
            f.truncate(16 * 1024 ** 3)
        os.chmod(folder, 0o755)
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
            "params": {"name": "files/read", "arguments": {"path": str(huge), "start_line": 10 ** 9}}}
