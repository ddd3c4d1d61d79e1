"""``POST /message``, which runs on a lean route of its own (mcpd/front/app.py
``PostRoute``) instead of the generic starlette stack: it must make the stack's checks (Origin
403, Host 421, bearer 401, then session 400/404 and body 415/413/400) in the stack's order, log
every refusal once, and never answer what the stack would not. Each test sends real requests to a
real daemon over TLS, often on a raw socket (for requests httpx will not send), and compares the
lean route's answer with the stack's where the same check runs on another route (``GET /sse``).

Tests marked ``xfail(strict=True)`` record a flaw found (see their reason); they pass once it is
fixed, and the mark must then go.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcpd.common import identity
from tests.conftest import EVENT_TIMEOUT, Daemon, SseSession, open_raw
from tests.support.refused_log import refused_lines
from tests.support.streamable import as_daemon
from tests.support.streamable import client as mcp_client
from tests.support.streamable import open_session as open_mcp_session
from tests.support.workers import slow_file

pytestmark = pytest.mark.anyio

OK_ORIGIN = "https://ok.example"
FORGED = "mcpd_0123456789ab_" + "S" * 43  # token-shaped, unknown


def ping(rid: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "ping"}).encode()


def secrets_of(*tokens: str) -> list[str]:
    """The secret part of each token, ``mcpd_<id>_<secret>`` (what a log must never hold; the id is
    not secret). The secret may itself hold ``_``."""
    return [t.split("_", 2)[2] for t in tokens]


def assert_no_crash_in_log(d: Daemon) -> None:
    log = d.log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log and " ERROR " not in log, log[-4000:]


# -- raw HTTP/1.1 over TLS -----------------------------------------------------------------------


def request(method: str, target: str, headers: list[tuple[str, str]], body: bytes = b"",
            version: str = "1.1") -> bytes:
    """One request's bytes, headers exactly as given (repeats kept, nothing added)."""
    head = f"{method} {target} HTTP/{version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return head.encode("latin-1") + body


def post_headers(d: Daemon, body: bytes, token: str | None = None, host: str = "127.0.0.1",
                 close: bool = True) -> list[tuple[str, str]]:
    h = [("Host", host), ("Authorization", f"Bearer {token or d.token}"), ("Content-Type", "application/json"),
         ("Content-Length", str(len(body)))]
    return h + [("Connection", "close")] if close else h


class Answer:
    """One parsed HTTP response: ``status``, ``headers`` (lower-case names, repeats kept), ``body``."""

    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)

    def __repr__(self) -> str:
        return f"Answer({self.status}, {self.body[:120]!r})"


