"""Benchmark of what the shared benchmark leaves out: many accounts at once,
``files/find`` on a large tree, resource reads, and the cost of TLS session setup.

Run as root (it creates OS accounts and starts the root helper), from the project's root::

    .venv/bin/python tests/bench/bench_scenarios.py [--only accounts,find,resources,tls]
        [--accounts 4] [--sessions 2] [--reads 200] [--dirs 100] [--files 200] [--calls 300]

It starts the real privilege-separated daemon of ``tests/support/privsep_fixture.py`` (root
helper, front as the service user ``mcpd``, workers as each principal's own OS account) on a
free 127.0.0.1 port, adds ``--accounts`` principals (each its own OS account, token and
workers), and runs:

- ``accounts``: ``--accounts`` principals x ``--sessions`` sessions each, ``--reads`` reads of a
  4 KiB file per session, all at once; then the same number of sessions under one principal, so
  the two can be read as a ratio. Reports calls/s, latency percentiles and the workers each
  account ended with.
- ``find``: ``files/find`` (name ``*.log``) under a tree of ``--dirs`` x ``--files`` entries;
  reports the time per call, entries scanned per second and the answer's size.
- ``resources``: ``resources/read`` of ``file:///...`` against ``files/read`` of the same 4 KiB
  file, ``--calls`` each on one session.
- ``tls``: ``tools/call`` over Streamable HTTP (``/mcp``), ``--calls`` sequential calls each with
  one kept-alive connection (``reuse``), a new TCP + full TLS handshake per call (``new``), and a
  new TCP connection resuming the TLS session (``resumed``); setup cost = p50(new) - p50(reuse).

Every answer is checked; every loop is bounded in count and by a 300 s deadline. It prints
figures and decides nothing (not a test: pytest collects only ``test_*.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pwd
import signal
import socket
import ssl
import statistics
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcpd.client.api import Client, text_of  # noqa: E402
from mcpd.common import identity  # noqa: E402
from tests.bench.bench_load import one_session, percentile  # noqa: E402
from tests.support.osaccounts import AccountFactory  # noqa: E402
from tests.support.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep  # noqa: E402

DEADLINE_SECONDS = 300.0
SECTIONS = ("accounts", "find", "resources", "tls")


def row(label: str, latencies: list[float], wall: float | None = None) -> str:
    """One line of figures: calls, calls/s (by wall time when given, else by summed latency), p50/p99/max ms."""
    rate = len(latencies) / (wall if wall is not None else sum(latencies))
    return (f"  {label:<34} calls={len(latencies):>5}  calls/s={rate:8.1f}  "
            f"p50={statistics.median(latencies) * 1000:7.2f} ms  p99={percentile(latencies, 0.99) * 1000:7.2f} ms  "
            f"max={max(latencies) * 1000:7.2f} ms")


# --------------------------------------------------------------------------- setup


def add_principals(d: PrivsepDaemon, factory: AccountFactory, count: int) -> dict[str, str]:
    """Create ``count`` OS accounts and a principal with a token for each; return ``{principal: token}``.

    The helper reads ``users.yaml`` again on SIGHUP; this waits (bounded) until every new token
    opens a session."""
    path = d.state_dir / "users.yaml"
    users = identity.load_users(path)
    tokens: dict[str, str] = {}
    for i in range(count):
        account = factory.user()
        name = f"bench{i}"
        tokens[name], rec = identity.new_token()
        users[name] = identity.UserRecord(name=name, os_user=account.name, tokens=[rec])
        d.accounts[name] = account
    identity.save_users(path, users)
    assert d.helper is not None
    d.helper.send_signal(signal.SIGHUP)
    end = time.monotonic() + 20
    for token in tokens.values():
        while True:
            try:
                asyncio.run(_probe(d, token))
                break
            except Exception:
                if time.monotonic() > end:
                    raise
                time.sleep(0.2)
    return tokens


async def _probe(d: PrivsepDaemon, token: str) -> None:
    async with Client(d.url, token, d.cacert, timeout=10) as c:
        await c.list_tools()


def make_public_dir(d: PrivsepDaemon) -> Path:
    """A folder every test account may read (the fixture's tree is root-only)."""
    pub = d.srv / "pub"
    pub.mkdir(mode=0o755, exist_ok=True)
    os.chmod(pub, 0o755)
    return pub


def make_tree(root: Path, dirs: int, files: int) -> int:
    """``dirs`` folders of ``files`` empty files each (one in ten named ``*.log``); returns the entries made."""
    root.mkdir(mode=0o755)
    for i in range(dirs):
        sub = root / f"d{i:04d}"
        sub.mkdir(mode=0o755)
        for j in range(files):
            (sub / (f"f{j:05d}.log" if j % 10 == 0 else f"f{j:05d}.txt")).touch(mode=0o644)
    return dirs * (files + 1)


# --------------------------------------------------------------------------- sections


async def timed_gather(jobs: list[Awaitable[list[float]]]) -> tuple[list[float], float]:
    t0 = time.perf_counter()
    async with asyncio.timeout(DEADLINE_SECONDS):
        results = await asyncio.gather(*jobs)
    return [x for r in results for x in r], time.perf_counter() - t0


def workers_by_account(d: PrivsepDaemon, names: list[str]) -> dict[str, int]:
    """Live workers of each principal's account (the fixture's own count)."""
    return {n: len(d.workers(n)) for n in names}


def section_accounts(d: PrivsepDaemon, tokens: dict[str, str], pub: Path, sessions: int, reads: int) -> None:
    target = pub / "small.txt"
    text = ("0123456789abcdef" * 4 + "\n") * 63  # 4095 bytes
    target.write_text(text)
    os.chmod(target, 0o644)
    names = sorted(tokens)

    def jobs(per: list[str], n: int) -> list[Awaitable[list[float]]]:
        return [one_session(d.url, tokens[p], d.cacert, str(target), text, n, "sse") for p in per for _ in range(sessions)]

    asyncio.run(timed_gather(jobs(names, 10)))  # warm-up: every account's workers spawned
    asyncio.run(timed_gather(jobs([names[0]] * len(names), 10)))  # and the one account's, as many
    many, many_wall = asyncio.run(timed_gather(jobs(names, reads)))
    one = [names[0]] * len(names)
    single, single_wall = asyncio.run(timed_gather(jobs(one, reads)))
    spread = workers_by_account(d, names)
    print(f"accounts: {len(names)} accounts x {sessions} sessions, {reads} reads of 4 KiB each, all at once")
    print(row(f"{len(names)} accounts", many, many_wall))
    print(row(f"1 account, same {len(names) * sessions} sessions", single, single_wall))
    print(f"  ratio (many accounts / one account, calls/s): {(len(many) / many_wall) / (len(single) / single_wall):.2f}")
    print(f"  live workers per account after both runs: {spread}")


def section_find(d: PrivsepDaemon, token: str, pub: Path, dirs: int, files: int, calls: int) -> None:
    root = pub / "tree"
    t0 = time.perf_counter()
    entries = make_tree(root, dirs, files)
    made = time.perf_counter() - t0

    async def go() -> tuple[list[float], dict[str, Any]]:
        out: list[float] = []
        last: dict[str, Any] = {}
        async with Client(d.url, token, d.cacert, timeout=120) as c:
            for i in range(calls + 1):
                t1 = time.perf_counter()
                last = await c.call_tool("files/find", {"root": str(root), "name": "*.log", "max_results": 10000})
                if i:
                    out.append(time.perf_counter() - t1)
        return out, last

    lat, last = asyncio.run(go())
    sc = last.get("structuredContent") or {}
    matches, scanned = len(sc.get("matches", [])), sc.get("scanned", 0)
    size = len(json.dumps(last))
    print(f"find: files/find name=*.log under {entries} entries ({dirs} dirs; tree made in {made:.1f} s)")
    print(row("files/find", lat))
    print(f"  matches={matches} scanned={scanned} entries/s={scanned / statistics.median(lat):,.0f} "
          f"answer={size / 1024:.0f} KiB")


def section_resources(d: PrivsepDaemon, token: str, pub: Path, calls: int) -> None:
    target = pub / "res.txt"
    text = ("resource line " + "y" * 49 + "\n") * 64
    target.write_text(text)
    os.chmod(target, 0o644)

    async def go() -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"resources/read": [], "files/read": []}
        async with Client(d.url, token, d.cacert, timeout=60) as c:
            for _ in range(20):
                await c.read_resource(f"file://{target}")
                await c.call_tool("files/read", {"path": str(target)})
            for start in range(0, calls, 50):  # interleaved blocks: both see the same machine
                for _ in range(min(50, calls - start)):
                    t0 = time.perf_counter()
                    res = await c.read_resource(f"file://{target}")
                    out["resources/read"].append(time.perf_counter() - t0)
                    if res["text"] != text:
                        raise RuntimeError("resources/read came back with the wrong content")
                for _ in range(min(50, calls - start)):
                    t0 = time.perf_counter()
                    r = await c.call_tool("files/read", {"path": str(target)})
                    out["files/read"].append(time.perf_counter() - t0)
                    if text_of(r) != text:
                        raise RuntimeError("files/read came back with the wrong content")
        return out

    lat = asyncio.run(go())
    print(f"resources: one session, {calls} sequential calls each, 4 KiB file")
    for k, v in lat.items():
        print(row(k, v))


