"""Backpressure, not disconnection, for a client that reads (the outgoing queue's bounds).

A session's outgoing queue is bounded in bytes (``session_queue_bytes``, 16 MiB by default). Large
answers of calls running side by side on one ``/sse`` session all arrive whole to a client that
reads: a session whose queue holds its budget takes no new call until its client has taken some of
it (the call waits for room, bounded by its deadline), and only a client that takes nothing for
``connections.idle_seconds`` while its queue is full is disconnected.

Every member of a batch gets an answer, or the batch (over ``max_batch``) is refused whole with
one error.

Each test drives the real daemon over TLS; the privileged variant runs as root against the real
root helper and policy process. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Daemon
from tests.support.metrics import samples
from tests.support.net import free_port
from tests.support.privsep_fixture import PrivsepDaemon, running_privsep

MIB = 1024 * 1024
ANSWER = 5 * MIB  # bytes of text each large read returns
PARALLEL = 24
# 2025-03-26: the batches of these tests end with 2025-06-18
INIT = {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
    "protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "backpressure", "version": "1"}}}
WAIT = 120.0  # seconds any one test may wait for its answers (a shared 2-core machine)


def five_mib_file(path: Path) -> bytes:
    """Write a file of :data:`ANSWER` bytes of varied text lines at ``path``; its bytes."""
    line = b"%07d the quick brown fox jumps over the lazy dog, again and again and again\n"
    data = b"".join(line % i for i in range(ANSWER // len(line % 0) + 1))[:ANSWER - 1] + b"\n"
    path.write_bytes(data)
    return data


def read_call(path: Path, rid: Any, privileged: bool = False) -> dict[str, Any]:
    args: dict[str, Any] = {"path": str(path), "offset": 0, "limit": ANSWER}
    if privileged:
        args["privileged"] = True
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": "files/read", "arguments": args}}


class RssSampler:
    """Samples a process's resident memory (``VmRSS``, KiB) in a thread until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.base = self.now()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, self.now())
            except (OSError, StopIteration):
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.base) / 1024