def read_answer(sock: ssl.SSLSocket, buf: bytearray, head_only: bool = False) -> Answer:
    """Read one response from ``sock`` (``buf``: bytes already read and not yet used, kept for the
    next response). ``head_only``: a HEAD's answer, or a stream's head (no body read)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError(f"connection closed before a response: {bytes(buf)[:200]!r}")
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = [(k.strip().lower(), v.strip()) for k, v in (line.split(":", 1) for line in lines[1:])]
    length = 0 if head_only or status in (100, 204, 304) else int(dict(headers).get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    buf[:] = rest[length:]
    return Answer(status, headers, rest[:length])


def exchange(d: Daemon, data: bytes, head_only: bool = False) -> Answer:
    """Send ``data`` on a fresh connection and read one response (a 100 Continue is skipped)."""
    with open_raw(d) as sock:
        sock.sendall(data)
        buf = bytearray()
        answer = read_answer(sock, buf, head_only)
        while answer.status == 100:
            answer = read_answer(sock, buf, head_only)
        return answer


# -- paths and methods ---------------------------------------------------------------------------

# (path, answer with a good token): the lean route serves exactly /message and {base}/message
# after the server's percent-decoding; every other spelling goes through the stack, whose router
# redirects a trailing slash (307) and knows no other (404). Never a 5xx, never past a check.
PATH_VARIANTS = [
    ("/message", 202), ("/mess%61ge", 202), ("/base/message", 202), ("/base%2Fmessage", 202),
    ("/message/", 307), ("/base/message/", 307), ("//message", 404), ("/%2Fmessage", 404),
    ("/message;x", 404), ("/MESSAGE", 404), ("/base//message", 404), ("/./message", 404),
    ("/x/../message", 404), ("/base/../message", 404), ("/message%00", 404), ("/Base/message", 404),
]


async def test_every_spelling_of_the_message_path_gets_every_check(daemon_factory: Callable[..., Daemon]) -> None:
    """Each spelling of the path, on the lean route or not, is refused without a token (401, RFC
    6750 challenge), with a foreign Origin (403) or Host (421) before the token is looked at, and
    with a good token answers as the router would; only the 202s reach the session."""
    d = daemon_factory(base_path="/base", allowed_origins=[OK_ORIGIN], allowed_hosts="auto")
    async with SseSession(d) as s:
        sid = s.endpoint.rsplit("=", 1)[1]
        accepted: list[Any] = []
        refusals = 0
        for n, (path, good) in enumerate(PATH_VARIANTS):
            target = f"{path}?session_id={sid}"
            body = ping(n)
            no_token = [h for h in post_headers(d, body) if h[0] != "Authorization"]
            a = exchange(d, request("POST", target, no_token, body))
            assert (a.status, a.header("www-authenticate")) == (401, "Bearer"), (path, a)
            a = exchange(d, request("POST", target, post_headers(d, body, token=FORGED), body))
            assert a.status == 401 and (a.header("www-authenticate") or "").startswith('Bearer error="invalid_token"'), (path, a)
            a = exchange(d, request("POST", target, post_headers(d, body, token="nope") + [("Origin", "https://evil.example")], body))
            assert (a.status, a.body) == (403, b"origin not allowed"), (path, a)
            a = exchange(d, request("POST", target, post_headers(d, body, token="nope", host="evil.example"), body))
            assert (a.status, a.body) == (421, b"host not allowed"), (path, a)
            a = exchange(d, request("POST", target, post_headers(d, body) + [("Origin", OK_ORIGIN)], body))
            assert a.status == good, (path, a)
            refusals += 4 + (good >= 400)
            if good == 202:
                accepted.append(n)
        assert (await s.request("ping", req_id="last")) == {"jsonrpc": "2.0", "id": "last", "result": {}}
        assert sorted(json.loads(k) for k in s.pending) == accepted  # nothing else arrived
    lines = refused_lines(d, refusals)
    assert len(lines) == refusals, lines  # each refusal logged once, nothing else
    assert {status for status, *_ in lines} == {401, 403, 421, 404}
    assert_no_crash_in_log(d)


@pytest.mark.parametrize("base", ["/.well-known", "/a%20b"])
async def test_a_base_path_is_refused_at_start_or_its_endpoint_works(daemon_factory: Callable[..., Daemon],
                                                                    base: str) -> None:
    """A ``base_path`` whose advertised endpoint cannot work must stop ``mcpd serve`` (config
    error); one that starts must serve its endpoint."""
    try:
        d = daemon_factory(base_path=base)
    except RuntimeError:
        return  # refused at start
    async with SseSession(d) as s:
        assert s.endpoint.startswith(f"{base}/message?session_id=")
        r = await s.post({"jsonrpc": "2.0", "id": "base", "method": "ping"})
        assert r.status_code == 202, (r.status_code, r.text)


@pytest.mark.parametrize("method", ["HEAD", "GET", "PUT", "PATCH", "DELETE", "OPTIONS"])
async def test_other_methods_on_the_message_path_are_405_after_the_token_check(
        daemon: Daemon, method: str) -> None:
    """Only POST reaches the session: any other method is 401 without a token and 405 with one,
    and its body never reaches the stream."""
    async with SseSession(daemon) as s:
        body = ping("other-method")
        head_only = method == "HEAD"
        a = exchange(daemon, request(method, s.endpoint, post_headers(daemon, body, token="nope"), body), head_only)
        assert a.status == 401, a
        a = exchange(daemon, request(method, s.endpoint, post_headers(daemon, body), body), head_only)
        assert a.status == 405 and "POST" in (a.header("allow") or ""), a
        assert (await s.request("ping", req_id="after")) == {"jsonrpc": "2.0", "id": "after", "result": {}}
        assert not s.pending


async def test_a_lower_case_post_method_is_not_a_post(daemon: Daemon) -> None:
    """``post`` (method names are case-sensitive) is not the lean route's POST: the parser refuses it."""
    async with SseSession(daemon) as s:
        body = ping("lower")
        a = exchange(daemon, request("post", s.endpoint, post_headers(daemon, body), body))
        assert a.status == 400, a
        assert (await s.request("ping", req_id="after")) == {"jsonrpc": "2.0", "id": "after", "result": {}}
        assert not s.pending


# -- Origin, Host and Authorization, compared with the stack's answer on GET /sse -----------------

HEADER_CASES: list[tuple[str, list[tuple[str, str]], int]] = [
    # (case, headers added to or replacing a good request's, expected refusal or 0 for accepted)
    ("allowed origin", [("Origin", OK_ORIGIN)], 0),
    ("allowed then foreign origin", [("Origin", OK_ORIGIN), ("Origin", "https://evil.example")], 403),
    ("foreign then allowed origin", [("Origin", "https://evil.example"), ("Origin", OK_ORIGIN)], 403),
    ("empty origin", [("Origin", "")], 403),
    ("null origin", [("Origin", "null")], 403),
    ("origin in other case", [("Origin", "https://OK.example")], 403),
    ("origin with a path", [("Origin", OK_ORIGIN + "/")], 403),
    ("two hosts, both allowed", [("Host", "127.0.0.1")], 421),
    ("foreign host", [("Host!", "evil.example")], 421),
    ("foreign host with allowed port", [("Host!", "evil.example:{port}")], 421),
    ("host with userinfo", [("Host!", "localhost@evil.example")], 421),
    ("allowed host in upper case with port", [("Host!", "LOCALHOST:{port}")], 0),
    ("allowed host with root dot", [("Host!", "localhost.")], 0),
    ("no host (HTTP/1.0)", [("Host!", None)], 421),  # type: ignore[list-item]
    ("good then bad token", [("Authorization", "Bearer nope")], 0),
    ("bad then good token", [("Authorization!", "Bearer nope"), ("Authorization", "Bearer {token}")], 401),
    ("other scheme then good token", [("Authorization!", "Basic eDp5"), ("Authorization", "Bearer {token}")], 401),
    ("bearer with a tab", [("Authorization!", "Bearer\t{token}")], 401),
    ("bearer in upper case, spaces", [("Authorization!", "BEARER   {token}  ")], 0),
    ("latin-1 bytes for a token", [("Authorization!", "Bearer \xff\xfe")], 401),
]