class Http:
    """A minimal blocking HTTP/1.1 client over TLS for ``POST /mcp`` (the client's cost stays small
    and the same in every mode, and the TLS session object is ours to resume)."""

    def __init__(self, url: str, cacert: str, token: str) -> None:
        host_port = url.split("://", 1)[1]
        self.host, port = host_port.rsplit(":", 1)
        self.port = int(port)
        self.ctx = ssl.create_default_context(cafile=cacert)
        self.token = token
        self.sock: ssl.SSLSocket | None = None
        self.session: ssl.SSLSession | None = None
        self.buf = b""
        self.resumed = 0

    def connect(self, resume: bool) -> None:
        self.close()
        raw = socket.create_connection((self.host, self.port), timeout=30)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self.ctx.wrap_socket(raw, server_hostname=self.host,
                                         session=self.session if resume else None)
        self.resumed += int(self.sock.session_reused)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buf = None, b""

    def post(self, body: dict[str, Any], session_id: str | None) -> tuple[dict[str, str], Any]:
        assert self.sock is not None
        data = json.dumps(body).encode()
        head = ["POST /mcp HTTP/1.1", f"Host: {self.host}:{self.port}", f"Authorization: Bearer {self.token}",
                "Content-Type: application/json", "Accept: application/json, text/event-stream",
                f"Content-Length: {len(data)}"]
        if session_id:
            head.append(f"Mcp-Session-Id: {session_id}")
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        raw, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        n = int(headers.get("content-length", "0"))
        while len(self.buf) < n:
            self._fill()
        payload, self.buf = self.buf[:n], self.buf[n:]
        if status not in (200, 202):
            raise RuntimeError(f"POST /mcp answered {status}: {payload[:200]!r}")
        self.session = self.sock.session  # a TLS 1.3 ticket arrives after the handshake
        return headers, json.loads(payload) if payload else None

    def _fill(self) -> None:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed")
        self.buf += chunk


