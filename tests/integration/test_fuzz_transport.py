"""Bounded fuzz tests over the real transports, against the real daemon and its workers over TLS.

The first: a few thousand hostile bodies from a fixed seed (``tests/support/fuzzgen.py``) POSTed to
``/message`` (four SSE sessions) and ``/mcp`` (a Streamable HTTP session). Asserted: no ``5xx``;
no SSE stream ended by the server; every request answered (each valid id exactly once, each
invalid id as one ``id: null`` reply); no reply is an internal error (a JSON-RPC ``-32603`` or a
tool's ``INTERNAL_ERROR``); every reply strict JSON; the daemon alive and still serving at the end.

The second (:func:`test_fuzzed_mcp_in_both_eras_gets_the_documented_answers`): seeded ``/mcp``
inputs of both Streamable HTTP eras, methods and headers as well as bodies (``tests/support/fuzzmcp.py``),
each held against the answer the documented rules give; its count and seed come from
``MCPD_FUZZ_MCP_INPUTS`` and ``MCPD_FUZZ_SEED`` (a CI slice by default). Every loop is bounded in
count and time.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Daemon, SseSession, start_daemon, stop_daemon
from tests.support import fuzzmcp
from tests.support.fuzzgen import Generator, expectation, strict

SEED = 20261201
SSE_SESSIONS = 4
SSE_BODIES = 350  # per SSE session
MCP_BODIES = 600
CONCURRENCY = 8  # POSTs in flight per session
DEADLINE = 120.0  # seconds for the whole exchange (it takes far less; a hang fails instead of blocking CI)




def files(root: Path) -> list[str]:
    (root / "small.txt").write_text("one\ntwo\r\nthree")
    (root / "utf8.txt").write_text("é€\u2028x\n" * 50)
    (root / "empty.txt").write_bytes(b"")
    (root / "binary.bin").write_bytes(b"\0\1\2")
    (root / "long.txt").write_bytes(b"y" * 70_000 + b"\nshort\n")
    (root / "latin.txt").write_bytes(b"caf\xe9\n")
    os.mkfifo(root / "fifo")
    (root / "dir").mkdir()
    with open(os.path.join(os.fsencode(root / "dir"), b"caf\xe9.txt"), "wb") as f:  # a name that is not UTF-8
        f.write(b"x\n")
    os.chmod(root, 0o755)
    return [str(root / n) for n in ("small.txt", "utf8.txt", "empty.txt", "binary.bin", "long.txt", "latin.txt",
                                    "fifo", "dir")]


def internal_errors(reply: Any) -> list[Any]:
    """The internal errors in one reply: a JSON-RPC -32603, or a tool result with INTERNAL_ERROR."""
    out = []
    for r in reply if isinstance(reply, list) else [reply]:
        if not isinstance(r, dict):
            continue
        if isinstance(r.get("error"), dict) and r["error"].get("code") == -32603:
            out.append(r)
        err = (r.get("result") or {}).get("structuredContent", {}).get("error") if isinstance(r.get("result"), dict) \
            else None
        if isinstance(err, dict) and err.get("code") == "INTERNAL_ERROR":
            out.append(r)
    return out


class Tally:
    """Expected and received replies of one SSE session (ids by their JSON text)."""

    def __init__(self) -> None:
        self.want: collections.Counter[str] = collections.Counter()
        self.got: collections.Counter[str] = collections.Counter()
        self.nulls_want = 0
        self.nulls_got = 0
        self.internal: list[Any] = []
        self.statuses: collections.Counter[int] = collections.Counter()

    def expect(self, ids: list[Any], nulls: int) -> None:
        self.want.update(json.dumps(i) for i in ids)
        self.nulls_want += nulls

    def receive(self, reply: Any) -> None:
        self.internal += internal_errors(reply)
        for r in reply if isinstance(reply, list) else [reply]:
            if isinstance(r, dict) and "method" not in r:
                if r.get("id") is None:
                    self.nulls_got += 1
                else:
                    self.got[json.dumps(r["id"])] += 1

    def complete(self) -> bool:
        return self.got == self.want and self.nulls_got == self.nulls_want


async def fuzz_sse(d: Daemon, client: httpx.AsyncClient, gen: Generator, count: int) -> Tally:
    tally = Tally()
    async with SseSession(d, client=client) as s:
        await s.initialize("2025-03-26")  # (a version with batches, which the bodies hold)
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one() -> None:
            body, ctype = gen.body()
            want = expectation(body, ctype)
            if want is not None:
                _, ids, nulls, _ = want
                tally.expect(ids, nulls)
            async with gate:
                r = await s.post(None, raw=body, headers={"Content-Type": ctype} if ctype else {"Content-Type": ""})
            tally.statuses[r.status_code] += 1
            if want is None:
                assert 400 <= r.status_code < 500, (body[:200], r.status_code)
                if r.headers.get("content-type", "").startswith("application/json"):
                    strict(r.text)
            else:
                assert r.status_code == 202, (body[:200], r.status_code, r.text[:200])

        posted = asyncio.Event()

        async def drain() -> None:
            while not (posted.is_set() and tally.complete()):
                try:
                    ev = await s.next_event(timeout=0.5)
                except TimeoutError:
                    continue  # (the loop is bounded by the wait below)
                if ev.event == "message":
                    tally.receive(strict(ev.data))

        reader = asyncio.create_task(drain())
        await asyncio.gather(*(one() for _ in range(count)))
        posted.set()
        try:
            await asyncio.wait_for(asyncio.shield(reader), 60)
        except (TimeoutError, EOFError):
            pass
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        # the stream is still open and the session still answers
        assert await s.request("ping") == {"jsonrpc": "2.0", "id": s._next_id, "result": {}}
    return tally


async def fuzz_mcp(d: Daemon, client: httpx.AsyncClient, gen: Generator, count: int) -> Tally:
    tally = Tally()
    base = {**d.auth(), "Accept": "application/json"}
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {  # (a version with batches)
        "protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "0"}}}
    r = await client.post(d.url + "/mcp", json=init, headers=base)
    assert r.status_code == 200, r.text
    sid = r.headers["mcp-session-id"]
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one() -> None:
        body, ctype = gen.body()
        want = expectation(body, ctype)
        async with gate:
            r = await client.post(d.url + "/mcp", content=body,
                                  headers={**base, "Mcp-Session-Id": sid, "Content-Type": ctype})
        tally.statuses[r.status_code] += 1
        assert r.status_code < 500, (body[:200], r.status_code, r.text[:300])
        if want is None:
            assert 400 <= r.status_code < 500, (body[:200], r.status_code)
            return
        _, ids, nulls, anything = want
        tally.expect(ids, nulls)
        if not anything:
            assert r.status_code == 202, (body[:200], r.status_code, r.text[:200])
            return
        assert r.status_code in (200, 400), (body[:200], r.status_code, r.text[:200])
        tally.receive(strict(r.text))

    await asyncio.gather(*(one() for _ in range(count)))
    return tally


@pytest.fixture
def fuzz_daemon(tmp_path: Path) -> Any:
    (tmp_path / "files").mkdir()
    paths = files(tmp_path / "files")
    d = start_daemon(tmp_path / "d", keepalive_seconds=1.0)
    yield d, paths
    stop_daemon(d)


def test_fuzzed_bodies_over_sse_and_mcp_are_all_answered_and_break_nothing(fuzz_daemon: Any) -> None:
    d, paths = fuzz_daemon

    async def go() -> list[Tally]:
        limits = httpx.Limits(max_connections=40, max_keepalive_connections=40)
        async with httpx.AsyncClient(verify=d.ssl_context(), timeout=30, limits=limits) as client:
            gens = [Generator(SEED + i, paths, i) for i in range(SSE_SESSIONS + 1)]
            jobs = [fuzz_sse(d, client, gens[i], SSE_BODIES) for i in range(SSE_SESSIONS)]
            jobs.append(fuzz_mcp(d, client, gens[-1], MCP_BODIES))
            return await asyncio.wait_for(asyncio.gather(*jobs), DEADLINE)

    started = time.monotonic()
    tallies = asyncio.run(go())
    took = time.monotonic() - started
    for i, t in enumerate(tallies):
        kind = "mcp" if i == SSE_SESSIONS else f"sse{i}"
        assert not t.internal, f"{kind}: internal errors: {t.internal[:3]}"
        assert t.got == t.want, (kind, t.want - t.got, t.got - t.want)
        assert t.nulls_got == t.nulls_want, (kind, t.nulls_got, t.nulls_want)
        assert not any(s >= 500 for s in t.statuses), (kind, t.statuses)
    assert d.proc.poll() is None, "the daemon died"
    with httpx.Client(verify=d.ssl_context(), timeout=10) as c:
        assert c.get(d.url + "/sse", headers={"Authorization": "Bearer nope"}).status_code == 401
    print(f"fuzz: {SSE_SESSIONS * SSE_BODIES + MCP_BODIES} bodies in {took:.1f} s; "
          + "; ".join(f"{dict(t.statuses)}" for t in tallies))


# -- /mcp in both eras --------------------------------------------------------------------------------

#: Inputs of the /mcp fuzz run and its seed: a CI slice by default; a longer run is
#: ``MCPD_FUZZ_MCP_INPUTS=100000 MCPD_FUZZ_SEED=7 .venv/bin/python -m pytest -s
#: tests/integration/test_fuzz_transport.py -k mcp_in_both_eras`` (see the test's docstring).
MCP_INPUTS = int(os.environ.get("MCPD_FUZZ_MCP_INPUTS", "2500"))
MCP_SEED = int(os.environ.get("MCPD_FUZZ_SEED", str(SEED)))
MCP_CONCURRENCY = 12
MCP_SECONDS_PER_INPUT = 0.1  # the run's deadline: a hang fails it (a CI slice takes a few seconds per 1000 inputs)
MAX_VICTIMS = 10  # deletable sessions of one principal kept open at once (far below its session cap)
INIT_PARAMS = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "0"}}


class Findings(list[str]):
    """The findings of a run, each also appended to the file ``path`` names as it is found (a
    long run's are readable while it runs)."""

    def __init__(self, path: str | None) -> None:
        super().__init__()
        self.path = path
        if path:
            Path(path).write_text("")

    def append(self, finding: str) -> None:
        super().append(finding)
        if self.path:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(finding + "\n")


class McpFuzz:
    """The /mcp fuzz harness: the sessions it keeps, the inputs it sends, and what it found.

    Sessions: three of alice's kept for the whole run (``main``; the first holds a GET stream
    from start to end, so every other GET on it must be ``409``), one of bob's, two deleted
    before the run, one ``/sse`` session, and deletable ones (``victim``: opened by the fuzzed
    ``initialize`` requests or by the harness, deleted by fuzzed DELETEs, each DELETE sent with up
    to three requests and a GET stream on the same session racing it). Every response is held
    against :func:`tests.support.fuzzmcp.predict`; the state of a session an input names is read from the
    sequence numbers of its DELETE: answered before the input was sent, it is gone (``404``);
    sent before the input's answer came, either outcome is allowed.
    """

    def __init__(self, d: Daemon, client: httpx.AsyncClient, gen: fuzzmcp.McpGenerator, slow: str) -> None:
        self.d, self.client, self.gen, self.slow = d, client, gen, slow
        self.rng = random.Random(gen.rng.random())
        self.tokens = {"alice": d.token, "bob": d.other_token, "bad": "mcpd_000000000000_" + "A" * 43}
        self.known: dict[str, fuzzmcp.Known] = {}
        self.seq = 0
        self.findings = Findings(os.environ.get("MCPD_FUZZ_FINDINGS"))
        self.stats: dict[str, collections.Counter[Any]] = collections.defaultdict(collections.Counter)
        self.deleted_names: list[str] = []
        self.sentinel: asyncio.Task[None] | None = None
        self.sentinel_pings = 0
        self.held: set[asyncio.Task[Any]] = set()

    def tick(self) -> int:
        self.seq += 1
        return self.seq

    # -- sessions ---------------------------------------------------------------------------------

    def names(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = collections.defaultdict(list)
        for name, k in self.known.items():
            role = "dead" if k.deleted is not None else k.role
            if role == "victim" and k.delete_sent is not None:
                role = "dead"  # (dying: a request to it races its DELETE)
            out[role].append(name)
        return out

    def ids(self) -> dict[str, str]:
        return {name: k.id for name, k in self.known.items()}

    def state(self, target: str | None, principal: str, sent: int, answered: int) -> str:
        k = self.known.get(target) if target is not None else None
        if k is None or k.owner != principal or k.role == "sse":
            return "absent"
        if k.deleted is not None and k.deleted < sent:
            return "absent"
        if k.delete_sent is not None and k.delete_sent < answered:
            return "racing"
        return "live"

    async def open_session(self, owner: str, role: str, version: str = "2025-06-18") -> str:
        r = await self.client.post("/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            **INIT_PARAMS, "protocolVersion": version}}, headers=self.base(owner))
        assert r.status_code == 200, r.text
        name = f"{role}{len(self.known)}"
        self.known[name] = fuzzmcp.Known(r.headers["mcp-session-id"], owner, role, version=version)
        return name

    def batches(self, target: str | None) -> bool | None:
        """Whether the session ``target`` takes batches (negotiated before 2025-06-18); ``None``:
        unknown (a session the fuzzed requests opened)."""
        k = self.known.get(target) if target is not None else None
        return None if k is None or k.version is None else k.version < "2025-06-18"

    def base(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[token]}", "Accept": "application/json, text/event-stream",
                "Content-Type": "application/json"}

    async def delete_now(self, name: str) -> None:
        k = self.known[name]
        k.delete_sent = self.tick()
        r = await self.client.delete("/mcp", headers={**self.base(k.owner), "Mcp-Session-Id": k.id})
        assert r.status_code == 200, r.text
        k.deleted = self.tick()
        self.deleted_names.append(name)

    async def setup(self) -> SseSession:
        for version in ("2025-06-18", "2025-11-25", "2025-03-26"):
            await self.open_session("alice", "main", version)
        await self.open_session("bob", "bob")
        for _ in range(2):
            name = await self.open_session("alice", "victim")
            await self.delete_now(name)
            self.known[name].role = "dead"
        for _ in range(3):
            await self.open_session("alice", "victim")
        sse = SseSession(self.d, client=self.client)
        await sse.__aenter__()
        await sse.initialize()
        self.known["sse"] = fuzzmcp.Known(sse.endpoint.rsplit("=", 1)[1], "alice", "sse")
        main0 = self.known["main0"]
        ready = asyncio.Event()
        self.sentinel = asyncio.create_task(self.keep_sentinel(main0, ready))
        await asyncio.wait_for(ready.wait(), 10)
        return sse

    async def keep_sentinel(self, k: fuzzmcp.Known, ready: asyncio.Event) -> None:
        """main0's GET stream, held and read for the whole run (its end is a finding)."""
        h = {**self.base("alice"), "Mcp-Session-Id": k.id, "Accept": "text/event-stream"}
        try:
            async with self.client.stream("GET", "/mcp", headers=h, timeout=httpx.Timeout(30, read=None)) as r:
                assert r.status_code == 200, r.status_code
                k.streams_open += 1
                ready.set()
                async for chunk in r.aiter_raw():
                    self.sentinel_pings += chunk.count(b": ping")
        except httpx.TransportError as exc:
            self.findings.append(f"main0's GET stream broke after input {self.stats['all']['inputs']}: {exc!r}")
        else:
            self.findings.append(f"main0's GET stream ended after input {self.stats['all']['inputs']}")

    # -- inputs -------------------------------------------------------------------------------------

    def make(self) -> fuzzmcp.Req:
        era = "stateless" if self.gen.rng.random() < 0.45 else "session"
        names, ids = self.names(), self.ids()
        return self.gen.stateless(names, ids) if era == "stateless" else self.gen.session_era(names, ids)

    def headers(self, req: fuzzmcp.Req) -> list[tuple[bytes, bytes]]:
        h = list(req.headers)
        if req.token in self.tokens:
            h.append(("Authorization", f"Bearer {self.tokens[req.token]}"))
        return [(n.encode(), v if isinstance(v, bytes) else v.encode("latin-1")) for n, v in h]

    def retarget(self, req: fuzzmcp.Req, victim: str) -> None:
        k = self.known[victim]
        req.headers = [(n, v) for n, v in req.headers if n.lower() != "mcp-session-id"] + [("Mcp-Session-Id", k.id)]
        req.target = victim

    async def victim(self, owner: str = "alice") -> str:
        live = [n for n in self.names().get("victim", []) if self.known[n].owner == owner]
        return self.rng.choice(live) if live else await self.open_session(owner, "victim")

    async def one(self, gate: asyncio.Semaphore) -> None:
        req = self.make()
        if req.method == "DELETE":
            _, outcomes = fuzzmcp.predict(req, lambda t, p: "live" if self.state(t, p, 0, 0) != "absent" else "absent",
                                          self.batches)
            if any(o.kind == "deleted" for o in outcomes):
                k = self.known[req.target] if req.target else None
                if k is None or k.role != "victim":
                    self.retarget(req, await self.victim(req.token))
                await self.race_delete(req, gate)
                return
        async with gate:
            await self.send(req)

    async def race_delete(self, req: fuzzmcp.Req, gate: asyncio.Semaphore) -> None:
        """A DELETE of a victim, with requests on the same session in flight around it."""
        k = self.known[req.target]  # type: ignore[index]
        racers = []
        for _ in range(self.rng.randrange(0, 4)):
            kind = self.rng.random()
            if kind < 0.3:
                body = {"jsonrpc": "2.0", "id": self.gen.bodies.new_id(), "method": "tools/call", "params": {
                    "name": "files/read", "arguments": {"path": self.slow, "start_line": 3}}}
            elif kind < 0.5:
                body = {"jsonrpc": "2.0", "id": self.gen.bodies.new_id(), "method": "tools/call", "params": {
                    "name": "files/read", "arguments": {"path": self.slow, "start_line": 3},
                    "_meta": {"progressToken": "r"}}}
            else:
                body = self.gen.plain_request()
            h: list[tuple[str, str | bytes]] = [("Accept", "application/json, text/event-stream"),
                                                ("Content-Type", "application/json"), ("Mcp-Session-Id", k.id)]
            racers.append(fuzzmcp.Req("POST", h, json.dumps(body).encode(), fuzzmcp.STANDARD_ACCEPT, k.owner,
                                      req.target, "session", "POST racing a DELETE"))
        if self.rng.random() < 0.3:
            racers.append(fuzzmcp.Req("GET", [("Accept", "text/event-stream"), ("Mcp-Session-Id", k.id)], None,
                                      fuzzmcp.AcceptHeader(("text/event-stream",), False, True, False), k.owner,
                                      req.target, "session", "GET racing a DELETE"))

        async def racer(r: fuzzmcp.Req) -> None:
            async with gate:
                await self.send(r)

        tasks = [asyncio.ensure_future(racer(r)) for r in racers]
        await asyncio.sleep(self.rng.choice([0, 0, 0.005, 0.02, 0.05]))
        async with gate:
            await self.send(req)
        await asyncio.gather(*tasks)

    async def send(self, req: fuzzmcp.Req) -> None:
        """Send one input and judge its answer; a connection the daemon broke is a finding."""
        try:
            await self._send(req)
        except httpx.TransportError as exc:
            self.findings.append(f"{req.label} {req.era}: the connection broke after input "
                                 f"{self.stats['all']['inputs']} (daemon alive: {self.d.proc.poll() is None}): "
                                 f"{exc!r}\n  headers: {self.show(req)}\n  body: {(req.body or b'')[:300]!r}")

    async def _send(self, req: fuzzmcp.Req) -> None:
        k = self.known.get(req.target) if req.target else None
        if k is not None and req.body and b"initialize" in req.body:
            k.version = None  # it may negotiate again: whether it takes batches is unknown from now on
        deleting = False
        if req.method == "DELETE" and k is not None and k.role == "victim":
            _, outcomes = fuzzmcp.predict(req, lambda t, p: self.state(t, p, self.seq + 1, self.seq + 1), self.batches)
            deleting = any(o.kind == "deleted" for o in outcomes)
        sent = self.tick()
        if deleting and k is not None and k.delete_sent is None:
            k.delete_sent = sent
        held409 = k is not None and req.method in ("GET", "HEAD") and k.streams_open > 0
        if k is not None and req.method in ("GET", "HEAD"):
            k.gets += 1
        headers = self.headers(req)
        if req.method == "GET":
            async with self.client.stream("GET", "/mcp", headers=headers) as r:
                answered = self.tick()
                body = b"" if r.status_code == 200 else await r.aread()
                self.judge(req, sent, answered, r, body, held409 and k is not None and k.streams_open > 0)
                if r.status_code == 200 and k is not None:
                    await self.hold(r, k)
            return
        r = await self.client.request(req.method, "/mcp", headers=headers, content=req.body)
        answered = self.tick()
        self.judge(req, sent, answered, r, r.content, held409 and k is not None and k.streams_open > 0)
        if req.method == "DELETE" and r.status_code == 200 and k is not None:
            k.deleted = answered
            self.deleted_names.append(req.target)  # type: ignore[arg-type]
        if req.method == "POST" and r.status_code == 200 and "mcp-session-id" in r.headers \
                and req.target is None and req.token in ("alice", "bob"):
            sid = r.headers["mcp-session-id"]
            if not fuzzmcp.SID_RE.fullmatch(sid) or sid in self.ids().values():
                self.findings.append(f"initialize answered a bad or old session id {sid!r}")
                return
            name = f"victim{len(self.known)}"
            self.known[name] = fuzzmcp.Known(sid, req.token, "victim")
            live = [n for n in self.names().get("victim", []) if self.known[n].owner == req.token]
            if len(live) > MAX_VICTIMS:
                await self.delete_now(live[0])

    def judge(self, req: fuzzmcp.Req, sent: int, answered: int, r: httpx.Response, body: bytes,
              must_conflict: bool) -> None:
        route, outcomes = fuzzmcp.predict(req, lambda t, p: self.state(t, p, sent, answered), self.batches)
        if must_conflict:  # the harness holds this session's GET stream: a second one is 409
            outcomes = [o for o in outcomes if o.kind != "stream"]
        why = fuzzmcp.check(outcomes, r.status_code, r.headers, body, req.method)
        stats = self.stats[req.era]
        stats["inputs"] += 1
        self.stats["all"]["inputs"] += 1
        if self.stats["all"]["inputs"] % 10_000 == 0:
            print(f"mcp fuzz: {self.stats['all']['inputs']} inputs, {len(self.findings)} findings", flush=True)
        stats[f"{route} {req.method} {r.status_code}"] += 1
        if why is None and req.method == "POST" and r.status_code == 200 and req.target is None:
            opens = any(o.opens for o in outcomes)
            has_sid = "mcp-session-id" in r.headers
            if has_sid and not opens:
                why = "a session id where no initialize opened one"
            elif opens and r.headers.get("content-type", "").startswith("application/json"):
                ok = "result" in json.loads(body)
                if ok != has_sid:
                    why = "an initialize's session id given without success, or missing after it"
        if why is not None:
            stats["findings"] += 1
            self.findings.append(f"{req.label} {req.era} via {route}: {why}\n  headers: {self.show(req)}\n"
                                 f"  body: {(req.body or b'')[:300]!r}\n  answer: {r.status_code} {body[:300]!r}")

    def show(self, req: fuzzmcp.Req) -> list[tuple[str, Any]]:
        return [(n, v) for n, v in req.headers] + [("token", req.token), ("target", req.target)]

    async def hold(self, r: httpx.Response, k: fuzzmcp.Known) -> None:
        """Hold a GET stream a little (abandoned then): it must carry only keep-alives, and end
        only when its session is deleted, within 10 s of that."""
        if k.streams_open > 0:
            self.findings.append(f"a second GET stream opened on {k.id}")
        k.streams_open += 1
        buf = bytearray()

        async def read() -> None:
            try:
                async for chunk in r.aiter_raw():
                    buf.extend(chunk)
            except httpx.HTTPError:
                pass

        reader = asyncio.ensure_future(read())
        try:
            done, _ = await asyncio.wait({reader}, timeout=self.rng.choice([0, 0, 0.02, 0.1, 0.3, 1.3]))
            if not done and k.delete_sent is not None:
                done, _ = await asyncio.wait({reader}, timeout=10)
                if not done and k.deleted is not None:
                    self.findings.append(f"a GET stream outlived the DELETE of its session {k.id}")
            elif done and k.delete_sent is None:
                self.findings.append(f"a GET stream of the live session {k.id} ended")
        finally:
            k.streams_open -= 1
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        text = bytes(buf).decode("utf-8", "replace")
        whole = text[:text.rfind("\n\n") + 2] if "\n\n" in text else ""
        msgs = fuzzmcp.sse_messages(whole)
        if isinstance(msgs, str) or any(fuzzmcp.rpc_problem(m, notification_ok=True) for m in msgs):
            self.findings.append(f"a GET stream carried {text[:200]!r}")

    async def finish(self, sse: SseSession) -> None:
        """Every kept session still answers; main0's stream still runs; deleted ones stay gone."""
        for name, k in self.known.items():
            if k.role in ("main", "bob"):
                r = await self.client.post("/mcp", json={"jsonrpc": "2.0", "id": "last", "method": "ping"},
                                           headers={**self.base(k.owner), "Mcp-Session-Id": k.id})
                if r.status_code != 200 or r.json() != {"jsonrpc": "2.0", "id": "last", "result": {}}:
                    self.findings.append(f"{name} no longer answers: {r.status_code} {r.text[:200]}")
        before = self.sentinel_pings
        for _ in range(100):
            if self.sentinel_pings > before or self.sentinel is None or self.sentinel.done():
                break
            await asyncio.sleep(0.05)
        if self.sentinel is None or self.sentinel.done() or self.sentinel_pings == before:
            self.findings.append("main0's GET stream stopped carrying keep-alives")
        for name in self.deleted_names:
            k = self.known[name]
            for method in ("POST", "GET", "DELETE"):
                r = await self.client.request(method, "/mcp", headers={**self.base(k.owner), "Mcp-Session-Id": k.id},
                                              content=b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
                if r.status_code != 404:
                    self.findings.append(f"deleted {name} answered {method} with {r.status_code}")
        assert await sse.request("ping") == {"jsonrpc": "2.0", "id": sse._next_id, "result": {}}
        if self.sentinel is not None:
            self.sentinel.cancel()
            await asyncio.gather(self.sentinel, return_exceptions=True)
        await sse.close()

    async def run(self, count: int) -> None:
        sse = await self.setup()
        gate = asyncio.Semaphore(MCP_CONCURRENCY)
        pending: set[asyncio.Task[None]] = set()
        for _ in range(count):
            if len(self.findings) >= 50:  # (enough to read: stop early)
                break
            while len(pending) >= 2 * MCP_CONCURRENCY:  # (generate as they are answered: state stays current)
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # (a harness error ends the run)
            pending.add(asyncio.ensure_future(self.one(gate)))
        await asyncio.gather(*pending)
        await self.finish(sse)


@pytest.fixture
def mcp_fuzz_daemon(tmp_path: Path) -> Any:
    (tmp_path / "files").mkdir()
    paths = files(tmp_path / "files")
    slow = tmp_path / "files" / "sparse.log"
    with open(slow, "wb") as f:  # line 3 is past a 64 MiB hole: a read that takes a moment
        f.write(b"a\n")
        f.truncate(64 * 1024 * 1024)
    d = start_daemon(tmp_path / "d", keepalive_seconds=1.0, allowed_origins=[fuzzmcp.OK_ORIGIN])
    yield d, paths, str(slow)
    stop_daemon(d)


def test_fuzzed_mcp_in_both_eras_gets_the_documented_answers(mcp_fuzz_daemon: Any) -> None:
    """Seeded /mcp inputs of both Streamable HTTP eras against the real daemon over TLS
    (``tests/support/fuzzmcp.py`` makes them and predicts each answer from the documented rules).

    Session era: ``initialize`` (new sessions), POSTs of hostile bodies, GET streams (held a
    moment, then abandoned), HEAD, DELETE racing requests in flight, other methods; with
    ``Mcp-Session-Id`` naming live, other principals', deleted, ``/sse``, unknown and malformed
    sessions, or repeated; ``MCP-Protocol-Version`` good, bad and repeated; ``Accept`` with
    weights, wildcards, several copies and malformed; tokens of both principals, bad and none;
    ``Origin``. Stateless era: 2026-07-28 requests (``server/discover`` and the rest) with
    ``_meta``, ids and the ``MCP-Protocol-Version``/``Mcp-Method``/``Mcp-Name`` headers mutated,
    batches, stale session ids.

    Asserted for every input: never a 5xx; the status the rules give; every JSON body valid
    JSON-RPC, a refusal carrying the request's id whenever it could be read, a reply carrying the
    ids of the requests answered; no internal error; an event stream of progress then the reply.
    At the end: the kept sessions (and bob's, and the /sse one) still answer, the GET stream held
    the whole run still carries keep-alives, every deleted session is ``404`` on every method, the
    daemon lives and logged no traceback.

    A CI slice by default (``MCP_INPUTS``); a longer run is one command, the count and the seed
    from the environment: ``MCPD_FUZZ_MCP_INPUTS=100000 MCPD_FUZZ_SEED=7 .venv/bin/python -m pytest
    -s tests/integration/test_fuzz_transport.py -k mcp_in_both_eras`` (``-s`` prints the totals).
    """
    d, paths, slow = mcp_fuzz_daemon

    async def go() -> McpFuzz:
        # (idle connections are dropped well before the daemon's connections.idle_seconds, 15 s, closes
        # them: a request sent on one it is closing would fail through no fault of either side)
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=32, keepalive_expiry=2.0)
        async with httpx.AsyncClient(verify=d.ssl_context(), timeout=30, limits=limits, base_url=d.url) as client:
            del client.headers["accept"]  # (httpx's default */*: an input without Accept sends none)
            fuzz = McpFuzz(d, client, fuzzmcp.McpGenerator(MCP_SEED, paths, 14), slow)
            await asyncio.wait_for(fuzz.run(MCP_INPUTS), 60 + MCP_INPUTS * MCP_SECONDS_PER_INPUT)
            return fuzz

    started = time.monotonic()
    fuzz = asyncio.run(go())
    took = time.monotonic() - started
    print(f"\nmcp fuzz: seed {MCP_SEED}, {MCP_INPUTS} inputs in {took:.0f} s")
    fuzz.stats.pop("all", None)
    for era, stats in sorted(fuzz.stats.items()):
        print(f"  {era}: {stats['inputs']} inputs, {stats['findings']} findings")
        for key, n in sorted(stats.items()):
            if key not in ("inputs", "findings"):
                print(f"    {key}: {n}")
    assert not fuzz.findings, f"{len(fuzz.findings)} findings; the first:\n" + "\n".join(fuzz.findings[:5])
    assert d.proc.poll() is None, "the daemon died"
    assert "Traceback" not in d.log(), d.log()[-3000:]