def build(d: Daemon, method: str, target: str, extra: list[tuple[str, str | None]], body: bytes) -> bytes:
    """A request with ``extra`` headers: ``Name`` is added, ``Name!`` replaces the good default
    (value ``None``: the header is left out, and the request is HTTP/1.0)."""
    _, port = d.host_port
    headers = post_headers(d, body, host=f"127.0.0.1:{port}") if method == "POST" else \
        [("Host", f"127.0.0.1:{port}"), ("Authorization", f"Bearer {d.token}"), ("Connection", "close")]
    version = "1.1"
    for name, value in extra:
        if name.endswith("!"):
            name = name[:-1]
            headers = [h for h in headers if h[0] != name]
            if value is None:
                version = "1.0"
                continue
        if value is not None:
            headers.append((name, value.format(port=port, token=d.token)))
    return request(method, target, headers, body, version)


@pytest.mark.parametrize("case,extra,refusal", HEADER_CASES, ids=[c[0] for c in HEADER_CASES])
async def test_origin_host_and_token_headers_are_judged_as_the_stack_judges_them(
        daemon_factory: Callable[..., Daemon], case: str, extra: list[tuple[str, str | None]],
        refusal: int) -> None:
    """Repeated, empty or odd ``Origin``, ``Host`` and ``Authorization`` headers get the same answer
    from the lean ``POST /message`` as from the generic stack (``GET /sse``): a refusal with the same
    status and challenge, or acceptance (202 / 200)."""
    d = daemon_factory(allowed_origins=[OK_ORIGIN], allowed_hosts="auto")
    async with SseSession(d) as s:
        body = ping("case")
        lean = exchange(d, build(d, "POST", s.endpoint, extra, body))
        stack = exchange(d, build(d, "GET", "/sse", extra, b""), head_only=True)
        assert lean.status == (refusal or 202), (case, lean)
        assert stack.status == (refusal or 200), (case, stack)
        assert lean.body == (b"" if refusal == 0 else stack_body(d, extra, refusal)), lean
        assert lean.header("www-authenticate") == stack.header("www-authenticate")
        reply = await s.request("ping", req_id="after")
        assert reply["id"] == "after"
        assert [json.loads(k) for k in s.pending] == ([] if refusal else ["case"])
    lines = refused_lines(d, 2 if refusal else 0)
    assert [(status, method) for status, method, *_ in lines] == ([(refusal, "POST"), (refusal, "GET")] if refusal
                                                                  else []), lines
    log = d.log()
    leaked = [line for line in log.splitlines() if any(secret in line for secret in secrets_of(d.token, d.other_token))]
    assert not leaked, (leaked, secrets_of(d.token, d.other_token))


def stack_body(d: Daemon, extra: list[tuple[str, str | None]], refusal: int) -> bytes:
    if refusal == 403:
        return b"origin not allowed"
    if refusal == 421:
        return b"host not allowed"
    sent = [v for k, v in extra if k.startswith("Authorization")][0] or ""
    return b"invalid token" if sent.lower().startswith("bearer") else b"bearer token required"


@pytest.mark.parametrize("host", ["127.0.0.1:\xb2", "[::1]:\xb9", "localhost:8\xb3"])
@pytest.mark.parametrize("route", ["POST /message", "GET /sse"])
async def test_a_host_port_in_superscript_digits_is_421_not_a_crash(daemon_factory: Callable[..., Daemon],
                                                                    host: str, route: str) -> None:
    """``Host: 127.0.0.1:²`` (byte 0xB2: a digit to ``str.isdigit``, not to ``int``) names no port:
    with ``allowed_hosts`` set it is ``421`` like any other unknown host, logged once, no error."""
    d = daemon_factory(allowed_hosts="auto")
    method, path = route.split()
    async with SseSession(d) as s:
        body = ping("sup") if method == "POST" else b""
        target = s.endpoint if method == "POST" else path
        a = exchange(d, build(d, method, target, [("Host!", host)], body))
        assert (a.status, a.body) == (421, b"host not allowed"), a
    assert [status for status, *_ in refused_lines(d, 1)] == [421]
    assert_no_crash_in_log(d)


async def test_an_absolute_form_target_is_judged_by_its_own_host(daemon_factory: Callable[..., Daemon]) -> None:
    """``POST https://evil.example/message`` names the host ``evil.example`` whatever the ``Host``
    header says: with ``allowed_hosts`` set it must be refused (421) like ``Host: evil.example``."""
    d = daemon_factory(allowed_hosts="auto")
    async with SseSession(d) as s:
        body = ping("absolute")
        a = exchange(d, request("POST", f"https://evil.example{s.endpoint}", post_headers(d, body), body))
        assert a.status == 421, a
        _, port = d.host_port
        a = exchange(d, request("POST", f"https://localhost:{port}{s.endpoint}", post_headers(d, body), body))
        assert a.status == 202, a  # its own host allowed: served whatever Host says
        assert await s.reply("absolute") == {"jsonrpc": "2.0", "id": "absolute", "result": {}}