def section_tls(d: PrivsepDaemon, token: str, pub: Path, calls: int) -> None:
    target = pub / "tls.txt"
    text = "tls setup\n" * 100
    target.write_text(text)
    os.chmod(target, 0o644)
    h = Http(d.url, d.cacert, token)
    h.connect(resume=False)
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}
    headers, _ = h.post(init, None)
    sid = headers["mcp-session-id"]
    h.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "files/read", "arguments": {"path": str(target)}}}
    out: dict[str, list[float]] = {"reuse": [], "new": [], "resumed": []}
    deadline = time.monotonic() + DEADLINE_SECONDS
    for rnd in range(calls // 50 + 1):
        for mode in out:
            for _ in range(min(50, calls - rnd * 50)):
                if time.monotonic() > deadline:
                    break
                t0 = time.perf_counter()
                if mode != "reuse":
                    h.connect(resume=mode == "resumed")
                _, reply = h.post(call, sid)
                out[mode].append(time.perf_counter() - t0)
                if reply["result"]["content"][0]["text"] != text:
                    raise RuntimeError("wrong content")
            if mode != "reuse":
                h.connect(resume=False)  # the next block starts on a kept connection
    h.close()
    print(f"tls: tools/call over /mcp, {calls} sequential calls per mode, 1 KiB file ({ssl.OPENSSL_VERSION})")
    for k, v in out.items():
        print(row(k, v))
    setup = statistics.median(out["new"]) - statistics.median(out["reuse"])
    resumed = statistics.median(out["resumed"]) - statistics.median(out["reuse"])
    print(f"  setup per call: full handshake {setup * 1000:.2f} ms, resumed {resumed * 1000:.2f} ms "
          f"(resumptions accepted: {h.resumed} of {len(out['resumed'])})")


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {SECTIONS}")
    parser.add_argument("--accounts", type=int, default=4, help="principals, each its own OS account (1..16)")
    parser.add_argument("--sessions", type=int, default=2, help="sessions per account (1..16)")
    parser.add_argument("--reads", type=int, default=200, help="reads per session (1..5000)")
    parser.add_argument("--dirs", type=int, default=100, help="folders in the find tree (1..1000)")
    parser.add_argument("--files", type=int, default=200, help="files per folder (1..1000)")
    parser.add_argument("--calls", type=int, default=300, help="calls per mode in find/resources/tls (1..5000)")
    ns = parser.parse_args()
    only = [s for s in ns.only.split(",") if s]
    bad = [s for s in only if s not in SECTIONS]
    limits = [("accounts", 1, 16), ("sessions", 1, 16), ("reads", 1, 5000), ("dirs", 1, 1000), ("files", 1, 1000),
              ("calls", 1, 5000)]
    for name, low, high in limits:
        if not low <= getattr(ns, name) <= high:
            parser.error(f"--{name} must be {low}..{high}")
    if bad:
        parser.error(f"unknown section(s): {', '.join(bad)}")
    if os.geteuid() != 0:
        print("bench_scenarios: needs root (starts the root helper, creates OS accounts)", file=sys.stderr)
        return 2
    factory = AccountFactory()
    d = None
    try:
        d = start_privsep(factory, workers={"per_account": 4, "timeout_seconds": 60})
        tokens = add_principals(d, factory, ns.accounts)
        pub = make_public_dir(d)
        first = tokens[sorted(tokens)[0]]
        print(f"mcpd scenarios on {d.url} (front as {pwd.getpwuid(d.service.pw_uid).pw_name}, "
              f"workers as {ns.accounts} test accounts; python {sys.version.split()[0]})")
        if "accounts" in only:
            section_accounts(d, tokens, pub, ns.sessions, ns.reads)
        if "find" in only:
            section_find(d, first, pub, ns.dirs, ns.files, min(ns.calls, 20))
        if "resources" in only:
            section_resources(d, first, pub, ns.calls)
        if "tls" in only:
            section_tls(d, first, pub, ns.calls)
    finally:
        if d is not None:
            stop_privsep(d)
        factory.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