class SseReader:
    """A ``GET /sse`` stream over raw TLS, read by a thread as fast as it can: the chunked body is
    decoded as it comes and each ``message`` event's data parsed into :attr:`messages`.

    Args:
        url: the daemon's ``https://host:port``. cafile: its CA. token: the bearer.
        pause: seconds to sleep after every ``pause_every`` bytes read (0: never), for a client
            that reads in bursts.
    """

    def __init__(self, url: str, cafile: str, token: str, pause: float = 0.0, pause_every: int = 8 * MIB) -> None:
        host, port = url.removeprefix("https://").split(":")
        tcp = socket.create_connection((host, int(port)), timeout=WAIT)
        self.sock = ssl.create_default_context(cafile=cafile).wrap_socket(tcp, server_hostname=host)
        self.sock.sendall(f"GET /sse HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
        self.pause, self.pause_every = pause, pause_every
        self.messages: list[Any] = []
        self.ended = False
        self.endpoint = ""
        self._got = threading.Condition()
        self._raw = bytearray()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        with self._got:
            assert self._got.wait_for(lambda: self.endpoint or self.ended, 30), "no endpoint event"
        assert self.endpoint, "the stream ended before its endpoint event"

    def _recv(self) -> bool:
        try:
            chunk = self.sock.recv(1 << 20)
        except (OSError, ssl.SSLError):
            return False
        self._raw += chunk
        return bool(chunk)

    def _run(self) -> None:
        try:
            self._read()
        finally:
            with self._got:
                self.ended = True
                self._got.notify_all()

    def _read(self) -> None:
        raw = self._raw
        while b"\r\n\r\n" not in raw:
            if not self._recv():
                return
        head, _, rest = bytes(raw).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        raw[:] = rest
        body = bytearray()
        scanned = 0  # bytes of body already searched for an event's end
        since_pause = 0
        while True:
            while b"\r\n" not in raw[:32]:  # a chunk's size line
                if not self._recv():
                    return
            size_line, _, _ = bytes(raw[:32]).partition(b"\r\n")
            size = int(size_line, 16)
            start = len(size_line) + 2
            if size == 0:
                return
            while len(raw) < start + size + 2:
                if not self._recv():
                    return
            body += raw[start:start + size]
            del raw[:start + size + 2]
            since_pause += size
            while (end := body.find(b"\n\n", max(0, scanned - 1))) >= 0:
                self._event(bytes(body[:end]))
                del body[:end + 2]
                scanned = 0
            scanned = len(body)
            if self.pause and since_pause >= self.pause_every:
                since_pause = 0
                time.sleep(self.pause)

    def _event(self, event: bytes) -> None:
        kind, data = "message", []
        for line in event.split(b"\n"):
            if line.startswith(b"event: "):
                kind = line[7:].decode()
            elif line.startswith(b"data: "):
                data.append(line[6:])
        with self._got:
            if kind == "endpoint":
                self.endpoint = b"".join(data).decode()
            elif kind == "message" and data:
                self.messages.append(json.loads(b"\n".join(data)))
            self._got.notify_all()

    def wait(self, predicate: Callable[[list[Any]], bool], seconds: float = WAIT) -> bool:
        """Wait (bounded) until ``predicate(messages)`` holds or the stream ends."""
        with self._got:
            self._got.wait_for(lambda: predicate(self.messages) or self.ended, seconds)
            return predicate(self.messages)

    def replies(self) -> dict[Any, Any]:
        with self._got:
            return {m["id"]: m for m in self.messages if isinstance(m, dict) and "id" in m}

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        self._thread.join(timeout=10)


def initialized(reader: SseReader, post: Callable[[Any], httpx.Response]) -> None:
    assert post(INIT).status_code == 202
    assert reader.wait(lambda ms: any(isinstance(m, dict) and m.get("id") == "init" for m in ms), 30)
    assert post({"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202


def parallel_reads(url: str, cafile: str, token: str, path: Path, expected: bytes, front_pid: int,
                   privileged: bool = False, pause: float = 0.0) -> float:
    """Post :data:`PARALLEL` reads of ``path`` at once on one ``/sse`` session whose client reads
    as fast as it can (or in bursts, ``pause``); assert every answer arrives whole and the stream
    stays open. Returns the front's resident memory growth meanwhile (MiB)."""
    reader = SseReader(url, cafile, token, pause=pause)
    digest = hashlib.sha256(expected).hexdigest()
    try:
        with httpx.Client(verify=ssl.create_default_context(cafile=cafile), timeout=60,
                          headers={"Authorization": f"Bearer {token}"}) as c:
            def post(message: Any) -> httpx.Response:
                return c.post(url + reader.endpoint, json=message)

            initialized(reader, post)
            with RssSampler(front_pid) as rss:
                for i in range(PARALLEL):
                    assert post(read_call(path, i, privileged)).status_code == 202, i
                reader.wait(lambda ms: len([m for m in ms if isinstance(m, dict) and isinstance(m.get("id"), int)])
                            >= PARALLEL)
            replies = reader.replies()
            missing = [i for i in range(PARALLEL) if i not in replies]
            assert not missing, (f"{len(missing)} of {PARALLEL} reads unanswered (stream ended: {reader.ended}); "
                                 f"answered: {sorted(k for k in replies if isinstance(k, int))}")
            for i in range(PARALLEL):
                result = replies[i].get("result")
                assert result is not None and not result.get("isError"), (i, str(replies[i])[:300])
                text = result["content"][0]["text"].encode()
                assert len(text) == ANSWER and hashlib.sha256(text).hexdigest() == digest, (i, len(text))
            assert not reader.ended, "the stream was closed"
            ping = {"jsonrpc": "2.0", "id": "after", "method": "ping"}
            assert post(ping).status_code == 202
            assert reader.wait(lambda ms: any(isinstance(m, dict) and m.get("id") == "after" for m in ms), 30)
    finally:
        reader.close()
    print(f"\nfront RSS: {rss.base / 1024:.1f} MiB before, peak {rss.peak / 1024:.1f} MiB, "
          f"growth {rss.growth_mib:.1f} MiB for {PARALLEL} x {ANSWER // MIB} MiB answers")
    return rss.growth_mib


#: The front's memory growth allowed while 24 answers of 5 MiB go out on one session: its queue
#: (16 MiB), the answers of the calls admitted beside it, and each answer's transient copies (the
#: worker's reply as read, its text, its encoded event). All 24 answers held at once, with their
#: copies, would be about 240 MiB.
RSS_BOUND_MIB = 160


def test_parallel_large_reads_on_one_sse_session_all_arrive_whole(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """24 reads of 5 MiB posted at once on one ``/sse`` session whose client reads as fast as it
    can: every answer arrives, byte for byte, and the stream stays open (before: 2 answers, then
    the stream was closed as if the client had stopped reading). The front's memory grows by
    less than all the answers would hold at once."""
    d = daemon_factory()
    folder = tmp_path / "files"
    folder.mkdir()
    expected = five_mib_file(folder / "five.txt")
    os.chmod(tmp_path, 0o755)
    os.chmod(folder, 0o755)
    growth = parallel_reads(d.url, d.cacert, d.token, folder / "five.txt", expected, d.pid)
    assert growth < RSS_BOUND_MIB, f"the front grew by {growth:.0f} MiB"
    assert "stopped reading" not in d.log()


def test_a_client_reading_in_bursts_is_not_disconnected(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """The same 24 reads, the client pausing half a second after every 8 MiB it reads (shorter
    than ``connections.idle_seconds``, here 2 s): it is behind most of the time, yet it reads,
    so every answer arrives whole and the stream stays open."""
    d = daemon_factory(connections={"idle_seconds": 2})
    folder = tmp_path / "files"
    folder.mkdir()
    expected = five_mib_file(folder / "five.txt")
    os.chmod(tmp_path, 0o755)
    os.chmod(folder, 0o755)
    parallel_reads(d.url, d.cacert, d.token, folder / "five.txt", expected, d.pid, pause=0.5)
    assert "stopped reading" not in d.log()


@pytest.fixture(scope="module")
def privsep() -> Iterator[PrivsepDaemon]:
    """The real privilege-separated daemon with a root-only 5 MiB file in alice's granted folder."""
    with running_privsep() as d:
        yield d


def test_parallel_large_privileged_reads_on_one_sse_session_all_arrive_whole(privsep: PrivsepDaemon) -> None:
    """The issue's case: 24 privileged reads of a root-only 5 MiB file (alice's grant; the real
    root helper opens it, her worker reads it) posted at once on one ``/sse`` session whose client
    reads as fast as it can: all 24 arrive whole (before: 2, the stream closed for the other 22)."""
    path = privsep.app / "five.txt"
    expected = five_mib_file(path)
    os.chmod(path, 0o600)
    growth = parallel_reads(privsep.url, privsep.cacert, privsep.tokens["alice"], path, expected,
                            privsep.front_pid, privileged=True)
    assert growth < RSS_BOUND_MIB, f"the front grew by {growth:.0f} MiB"


# -- a client that stops reading is still disconnected ------------------------------------------------


def test_a_client_that_stops_reading_is_disconnected_after_idle_seconds(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """The same 24 reads for a client that reads nothing past its endpoint event (a tiny receive
    buffer): the session takes calls until its queue holds its budget, the others wait for room;
    the client takes nothing for ``connections.idle_seconds`` (here 1 s), so the session is closed
    (its POSTs then get 404, ``queue_overflow`` counted) and its connection dropped. What the front
    held for it stayed within its queue and the answers of the calls it took meanwhile."""
    port = free_port()
    d = daemon_factory(metrics_listen=f"127.0.0.1:{port}", connections={"idle_seconds": 1})
    folder = tmp_path / "files"
    folder.mkdir()
    five_mib_file(folder / "five.txt")
    os.chmod(tmp_path, 0o755)
    os.chmod(folder, 0o755)

    def metric(name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)[(name, labels)]

    overflows = metric("mcpd_limits_hit_total", (("limit", "queue_overflow"),))
    host, tls_port = d.host_port
    tcp = socket.socket()
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    tcp.settimeout(30)
    tcp.connect((host, tls_port))
    sock = d.ssl_context().wrap_socket(tcp, server_hostname=host)
    peak = 0.0
    try:
        sock.sendall(f"GET /sse HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {d.token}\r\n\r\n".encode())
        head = b""
        while b"session_id=" not in head or not head.rstrip(b" ").endswith(b"\n"):
            head += sock.recv(4096)
        endpoint = head.split(b"data: ", 1)[1].split(b"\n", 1)[0].decode().strip()
        with httpx.Client(verify=d.ssl_context(), timeout=30, headers=d.auth()) as c:
            assert c.post(d.url + endpoint, json=INIT).status_code == 202
            for i in range(PARALLEL):
                assert c.post(d.url + endpoint, json=read_call(folder / "five.txt", i)).status_code == 202
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            end = time.monotonic() + 30
            while c.post(d.url + endpoint, json=note).status_code == 202 and time.monotonic() < end:
                peak = max(peak, metric("mcpd_outgoing_bytes"))
                time.sleep(0.1)
            assert c.post(d.url + endpoint, json=note).status_code == 404, "the stalled session is still open"
            assert metric("mcpd_limits_hit_total", (("limit", "queue_overflow"),)) == overflows + 1, d.log()[-3000:]
            end = time.monotonic() + 15
            while metric("mcpd_outgoing_bytes") and time.monotonic() < end:
                time.sleep(0.1)
            assert metric("mcpd_outgoing_bytes") == 0, "the closed session's bytes are still counted"
    finally:
        sock.close()
    # its 16 MiB queue, plus the answers of the (at most four) calls it took while there was room
    assert peak <= 16 * MIB + 4 * (ANSWER + MIB), peak
    assert "outgoing queue full" in d.log() and "took nothing" in d.log()


# -- batches: every member answered, or the batch refused whole ----------------------------------------


def ping_batch(count: int) -> list[dict[str, Any]]:
    return [{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(count)]


@contextlib.contextmanager
def initialized_sse(d: Daemon) -> Iterator[tuple[SseReader, Callable[[Any], httpx.Response]]]:
    """An initialized ``/sse`` session of ``d``'s token: its reader and a POST to its endpoint;
    closed when the block ends."""
    reader = SseReader(d.url, d.cacert, d.token)
    try:
        with httpx.Client(verify=d.ssl_context(), timeout=60, headers=d.auth()) as c:
            def post(message: Any) -> httpx.Response:
                return c.post(d.url + reader.endpoint, json=message)

            initialized(reader, post)
            yield reader, post
    finally:
        reader.close()


def test_a_batch_of_1000_on_sse_is_refused_whole_with_one_error(daemon_factory: Callable[..., Daemon]) -> None:
    """A batch of 1000 members, four times ``max_batch``: one JSON-RPC error (``-32600``, ``id:
    null``) saying so, none of its members run;
    the session goes on."""
    d = daemon_factory()
    with initialized_sse(d) as (reader, post):
        before = len(reader.messages)
        assert post(ping_batch(1000)).status_code == 202
        assert post({"jsonrpc": "2.0", "id": "after", "method": "ping"}).status_code == 202
        assert reader.wait(lambda ms: any(isinstance(m, dict) and m.get("id") == "after" for m in ms), 30)
        time.sleep(0.5)  # (anything the batch still sent would be here by now)
        got = [m for m in reader.messages[before:] if not (isinstance(m, dict) and m.get("id") == "after")]
        assert len(got) == 1 and isinstance(got[0], dict), str(got)[:500]
        refusal = got[0]
        assert refusal["id"] is None and refusal["error"]["code"] == -32600, refusal
        assert "1000" in refusal["error"]["message"] and "256" in refusal["error"]["message"], refusal


def test_a_batch_of_1000_within_max_batch_gets_1000_answers_on_sse(daemon_factory: Callable[..., Daemon]) -> None:
    """With ``max_batch`` at 1000, a batch of 1000 pings gets one array of 1000 replies, one per
    member (those past ``max_in_flight`` refused one by one, each with its id)."""
    d = daemon_factory(max_batch=1000)
    with initialized_sse(d) as (reader, post):
        assert post(ping_batch(1000)).status_code == 202
        assert reader.wait(lambda ms: any(isinstance(m, list) for m in ms), 60)
        (answer,) = [m for m in reader.messages if isinstance(m, list)]
        assert sorted(m["id"] for m in answer) == list(range(1000))
        assert all("result" in m or m["error"]["code"] == -32000 for m in answer)


def mcp_session(d: Daemon, c: httpx.Client) -> dict[str, str]:
    headers = {"Accept": "application/json, text/event-stream", **d.auth()}
    r = c.post(d.url + "/mcp", json=INIT, headers=headers)
    assert r.status_code == 200, r.text
    return {**headers, "Mcp-Session-Id": r.headers["mcp-session-id"]}


def test_a_batch_of_1000_on_mcp_is_refused_whole_with_one_error(daemon_factory: Callable[..., Daemon]) -> None:
    """The same batch on ``/mcp`` (session era): one JSON-RPC error (``-32600``, ``id: null``;
    HTTP 400, as for any error without an id), not an array of 513; the session goes on."""
    d = daemon_factory()
    with httpx.Client(verify=d.ssl_context(), timeout=60) as c:
        headers = mcp_session(d, c)
        r = c.post(d.url + "/mcp", json=ping_batch(1000), headers=headers)
        assert r.status_code == 400, (r.status_code, r.text[:300])
        refusal = r.json()
        assert isinstance(refusal, dict) and refusal["id"] is None and refusal["error"]["code"] == -32600, refusal
        r = c.post(d.url + "/mcp", json={"jsonrpc": "2.0", "id": "after", "method": "ping"}, headers=headers)
        assert r.status_code == 200 and r.json()["result"] == {}


def test_a_batch_of_1000_within_max_batch_gets_1000_answers_on_mcp(daemon_factory: Callable[..., Daemon]) -> None:
    """With ``max_batch`` at 1000, the batch on ``/mcp`` gets one array of 1000 replies."""
    d = daemon_factory(max_batch=1000)
    with httpx.Client(verify=d.ssl_context(), timeout=60) as c:
        headers = mcp_session(d, c)
        r = c.post(d.url + "/mcp", json=ping_batch(1000), headers={**headers, "Accept": "application/json"})
        assert r.status_code == 200, r.text[:300]
        assert sorted(m["id"] for m in r.json()) == list(range(1000))


@pytest.mark.anyio
async def test_a_client_with_nothing_to_read_is_not_disconnected_while_its_calls_run(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """Four slow reads take the room of one session (each reserves a quarter of its queue until it
    answers), so a fifth read waits; the client has nothing to take meanwhile, so it is not taken
    for one that stopped reading, though it takes nothing for longer than ``idle_seconds`` (1 s).
    Once one slow read is cancelled the fifth runs and is answered."""
    from tests.conftest import SseSession, slow_read

    d = daemon_factory(connections={"idle_seconds": 1}, workers={"timeout_seconds": 30})
    small = tmp_path / "small.txt"
    small.write_text("small\n")
    os.chmod(tmp_path, 0o755)
    # the daemon ends a connection idle for 1 s: the client keeps an idle one for less, or it may
    # send on a connection the daemon is closing at that moment ("disconnected without a response")
    posts = httpx.AsyncClient(verify=d.ssl_context(), timeout=30, limits=httpx.Limits(keepalive_expiry=0.5))
    async with posts, SseSession(d, client=posts) as s:
        await s.initialize()
        for i in range(4):
            assert (await s.post(slow_read(tmp_path, f"slow{i}"))).status_code == 202
        fifth = {"jsonrpc": "2.0", "id": "fifth", "method": "tools/call",
                 "params": {"name": "files/read", "arguments": {"path": str(small)}}}
        assert (await s.post(fifth)).status_code == 202
        await asyncio.sleep(3)  # three idle_seconds with nothing to read, a read waiting for room
        assert (await s.request("ping", req_id="alive"))["result"] == {}
        assert '"fifth"' not in s.pending
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow0"}}
        assert (await s.post(cancel)).status_code == 202
        reply = await asyncio.wait_for(s.reply("fifth"), 20)
        assert reply["result"]["content"][0]["text"] == "small\n", reply
        for i in range(1, 4):
            await s.post({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": f"slow{i}"}})
    assert "stopped reading" not in d.log()


def test_stallers_filling_the_total_budget_are_cut_not_a_reader_behind_on_parallel_reads(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """The total budget's rule under backpressure: carol and dave each stall two ``/sse`` sessions
    behind two 6 MiB answers (about 25 MiB each, within their 32 MiB budgets and each session
    within its queue, so none is cut for its own bounds), 50 MiB of a 64 MiB total. Bob then reads
    24 answers of 5 MiB on one session in bursts (behind by up to his queue and the answers of the
    calls it took: about 21 MiB), so the total is passed: the principal holding the most gives up
    what it holds, a staller, never bob, who gets every answer whole."""
    from tests.support.budgets import daemon_with_metrics, stall
    from tests.support.principals import add_dev_principals

    d, m, big, _small = daemon_with_metrics(daemon_factory, tmp_path, principal_queue_bytes=32 * MIB,
                                            total_queue_bytes=64 * MIB)
    expected = five_mib_file(big.parent / "five.txt")
    tokens = add_dev_principals(d, ["carol", "dave"])
    streams = []
    try:
        with httpx.Client(verify=d.ssl_context(), timeout=60) as c:
            for name in ("carol", "dave"):
                for _ in range(2):
                    s, _endpoint, statuses = stall(d, c, big, 2, token=tokens[name], m=m)
                    streams.append(s)
                    assert statuses == [202, 202], (name, statuses)
        held = m.outgoing()
        assert 48 * MIB < held <= 64 * MIB, held
        parallel_reads(d.url, d.cacert, d.other_token, big.parent / "five.txt", expected, d.pid, pause=0.5)
        assert m.hits("queue_bytes_total") >= 1, "the total was never passed: bob was never behind"
    finally:
        for s in streams:
            s.close()
    assert "stopped reading" in d.log()  # (the stallers)
