"""Client connections are bounded (docs/REFERENCE.md §1.7; issue "hostile load"): a client that trickles its
TLS handshake, its headers or its body is dropped within seconds, connections over the total or
per-address cap are closed at once, and none of it delays anyone else.

The daemon runs with short deadlines so the tests stay quick; every loop is bounded.
"""

from __future__ import annotations

import re
import socket
import ssl
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.conftest import Daemon, slow_read

LIMITS = {"max_total": 40, "max_per_address": 6, "handshake_seconds": 2, "header_seconds": 2,
          "body_seconds": 2, "idle_seconds": 2}
DROP_WITHIN = 6.0  # seconds: the deadline (2 s) plus generous scheduling slack


def closed_within(sock: socket.socket | ssl.SSLSocket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock`` (read returns EOF or the socket errors), or None."""
    start = time.monotonic()
    sock.settimeout(0.25)
    while time.monotonic() - start < seconds:
        try:
            data = sock.recv(4096)
        except (ssl.SSLWantReadError, TimeoutError):
            continue
        except (OSError, ssl.SSLError):
            return time.monotonic() - start
        if not data:
            return time.monotonic() - start
    return None


def tls(d: Daemon, source: str = "127.0.0.1") -> ssl.SSLSocket:
    host, port = d.host_port
    raw = socket.create_connection((host, port), timeout=10, source_address=(source, 0))
    return d.ssl_context().wrap_socket(raw, server_hostname=host)


def works(d: Daemon) -> bool:
    with httpx.Client(verify=d.ssl_context(), timeout=10) as c:
        return c.get(d.url + "/sse", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_slow_clients_are_dropped_and_delay_no_one(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory(connections=LIMITS)
    host, port = d.host_port
    no_handshake = socket.create_connection((host, port), timeout=10, source_address=("127.0.0.2", 0))
    no_headers = tls(d, "127.0.0.3")  # handshake done, then nothing
    trickle = tls(d, "127.0.0.4")
    trickle.sendall(b"GET /sse HTTP/1.1\r\nHost: x\r\n")  # headers never finish
    slow_body = tls(d, "127.0.0.5")
    slow_body.sendall(b"POST /message?session_id=x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\nAuthorization: Bearer x\r\n\r\n{")
    try:
        assert works(d)  # the slow ones delay no one
        for name, sock in (("handshake", no_handshake), ("headers", no_headers), ("trickle", trickle),
                           ("body", slow_body)):
            took = closed_within(sock, DROP_WITHIN)
            assert took is not None, f"{name}: still held after {DROP_WITHIN} s"
        assert works(d)
    finally:
        for s in (no_handshake, no_headers, trickle, slow_body):
            s.close()


def test_deadlines_hold_for_a_second_request_and_for_a_body_sent_in_pieces(daemon_factory: Callable[..., Daemon]) -> None:
    """A request that arrives whole arms no timer (mcpd/front/connections/guarded.py); one that does not
    must still be cut at its deadline: the second request of a kept-alive connection that never
    finishes its headers, and a body whose pieces each come well within the deadline but whose
    whole takes longer (the body deadline counts from the headers, not from the last piece)."""
    d = daemon_factory(connections={**LIMITS, "idle_seconds": 30})
    second = tls(d, "127.0.0.6")
    second.sendall(b"POST /message?session_id=x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    assert second.recv(4096).startswith(b"HTTP/1.1 401")  # answered whole; the connection is kept
    second.sendall(b"GET /sse HTTP/1.1\r\nHost: x\r\n")  # a second request whose headers never end
    pieces = tls(d, "127.0.0.7")
    pieces.sendall(b"POST /message?session_id=x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: 100\r\nAuthorization: Bearer x\r\n\r\n{")
    try:
        start = time.monotonic()
        cut = None
        for _ in range(40):  # one byte every 0.25 s: each within the deadline, the whole past it
            try:
                pieces.sendall(b" ")
            except OSError:
                cut = time.monotonic() - start
                break
            if closed_within(pieces, 0.25) is not None:
                cut = time.monotonic() - start
                break
        assert cut is not None and cut < DROP_WITHIN, cut
        took = closed_within(second, DROP_WITHIN)
        assert took is not None, "a kept-alive connection's unfinished second request was never cut"
        assert works(d)
    finally:
        second.close()
        pieces.close()


def test_connections_over_the_per_address_cap_are_closed_at_once(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory(connections=dict(LIMITS, header_seconds=30))
    held: list[Any] = []
    try:
        for _ in range(LIMITS["max_per_address"]):
            held.append(tls(d, "127.0.0.7"))
        time.sleep(0.3)
        assert all(closed_within(s, 0.5) is None for s in held), "connections within the cap stay open"
        extra = tls(d, "127.0.0.7")
        held.append(extra)
        assert closed_within(extra, 3.0) is not None, "one over the cap is closed"
        assert works(d)  # another address is not affected
        held.pop(0).close()
        time.sleep(0.3)
        again = tls(d, "127.0.0.7")  # a slot freed by a close is usable again
        held.append(again)
        assert closed_within(again, 1.0) is None
    finally:
        for s in held:
            s.close()


def test_connections_over_the_total_cap_are_closed_at_once(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory(connections=dict(LIMITS, max_total=8, header_seconds=30))
    held: list[Any] = []
    try:
        for i in range(8):
            held.append(tls(d, f"127.0.1.{i + 1}"))
        time.sleep(0.3)
        extra = tls(d, "127.0.1.100")
        held.append(extra)
        assert closed_within(extra, 3.0) is not None
        for s in held[:-1]:
            s.close()
        time.sleep(0.3)
        assert works(d)
    finally:
        for s in held:
            s.close()


def stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the command name: state, ppid, ... (utime is index 11)."""
    from pathlib import Path

    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def test_a_worker_busy_in_a_long_read_dies_with_the_front(daemon_factory: Callable[..., Daemon],
                                                          tmp_path: Any) -> None:
    """A worker never outlives the process that started it, even mid-call: SIGKILL the front
    while its worker counts the lines of a huge (sparse) file, and the worker is gone at once."""
    import asyncio
    import os
    import signal

    from mcpd.client.api import Client

    d = daemon_factory()
    huge = tmp_path / "huge.log"
    with open(huge, "wb") as f:
        f.write(b"a\n" * 8192)  # text up front; the rest is a hole of NUL bytes with no line end
        f.truncate(64 * 1024 ** 3)
    os.chmod(tmp_path, 0o755)

    def workers() -> set[int]:
        out = subprocess.run(["pgrep", "-f", "mcpd.worker"], capture_output=True, text=True)
        mine = set()
        for pid in (int(p) for p in out.stdout.split()):
            try:
                ppid = int(stat_fields(pid)[1])
            except (OSError, ValueError):
                continue
            if ppid == d.proc.pid:
                mine.add(pid)
        return mine

    async def long_read() -> None:
        async with Client(d.url, d.token, d.cacert, timeout=30) as c:
            await c.call_tool("files/read", {"path": str(huge), "start_line": 10 ** 9}, check=False)

    def in_background() -> None:
        try:
            asyncio.run(long_read())
        except Exception:
            pass  # the front is killed under it

    import threading

    threading.Thread(target=in_background, daemon=True).start()
    deadline = time.monotonic() + 10
    busy: set[int] = set()
    while time.monotonic() < deadline and not busy:
        time.sleep(0.2)
        busy = {p for p in workers() if int(stat_fields(p)[11]) > 10}  # utime: it is busy reading
    assert busy, "a worker is counting lines"
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(timeout=10)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in busy):
        time.sleep(0.05)
    alive = [p for p in busy if os.path.exists(f"/proc/{p}") and stat_fields(p)[0] != "Z"]
    assert not alive, f"workers outlived the front: {alive}"