# -- whose session -------------------------------------------------------------------------------


async def test_another_principals_token_learns_nothing_an_unknown_session_would_not_tell(daemon: Daemon) -> None:
    """Bob's token on Alice's session, on a session that does not exist, on Alice's ``/mcp``
    session's id: the same ``404`` to the byte; Alice's stream gets nothing of Bob's."""
    async with SseSession(daemon) as s, mcp_client(daemon) as c:
        sid = s.endpoint.rsplit("=", 1)[1]
        mcp_sid = await open_mcp_session(c, daemon)
        answers = []
        for n, (token, target) in enumerate([(daemon.other_token, sid), (daemon.other_token, "0" * 32),
                                             (daemon.token, "0" * 32), (daemon.token, mcp_sid),
                                             (daemon.other_token, mcp_sid)]):
            body = ping(f"bob-{n}")
            a = exchange(daemon, request("POST", f"/message?session_id={target}",
                                         post_headers(daemon, body, token=token), body))
            answers.append((a.status, a.body, sorted(h for h in a.headers if h[0] != "date")))
        assert answers[0][0] == 404 and answers[0][1] == b"no such session", answers[0]
        assert all(a == answers[0] for a in answers), answers
        assert await s.request("ping", req_id="mine") == {"jsonrpc": "2.0", "id": "mine", "result": {}}
        assert not s.pending  # none of the five reached Alice's stream
    lines = refused_lines(daemon, 0)
    assert not any(secret in daemon.log() for secret in secrets_of(daemon.token, daemon.other_token)), lines


async def test_bobs_posts_on_alices_session_never_reach_her_stream(daemon: Daemon) -> None:
    async with SseSession(daemon) as s:
        for n in range(5):
            r = await s.post({"jsonrpc": "2.0", "id": f"bob-{n}", "method": "ping"}, token=daemon.other_token)
            assert r.status_code == 404 and r.text == "no such session"
        assert await s.request("ping", req_id="mine") == {"jsonrpc": "2.0", "id": "mine", "result": {}}
        assert not s.pending


async def test_a_revoked_token_is_refused_on_the_next_post_and_its_stream_ends(daemon_factory: Callable[..., Daemon]) -> None:
    """``mcpd users`` revokes Alice's token (users.yaml rewritten): her very next POST on her open
    session is ``401 invalid_token``, her stream is closed within seconds, and Bob's session lives."""
    d = daemon_factory()
    async with SseSession(d) as alice, SseSession(d, token=d.other_token) as bob:
        assert (await alice.request("ping", req_id=1))["result"] == {}
        users_file = d.state_dir / "users.yaml"
        users = identity.load_users(users_file)
        users["alice"] = identity.UserRecord(name="alice", os_user=users["alice"].os_user, tokens=[])
        identity.save_users(users_file, users)
        r = await alice.post({"jsonrpc": "2.0", "id": 2, "method": "ping"})
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith('Bearer error="invalid_token"'), r.text
        with pytest.raises(EOFError):  # the once-a-second re-check closes it
            while True:
                await alice.next_event(timeout=10)
        assert (await bob.request("ping", req_id="bob"))["result"] == {}
        assert "2" not in alice.pending
    assert_no_crash_in_log(d)


# -- the query string ----------------------------------------------------------------------------


async def test_session_id_must_be_given_once_and_exactly(daemon: Daemon) -> None:
    """Two ``session_id`` (even equal), an empty one beside a good one, upper case, a trailing NUL,
    33 digits: ``400``; the name percent-encoded is the same name (decoded as everywhere); junk
    parameters beside a good id are ignored; a 1000-parameter query is still just a 400."""
    async with SseSession(daemon) as s:
        sid = s.endpoint.rsplit("=", 1)[1]
        cases = [
            (f"session_id={sid}&session_id={sid}", 400), (f"session_id=&session_id={sid}", 400),
            (f"session_id={sid}&session_id={'0' * 32}", 400), (f"session_id={sid.upper()}", 400),
            (f"session_id={sid}%00", 400), (f"session_id={sid}0", 400), (f"session_id={sid};x=1", 400),
            (f"session_id={sid}&" + "&".join(f"session_id={n:032x}" for n in range(1000)), 400),
            (f"session%5Fid={sid}", 202), (f"session_id={sid}&" + "&".join(f"a{n}=b" for n in range(3000)), 202),
            (f"session_id={sid}#fragment", 202),
        ]
        accepted = []
        for n, (query, want) in enumerate(cases):
            body = ping(n)
            a = exchange(daemon, request("POST", f"/message?{query}", post_headers(daemon, body), body))
            assert a.status == want, (query[:80], a)
            if want == 400:
                assert a.body == b"missing or malformed session_id"
            else:
                accepted.append(n)
        await s.request("ping", req_id="last")
        assert sorted(json.loads(k) for k in s.pending) == accepted


@pytest.mark.parametrize("part", ["headers", "url"])
async def test_a_huge_request_line_or_header_block_is_refused_before_it_is_buffered(
        daemon: Daemon, part: str) -> None:
    """docs/REFERENCE.md: everything a client can make the server hold is bounded. 16 MiB of headers (or an
    8 MiB URL) must be refused (431 / 414, or the connection closed) before they are all read
    (``connections.max_header_bytes``, 64 KiB by default)."""
    total = 16 << 20 if part == "headers" else 8 << 20
    with open_raw(daemon, timeout=30) as sock:
        sent = 0
        try:
            if part == "url":
                sock.sendall(b"POST /message?session_id=" + b"0" * 32)
                chunk = b"&a=" + b"b" * 65533
            else:
                sock.sendall(b"POST /message?session_id=" + b"0" * 32 + b" HTTP/1.1\r\nHost: x\r\n")
                chunk = b"X-Junk: " + b"b" * 65526 + b"\r\n"
            while sent < total:
                sock.sendall(chunk)
                sent += len(chunk)
            sock.sendall((b" HTTP/1.1\r\nHost: x\r\n" if part == "url" else b"") +
                         b"Authorization: Bearer nope\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        except (OSError, ssl.SSLError):
            return  # closed before it was all sent: refused early
        try:
            answer = read_answer(sock, bytearray())
        except (OSError, ssl.SSLError, EOFError):
            return
    assert answer.status in (414, 431), answer


# -- bodies --------------------------------------------------------------------------------------


async def test_a_chunked_body_over_the_cap_is_413_and_the_connection_stays_usable(
        daemon_factory: Callable[..., Daemon]) -> None:
    """A chunked body passing the cap gets ``413`` (logged once); its remaining chunks are never
    taken for a request of their own: the next request on the connection is answered as itself."""
    d = daemon_factory(max_body_bytes=1024, base_path="/base")
    async with SseSession(d) as s:
        sid = s.endpoint.rsplit("=", 1)[1]
        smuggled = request("POST", f"/message?session_id={sid}", post_headers(d, ping("smuggled"), close=False),
                           ping("smuggled"))
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in [b" " * 600, b" " * 600, smuggled, b"{}"])
        head = [h for h in post_headers(d, b"", close=False) if h[0] != "Content-Length"]
        first = request("POST", f"/base/message?session_id={sid}", head + [("Transfer-Encoding", "chunked")])
        second = request("POST", f"/message?session_id={sid}", post_headers(d, ping("second")), ping("second"))
        with open_raw(d) as sock:
            sock.sendall(first + chunks + b"0\r\n\r\n" + second)
            buf = bytearray()
            a = read_answer(sock, buf)
            assert (a.status, a.body) == (413, b"body too large"), a
            try:
                b = read_answer(sock, buf)
            except (EOFError, OSError):
                b = None  # closing the connection after a 413 is fine too
        assert b is None or b.status == 202, b
        await s.request("ping", req_id="last")
        assert [json.loads(k) for k in s.pending] == ([] if b is None else ["second"])  # never "smuggled"
    lines = refused_lines(d, 1)
    assert [(status, path, reason) for status, _, path, reason in lines] == [(413, "/base/message", "body too large")]


async def test_pipelined_refusals_leave_the_connection_clean(daemon: Daemon) -> None:
    """Refusals answered without reading the body (401, 403, 415, 404, and a 401 whose chunked body
    spells a request) on one kept-alive connection, each followed by a good POST: every request is
    answered in order as itself, and only the good ones reach the session."""
    async with SseSession(daemon) as s:
        sid = s.endpoint.rsplit("=", 1)[1]
        target = f"/message?session_id={sid}"
        reqs, want = [], []
        for n, (extra, status) in enumerate([
                ([("Authorization!", "Bearer nope")], 401), ([("Origin", "https://evil.example")], 403),
                ([("Content-Type!", "text/plain")], 415), ([("Authorization!", f"Bearer {daemon.other_token}")], 404)]):
            body = ping(f"bad-{n}")
            headers = post_headers(daemon, body, close=False)
            for name, value in extra:
                headers = [h for h in headers if h[0] != name.rstrip("!")] + [(name.rstrip("!"), value)]
            reqs.append(request("POST", target, headers, body))
            want.append(status)
            reqs.append(request("POST", target, post_headers(daemon, ping(f"good-{n}"), close=False), ping(f"good-{n}")))
            want.append(202)
        # a chunked body, refused by its token before it is read, whose chunks spell a whole request
        smuggled = request("POST", target, post_headers(daemon, ping("smuggled"), close=False), ping("smuggled"))
        head = [h for h in post_headers(daemon, b"", token="nope", close=False) if h[0] != "Content-Length"]
        reqs.append(request("POST", target, head + [("Transfer-Encoding", "chunked")]) +
                    b"%x\r\n%s\r\n0\r\n\r\n" % (len(smuggled), smuggled))
        want.append(401)
        reqs.append(request("POST", target, post_headers(daemon, ping("good-4"), close=False), ping("good-4")))
        want.append(202)
        with open_raw(daemon) as sock:
            sock.sendall(b"".join(reqs))
            buf = bytearray()
            got = [read_answer(sock, buf).status for _ in reqs]
        assert got == want
        await s.request("ping", req_id="last")
        assert sorted(json.loads(k) for k in s.pending) == [f"good-{n}" for n in range(5)]  # never "smuggled"