def test_a_client_that_stops_reading_is_disconnected_when_its_queue_bytes_are_spent(
        daemon_factory: Callable[..., Daemon], tmp_path: Any) -> None:
    """The outgoing queue is bounded in bytes (docs/REFERENCE.md §1.7): a session that posts 1 MiB reads and never
    reads its stream takes reads until its queue holds ``session_queue_bytes``, the others wait for
    room, and it is closed once it has taken nothing for ``connections.idle_seconds`` (here 1 s;
    its POSTs then get 404); another session is served meanwhile."""
    import os

    d = daemon_factory(session_queue_bytes=4 * 1024 * 1024, connections={"idle_seconds": 1})
    big = tmp_path / "one-mib.txt"
    big.write_bytes((b"x" * 1023 + b"\n") * 1024)
    os.chmod(tmp_path, 0o755)
    stalled = tls(d)
    stalled.sendall(f"GET /sse HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {d.token}\r\n\r\n".encode())
    head = b""
    while b"session_id=" not in head or not head.rstrip(b" ").endswith(b"\n"):
        head += stalled.recv(4096)
    endpoint = head.split(b"data: ", 1)[1].split(b"\n", 1)[0].decode().strip()
    read = {"jsonrpc": "2.0", "method": "tools/call",
            "params": {"name": "files/read", "arguments": {"path": str(big), "offset": 0, "limit": 1024 * 1024}}}
    statuses = []
    try:
        with httpx.Client(verify=d.ssl_context(), timeout=30, headers={"Authorization": f"Bearer {d.token}"}) as c:
            init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
            c.post(d.url + endpoint, json=init)
            deadline = time.monotonic() + 60
            for i in range(1, 401):  # up to 400 MiB of answers for a client that reads none of them
                statuses.append(c.post(d.url + endpoint, json=dict(read, id=i)).status_code)
                if statuses[-1] == 404 or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert works(d)
        assert statuses and statuses[-1] == 404, statuses  # the session is gone
    finally:
        stalled.close()