async def test_expect_100_continue_is_refused_before_the_body_when_the_token_is_bad(daemon: Daemon) -> None:
    """A client that waits for ``100 Continue`` is told ``401`` at once when its token is bad (its
    body never needed), and gets ``100`` then ``202`` when it is good."""
    async with SseSession(daemon) as s:
        body = ping("continued")
        with open_raw(daemon) as sock:
            sock.sendall(request("POST", s.endpoint, post_headers(daemon, body, token="nope") +
                                 [("Expect", "100-continue")]))
            a = read_answer(sock, bytearray())
        assert a.status == 401, a
        with open_raw(daemon) as sock:
            sock.sendall(request("POST", s.endpoint, post_headers(daemon, body) + [("Expect", "100-continue")]))
            buf = bytearray()
            a = read_answer(sock, buf)
            assert a.status == 100, a
            sock.sendall(body)
            a = read_answer(sock, buf)
        assert a.status == 202, a
        assert (await s.reply("continued"))["result"] == {}


ODD_BODIES: list[tuple[str, list[tuple[str, str]], bytes, int]] = [
    ("no body", [("Content-Length!", "0")], b"", 400),
    ("null", [], b"null", 400),
    ("a string", [], b'"x"', 400),
    ("invalid UTF-8", [], b'{"a":"\xff"}', 400),
    ("a lone surrogate escaped", [], b'{"jsonrpc":"2.0","method":"x","params":{"a":"\\ud800"}}', 202),
    ("NaN", [], b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":NaN}}', 400),
    ("65 levels", [], b"[" * 65 + b"]" * 65, 400),
    ("64 levels", [], b"[" * 64 + b"]" * 64, 202),
    ("a 5000-digit integer", [], b"[" + b"9" * 5000 + b"]", 400),
    ("empty batch", [], b"[]", 202),
    ("UTF-8 byte order mark", [], b"\xef\xbb\xbf" + ping("bom"), 202),
    ("two content types, wrong first", [("Content-Type!", "text/plain"), ("Content-Type", "application/json")],
     ping("ct"), 415),
    ("odd content type parameters", [("Content-Type!", "application/json; charset=\xff; x")], ping("params"), 202),
    ("content-length with a sign", [("Content-Length!", "+{len}")], ping("sign"), 400),
    ("content-length in superscript digits", [("Content-Length!", "\xb2")], b"{}", 400),
    ("two content-lengths", [("Content-Length", "{len}")], ping("two"), 400),
    ("content-length and chunked", [("Transfer-Encoding", "chunked")], ping("te"), 400),
]


@pytest.mark.parametrize("case,extra,body,status", ODD_BODIES, ids=[c[0] for c in ODD_BODIES])
async def test_odd_bodies_and_framing_get_a_clear_answer_never_a_500(
        daemon: Daemon, case: str, extra: list[tuple[str, str]], body: bytes, status: int) -> None:
    async with SseSession(daemon) as s:
        headers = post_headers(daemon, body)
        for name, value in extra:
            if name.endswith("!"):
                name = name[:-1]
                headers = [h for h in headers if h[0] != name]
            headers.append((name, value.format(len=len(body))))
        a = exchange(daemon, request("POST", s.endpoint, headers, body))
        assert a.status == status, (case, a)
        assert (await s.request("ping", req_id="after"))["result"] == {}
    assert_no_crash_in_log(daemon)


async def test_a_slow_body_is_cut_by_the_body_deadline_and_reaches_no_one(daemon_factory: Callable[..., Daemon]) -> None:
    """A POST with a good token on a live session whose body trickles past ``body_seconds`` is
    dropped (connection closed, one ``400`` line) and nothing of it reaches the session."""
    d = daemon_factory(connections={"header_seconds": 2, "body_seconds": 2, "idle_seconds": 2})
    async with SseSession(d) as s:
        body = ping("slow")
        with open_raw(d) as sock:
            sock.sendall(request("POST", s.endpoint, post_headers(d, body)) + body[:5])
            sock.settimeout(10)
            closed_at = time.monotonic() + 10
            data = b""
            while time.monotonic() < closed_at:
                try:
                    chunk = sock.recv(4096)
                except (OSError, ssl.SSLError):
                    break
                if not chunk:
                    break
                data += chunk
            else:
                pytest.fail("the connection outlived the body deadline")
        assert not data.startswith(b"HTTP/1.1 202"), data
        assert (await s.request("ping", req_id="after"))["result"] == {}
        assert not s.pending
    lines = refused_lines(d, 1)
    assert [(status, reason) for status, _, _, reason in lines] == [(400, "client disconnected")], lines
    assert_no_crash_in_log(d)


# -- floods and races ----------------------------------------------------------------------------


async def test_a_flood_of_bad_tokens_is_refused_and_logged_one_by_one(daemon: Daemon) -> None:
    """300 POSTs on one kept-alive connection with forged, malformed or no tokens: each a ``401``
    with its RFC 6750 challenge, each one log line naming at most the token's id, then a good POST
    on the same connection still works."""
    before = len(refused_lines(daemon, 0))
    async with SseSession(daemon) as s:
        forged = [f"mcpd_{n:012x}_" + "Q" * 43 for n in range(100)]
        async with httpx.AsyncClient(verify=daemon.ssl_context(), timeout=EVENT_TIMEOUT,
                                     limits=httpx.Limits(max_connections=1)) as c:
            url = daemon.url + s.endpoint
            for n in range(300):
                kind = n % 3
                headers = {"Content-Type": "application/json"}
                if kind == 0:
                    headers["Authorization"] = f"Bearer {forged[n // 3]}"
                elif kind == 1:
                    headers["Authorization"] = f"Bearer not-a-token-{n}"
                r = await c.post(url, content=ping(n), headers=headers)
                assert r.status_code == 401, (n, r.text)
                assert r.headers["www-authenticate"] == ("Bearer" if kind == 2 else
                                                         'Bearer error="invalid_token", error_description='
                                                         '"the token is unknown, expired or revoked"')
            r = await c.post(url, content=ping("good"), headers={**daemon.auth(), "Content-Type": "application/json"})
            assert r.status_code == 202
        assert (await s.reply("good"))["result"] == {}
        assert not s.pending
    lines = refused_lines(daemon, before + 300)[before:]
    assert len(lines) == 300, len(lines)
    for n, (status, method, path, reason) in enumerate(lines):
        want = [f"invalid token (token id {n // 3:012x})", "invalid token (not an mcpd token)",
                "bearer token required (no bearer token)"][n % 3]
        assert (status, method, path, reason) == (401, "POST", "/message", want), (n, reason)
    assert "Q" * 43 not in daemon.log()


async def test_posts_racing_the_close_of_their_session_get_202_or_404_and_nothing_breaks(
        daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    """Slow calls in flight and 60 POSTs under way while the stream closes: every POST is answered
    202 or 404 (never 5xx, never a dropped connection), later POSTs are 404, the calls' workers are
    stopped, and the log holds no error."""
    d = daemon_factory(workers={"timeout_seconds": 120})
    path = slow_file(tmp_path)
    s = SseSession(d)
    await s.__aenter__()
    await s.initialize()
    endpoint = s.endpoint
    for n in range(2):
        await s.post({"jsonrpc": "2.0", "id": f"slow-{n}", "method": "tools/call",
                      "params": {"name": "files/read", "arguments": {"path": str(path), "start_line": 3}}})
    async with httpx.AsyncClient(verify=d.ssl_context(), timeout=EVENT_TIMEOUT,
                                 limits=httpx.Limits(max_connections=20)) as c:
        async def one(n: int) -> int:
            body = ping(n) if n % 2 else json.dumps({"jsonrpc": "2.0", "id": n, "method": "tools/list"}).encode()
            r = await c.post(d.url + endpoint, content=body, headers={**d.auth(), "Content-Type": "application/json"})
            return r.status_code

        posts = [asyncio.create_task(one(n)) for n in range(60)]
        await asyncio.sleep(0.05)
        await s.close()
        statuses = await asyncio.gather(*posts)
        assert set(statuses) <= {202, 404}, statuses
        r = await c.post(d.url + endpoint, content=ping("late"), headers={**d.auth(), "Content-Type": "application/json"})
        for _ in range(100):  # the server notices the stream's end at once, or within moments
            if r.status_code == 404:
                break
            await asyncio.sleep(0.05)
            r = await c.post(d.url + endpoint, content=ping("late"),
                             headers={**d.auth(), "Content-Type": "application/json"})
        assert r.status_code == 404
    assert_no_crash_in_log(d)


async def test_a_post_whose_body_ends_after_its_session_closed_is_404(daemon: Daemon) -> None:
    """docs/REFERENCE.md: a closed session's POSTs get 404. A POST whose headers came while the session was open
    but whose body comes after it closed is handed to no one, so it must be told 404, not 202."""
    s = SseSession(daemon)
    await s.__aenter__()
    body = ping("late-body")
    with open_raw(daemon) as sock:
        sock.sendall(request("POST", s.endpoint, post_headers(daemon, body)) + body[:5])
        await asyncio.sleep(0.2)  # the headers are in, the route waits for the body
        await s.close()
        async with httpx.AsyncClient(verify=daemon.ssl_context(), timeout=EVENT_TIMEOUT) as c:
            for _ in range(100):
                r = await c.post(daemon.url + s.endpoint, content=ping("probe"),
                                 headers={**daemon.auth(), "Content-Type": "application/json"})
                if r.status_code == 404:
                    break
                await asyncio.sleep(0.05)
        assert r.status_code == 404  # the session is gone
        sock.sendall(body[5:])
        a = read_answer(sock, bytearray())
    assert a.status == 404, a


# -- the refusal log -----------------------------------------------------------------------------


async def test_no_refusal_line_ever_holds_a_token(daemon_factory: Callable[..., Daemon]) -> None:
    """Real and forged tokens sent in every place a client can put them, on refusals of every kind
    the lean route gives (and the stack's for the path variants): the log holds ids at most."""
    d = daemon_factory(max_body_bytes=256, allowed_origins=[OK_ORIGIN], allowed_hosts="auto", base_path="/base")
    tokens = [d.token, d.other_token, FORGED]
    async with SseSession(d) as s:
        sid = s.endpoint.rsplit("=", 1)[1]
        sent = 0
        for token in tokens:
            body = ping("t")
            cases = [
                (f"/message?session_id={sid}", post_headers(d, body, token=token) + [("Origin", "https://evil.example")], body),
                (f"/message?session_id={sid}", post_headers(d, body, token=token, host="evil.example"), body),
                (f"/message?session_id={sid}", post_headers(d, body, token="nope") + [("Authorization", f"Bearer {token}")], body),
                (f"/message?session_id={sid}", post_headers(d, body, token=f"{token}x"), body),
                (f"/message?session_id=bad&access_token={token}", post_headers(d, body, token=token), body),
                (f"/base/message?session_id={'0' * 32}&token={token}", post_headers(d, body, token=token), body),
                (f"/message/{token}?session_id={sid}", post_headers(d, body, token=token), body),
                (f"/base/message%2F{token}?session_id={sid}", post_headers(d, body, token=token), body),
                (f"/message?session_id={sid}", post_headers(d, token.encode() * 10, token=token), token.encode() * 10),
                (f"/message?session_id={sid}", post_headers(d, token.encode(), token=token), token.encode()),
            ]
            for target, headers, payload in cases:
                a = exchange(d, request("POST", target, headers, payload))
                assert a.status >= 400, (target, a)
                assert token.encode() not in a.body  # nor does an answer echo one
                sent += 1
    lines = refused_lines(d, sent)
    assert len(lines) == sent, lines
    log = d.log()
    for secret in secrets_of(*tokens):
        assert secret not in log


# -- with the root helper (tokens checked there, a short cache in the front) ----------------------


@pytest.mark.root
async def test_with_the_helper_a_revoked_token_stops_posting_within_seconds_and_for_good() -> None:
    """The lean route checks a POST's token with the front's 2-second cache of the helper's answer
    (as the stack did). Revoking Alice's token must still end her POSTs within seconds (docs/REFERENCE.md:
    revocation ends sessions within seconds): first refusal (401, or 404 once the re-check has
    closed the session) within 10 s, and never a 202 again. A forged-token flood meanwhile is 401
    each (never a 5xx). With the helper killed, a forged token of the right shape is never accepted:
    nobody can tell it from a real token the front has not checked lately, so it is answered 503
    with Retry-After (a real client must retry, not drop its token), while a malformed one is still
    401 (the front refuses it by its form alone)."""
    from tests.support.osaccounts import AccountFactory
    from tests.support.privsep_fixture import start_privsep, stop_privsep

    factory = AccountFactory()
    pd = start_privsep(factory)
    d = as_daemon(pd)
    try:
        async with SseSession(d) as alice, SseSession(as_daemon(pd, "bob", "alice")) as bob, \
                httpx.AsyncClient(verify=d.ssl_context(), timeout=EVENT_TIMEOUT) as c:
            assert (await alice.request("ping", req_id="before"))["result"] == {}
            for n in range(100):
                r = await c.post(d.url + alice.endpoint, content=ping(n),
                                 headers={"Authorization": f"Bearer mcpd_{n:012x}_" + "Q" * 43,
                                          "Content-Type": "application/json"})
                assert r.status_code == 401, r.text
            users_file = pd.state_dir / "users.yaml"
            users = identity.load_users(users_file)
            users["alice"] = identity.UserRecord(name="alice", os_user=users["alice"].os_user, tokens=[])
            identity.save_users(users_file, users)
            revoked = time.monotonic()
            statuses: list[int] = []
            while time.monotonic() - revoked < 10:
                r = await alice.post({"jsonrpc": "2.0", "id": "after", "method": "ping"})
                statuses.append(r.status_code)
                if r.status_code != 202:
                    break
                await asyncio.sleep(0.05)
            assert statuses[-1] in (401, 404), statuses
            for _ in range(20):  # and for good
                r = await alice.post({"jsonrpc": "2.0", "id": "later", "method": "ping"})
                assert r.status_code in (401, 404), r.status_code
            assert (await bob.request("ping", req_id="bob"))["result"] == {}
            pd.kill_helper()
            r = await c.post(d.url + bob.endpoint, content=ping("forged"),
                             headers={"Authorization": f"Bearer {FORGED}", "Content-Type": "application/json"})
            assert (r.status_code, r.headers.get("retry-after")) == (503, "2"), (r.status_code, r.headers, r.text)
            assert "cannot be checked now" in r.text and "invalid" not in r.text, r.text
            r = await c.post(d.url + bob.endpoint, content=ping("malformed"),
                             headers={"Authorization": "Bearer not-an-mcpd-token", "Content-Type": "application/json"})
            assert r.status_code == 401 and "retry-after" not in r.headers, (r.status_code, r.text)
        log = pd.log("front.log")
        assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-4000:]
        assert not any(secret in log for secret in secrets_of(*pd.tokens.values()))
    finally:
        stop_privsep(pd)
        factory.cleanup()