def _session(d: Daemon, c: httpx.Client, version: str = "2025-06-18") -> tuple[Any, str]:
    """Open an SSE stream; return (its line iterator, the POST endpoint), after initialize."""
    stream = c.stream("GET", d.url + "/sse")
    resp = stream.__enter__()
    lines = resp.iter_lines()
    endpoint = next(line for line in lines if line.startswith("data:")).split(":", 1)[1].strip()
    init = {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    assert c.post(d.url + endpoint, json=init).status_code == 202
    return (stream, lines), endpoint


def _messages(lines: Any, count: int) -> list[Any]:
    import json

    out = []
    for line in lines:
        if line.startswith("data:"):
            out.append(json.loads(line.split(":", 1)[1]))
            if len(out) == count:
                return out
    return out


def test_a_batch_past_the_cap_is_refused_whole_and_one_within_it_runs(daemon_factory: Callable[..., Daemon]) -> None:
    d = daemon_factory(max_batch=3)
    with httpx.Client(verify=d.ssl_context(), timeout=30, headers={"Authorization": f"Bearer {d.token}"}) as c:
        (stream, lines), endpoint = _session(d, c, "2025-03-26")  # (batches end with 2025-06-18)
        try:
            batch = [{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(5)]
            batch.insert(2, {"jsonrpc": "2.0", "method": "notifications/progress"})  # no id: no answer
            assert c.post(d.url + endpoint, json=batch).status_code == 202
            assert c.post(d.url + endpoint, json=batch[:3]).status_code == 202
            init, refusal, replies = _messages(lines, 3)
            assert refusal["id"] is None and refusal["error"]["code"] == -32600, refusal
            assert "batch of 6 members is over max_batch (3)" in refusal["error"]["message"]
            assert replies == [{"jsonrpc": "2.0", "id": i, "result": {}} for i in (0, 1)], replies
        finally:
            stream.__exit__(None, None, None)


def test_requests_past_the_in_flight_cap_are_refused_at_once(daemon_factory: Callable[..., Daemon],
                                                             tmp_path: Any) -> None:
    d = daemon_factory(max_in_flight=2)
    slow = slow_read(tmp_path, None)
    with httpx.Client(verify=d.ssl_context(), timeout=30, headers={"Authorization": f"Bearer {d.token}"}) as c:
        (stream, lines), endpoint = _session(d, c)
        try:
            for rid in ("slow-1", "slow-2", "third"):
                assert c.post(d.url + endpoint, json=dict(slow, id=rid)).status_code == 202
            init, refused = _messages(lines, 2)
            assert refused["id"] == "third" and refused["error"]["code"] == -32000, refused
            for rid in ("slow-1", "slow-2"):  # cancel them: their workers are killed, the slots freed
                c.post(d.url + endpoint, json={"jsonrpc": "2.0", "method": "notifications/cancelled",
                                               "params": {"requestId": rid}})
            time.sleep(0.5)
            assert c.post(d.url + endpoint, json={"jsonrpc": "2.0", "id": "after", "method": "ping"}).status_code == 202
            assert _messages(lines, 1)[0] == {"jsonrpc": "2.0", "id": "after", "result": {}}
        finally:
            stream.__exit__(None, None, None)


def _answer(sock: ssl.SSLSocket) -> bytes:
    """Everything the server sends until it closes (bounded by the socket's timeout)."""
    data = b""
    sock.settimeout(10)
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (OSError, ssl.SSLError):
        pass
    return data


def test_a_request_target_or_header_block_over_the_cap_is_refused_and_a_large_body_is_not(
        daemon_factory: Callable[..., Daemon]) -> None:
    """``connections.max_header_bytes`` bounds what a request's target and headers may make the
    front hold: past it with the headers unfinished, ``431`` and the connection closes; a body
    (bounded by ``max_body_bytes`` instead) is not counted, nor are headers just under the cap."""
    d = daemon_factory(connections={**LIMITS, "max_header_bytes": 4096}, max_body_bytes=1 << 20)
    auth = f"Authorization: Bearer {d.token}\r\n".encode()
    over = tls(d)
    over.sendall(b"GET /sse HTTP/1.1\r\nHost: x\r\n")  # (the read that begins a request is not counted)
    over.sendall(b"X-A: " + b"a" * 2000 + b"\r\nX-B: " + b"b" * 2200 + b"\r\n")
    assert _answer(over).startswith(b"HTTP/1.1 431 "), "headers over the cap"
    long_target = tls(d)
    long_target.sendall(b"GET /sse?")
    long_target.sendall(b"x" * 5000)  # a target still going on past the cap
    assert _answer(long_target).startswith(b"HTTP/1.1 431 ")
    under = tls(d)
    under.sendall(b"POST /message?session_id=" + b"0" * 32 + b" HTTP/1.1\r\nHost: x\r\n" + auth +
                  b"X-A: " + b"a" * 3000 + b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
                  b"Content-Length: 2\r\n\r\n{}")
    assert _answer(under).startswith(b"HTTP/1.1 404 "), "under the cap: answered as any request"
    body = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"' + b"p" * 500_000 + b'"}}'
    big = tls(d)
    big.sendall(b"POST /message?session_id=" + b"0" * 32 + b" HTTP/1.1\r\nHost: x\r\n" + auth +
                b"Content-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert _answer(big).startswith(b"HTTP/1.1 404 "), "a large body is not a large header block"
    for s in (over, long_target, under, big):
        s.close()
    assert works(d)
    log = d.log()
    assert log.count("request line and headers over 4096 bytes") == 2
    # logged as any refused request is, on the refusal log: method and path as far as they came
    assert re.search(r"refused 431 GET /sse from 127\.0\.0\.1:\d+: request line and headers over 4096 bytes", log)
    assert log.count("refused 431 GET /sse from") == 2, log[-3000:]
    assert "x" * 300 not in log  # (the path is cut)


def test_a_stream_outlives_the_header_and_body_deadlines(daemon_factory: Callable[..., Daemon]) -> None:
    """The deadlines bound a request's arrival, not its answer: an SSE stream open past
    ``header_seconds + body_seconds`` still carries replies."""
    import asyncio

    from tests.conftest import SseSession

    d = daemon_factory(connections=LIMITS)

    async def hold() -> Any:
        async with SseSession(d) as s:
            await asyncio.sleep(LIMITS["header_seconds"] + LIMITS["body_seconds"] + 1)
            return await s.request("ping")

    assert asyncio.run(hold()) == {"jsonrpc": "2.0", "id": 1, "result": {}}


def test_an_idle_kept_alive_connection_outlives_the_usual_clients_keep_alive(daemon: Daemon) -> None:
    """httpx (and so both SDKs' Python clients and linuxctl) keeps an idle connection for 5 s and
    then closes it. A server that closes its idle connections after the same 5 s races the client:
    a request sent on a connection the server is closing fails with "server disconnected without
    sending a response". With the default ``connections.idle_seconds`` a connection idle for 6 s
    still serves its next request; the client is the one that closes it."""
    with httpx.Client(verify=daemon.ssl_context(), timeout=10,
                      limits=httpx.Limits(keepalive_expiry=60)) as c:
        first = c.get(daemon.url + "/sse", headers={"Authorization": "Bearer nope"})
        assert first.status_code == 401
        time.sleep(6)
        second = c.get(daemon.url + "/sse", headers={"Authorization": "Bearer nope"})
        assert second.status_code == 401
        assert second.extensions["network_stream"] is first.extensions["network_stream"], \
            "the server closed the idle connection within 6 s"
