"""Seeded ``/mcp`` inputs for both Streamable HTTP eras, and the answer the documented rules give
each one (the reference model the transport fuzz test holds every response against).

An input is one HTTP request: method, headers (repeated ones included), body. The generator
knows what it built (which session a ``Mcp-Session-Id`` names, what its ``Accept`` header
accepts); :func:`predict` reads the request as the rules in docs/SPEC-NOTES.md do, in their order,
and names the outcomes allowed (:class:`Outcome`); :func:`check` holds a response against them.
The rules are restated here from the documentation, not imported from the product: a product
bug is a disagreement.

The session era's bodies come from :class:`tests.support.fuzzgen.Generator` (hostile JSON-RPC); the
stateless era's are 2026-07-28 requests whose ``_meta``, ids and the ``MCP-Protocol-Version``,
``Mcp-Method`` and ``Mcp-Name`` headers are mutated.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import random
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from tests.support.fuzzgen import BAD_IDS, Generator, Raw, answered, dump, strict, valid_id

SESSION_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN = "2026-07-28"
META_V = "io.modelcontextprotocol/protocolVersion"
META_C = "io.modelcontextprotocol/clientCapabilities"
MODERN_METHODS = {"server/discover", "tools/list", "tools/call", "resources/list", "resources/templates/list",
                  "resources/read", "tasks/get", "tasks/update", "tasks/cancel"}
NAME_FIELDS = {"tools/call": "name", "resources/read": "uri", "prompts/get": "name",
               "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}
JSON_TYPE, SSE_TYPE = "application/json", "text/event-stream"
SID_RE = re.compile(r"[0-9a-f]{32}")
OK_ORIGIN = "https://ok.example"
INVALID_REQUEST, PARSE_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND = -32600, -32700, -32602, -32601
HEADER_MISMATCH, UNSUPPORTED_VERSION = -32020, -32022


# -- Accept ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AcceptHeader:
    """A generated ``Accept``: its copies (``None``: no header) and what they mean."""

    values: tuple[str, ...] | None
    json: bool
    sse: bool
    malformed: bool


RANGES = ["*/*", "application/*", "text/*", JSON_TYPE, SSE_TYPE, "text/html", "image/png", "application/jsonx"]
QVALUES = [None] * 5 + ["0", "0.", "0.0", "0.000", "0.001", "0.5", "0.25", "0.999", "1", "1.", "1.0", "1.000"]
EXTRA_PARAMS = ["charset=utf-8", 'a="x,y;q=0"', 'b="\\"q=0\\""', "level=1", "q0=1"]
BAD_ELEMENTS = ["json", "*", "*/json", "/json", "application/json;q=2", "application/json;q=.5",
                "text/event-stream;q=0.5000", 'application/json;q="1"', "application/json;q=1;q=1",
                "text/event-stream;q = 1", "text/plain;charset", "application/json x", "application/json;q=-0",
                "application/json;q=1e-3", 'text/*;a="open', "application/json;q=", "text/event-stream;=1"]
STANDARD_ACCEPT = AcceptHeader(("application/json, text/event-stream",), True, True, False)


def _thousandths(q: str) -> int:
    whole, _, frac = q.partition(".")
    return int(whole) * 1000 + int((frac + "000")[:3])


def _weight(ranges: list[tuple[str, int]], offered: str) -> int:
    """RFC 9110 §12.5.1 as the notes state it: the most specific matching range, its highest weight."""
    levels = {"*/*": 0, offered.split("/")[0] + "/*": 1, offered: 2}
    matching = [(levels[r], q) for r, q in ranges if r in levels]
    if not matching:
        return 0
    top = max(level for level, _ in matching)
    return max(q for level, q in matching if level == top)


def gen_accept(rng: random.Random) -> AcceptHeader:
    """Mostly what clients send; else up to four ranges with weights, parameters, odd spacing and
    case, empty elements, several copies, and now and then an element that breaks the grammar."""
    r = rng.random()
    if r < 0.7:
        return STANDARD_ACCEPT
    if r < 0.74:
        return AcceptHeader(None, True, True, False)
    parts: list[str] = []
    ranges: list[tuple[str, int]] = []
    for _ in range(rng.randrange(0, 5)):
        media, q = rng.choice(RANGES), rng.choice(QVALUES)
        params = [rng.choice(EXTRA_PARAMS)] if rng.random() < 0.15 else []
        if q is not None:
            params.insert(rng.randrange(len(params) + 1), rng.choice("qQ") + "=" + q)
        sep = rng.choice([";", " ;", "; ", ";\t"])
        parts.append((media if rng.random() < 0.8 else media.upper()) + "".join(sep + p for p in params))
        ranges.append((media, 1000 if q is None else _thousandths(q)))
    malformed = rng.random() < 0.15
    if malformed:
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(BAD_ELEMENTS))
    if rng.random() < 0.1:
        parts.insert(rng.randrange(len(parts) + 1), "")
    joiner = rng.choice([", ", ",", " , ", ",\t"])
    if len(parts) > 1 and rng.random() < 0.15:
        cut = rng.randrange(1, len(parts))
        values: tuple[str, ...] = (joiner.join(parts[:cut]), joiner.join(parts[cut:]))
    else:
        values = (joiner.join(parts),)
    values = tuple(v.strip(" \t") for v in values)  # (a value's own edge whitespace: no client sends it)
    return AcceptHeader(values, _weight(ranges, JSON_TYPE) > 0, _weight(ranges, SSE_TYPE) > 0, malformed)


# -- requests -------------------------------------------------------------------------------------

@dataclasses.dataclass
class Req:
    """One generated input. ``target``: the harness's name for the session the ``Mcp-Session-Id``
    names (``None``: none, or an id no session has); ``era``: what it was generated as."""

    method: str
    headers: list[tuple[str, str | bytes]]
    body: bytes | None
    accept: AcceptHeader
    token: str  # alice | bob | bad | none
    target: str | None
    era: str  # session | stateless
    label: str = ""

    def header(self, name: str) -> list[str]:
        """Every copy of header ``name``, decoded as the server decodes them (Latin-1)."""
        name = name.lower()
        return [v.decode("latin-1") if isinstance(v, bytes) else v for k, v in self.headers if k.lower() == name]


@dataclasses.dataclass
class Known:
    """A session id the harness knows: its owner, its role (``main``: kept for the whole run;
    ``victim``: may be deleted; ``bob``: the other principal's; ``sse``: an ``/sse`` session;
    ``dead``: deleted before the run), and the sequence numbers of its DELETE (sent, answered)."""

    id: str
    owner: str
    role: str
    delete_sent: int | None = None
    deleted: int | None = None
    streams_open: int = 0  # GET streams of it the harness holds open now
    gets: int = 0  # GETs sent to it so far
    version: str | None = None  # the protocol version it negotiated, when the harness knows it


class McpGenerator:
    """Seeded ``/mcp`` inputs.

    Args:
        seed: the seed (the same seed, the same inputs given the same answers).
        files: paths the daemon may read (see ``test_fuzz_transport.files``).
        slot: the id slot of the body generator (ids stay unique across generators).
    """

    def __init__(self, seed: int, files: list[str], slot: int) -> None:
        self.rng = random.Random(seed)
        self.bodies = Generator(seed * 7919 + 1, files, slot)
        self.files = files

    # (the harness passes the session names it holds; the generator picks among them)
    def pick_token(self) -> str:
        r = self.rng.random()
        return "alice" if r < 0.9 else "bob" if r < 0.95 else "bad" if r < 0.975 else "none"

    def session_header(self, names: dict[str, list[str]], ids: dict[str, str]) -> tuple[list[tuple[str, str]], str | None]:
        """``Mcp-Session-Id`` copies and the session they name: ``names`` maps a role to the
        harness's names for it, ``ids`` a name to its id."""
        r = self.rng
        roles = [("main", 50), ("victim", 20), ("bob", 5), ("dead", 5), ("sse", 2), ("unknown", 4), ("bad", 5),
                 ("none", 6), ("twice", 3)]
        role = r.choices([k for k, _ in roles], [w for _, w in roles])[0]
        if role in names and names[role]:
            name = r.choice(names[role])
            return [("Mcp-Session-Id", ids[name])], name
        if role == "unknown":
            return [("Mcp-Session-Id", "%032x" % r.getrandbits(128))], None
        if role in ("bad", "twice") and not names.get("main"):
            role = "unknown"  # (only when a product bug ended every kept session)
        if role == "bad":
            some = ids[r.choice(names["main"])]
            return [("Mcp-Session-Id", r.choice([some.upper(), some[:-1], some + "0", "", "x " + some, "g" * 32,
                                                 some[:16] + "-" + some[16:], "0x" + some[2:]]))], None
        if role == "twice":
            name = r.choice(names["main"])
            return [("Mcp-Session-Id", ids[name]), ("Mcp-Session-Id", ids[name])], name
        return [], None

    def version_header(self, negotiated: str = "2025-06-18") -> list[tuple[str, str]]:
        r = self.rng.random()
        if r < 0.45:
            return []
        if r < 0.88:
            return [("MCP-Protocol-Version", self.rng.choice([negotiated, *SESSION_VERSIONS]))]
        if r < 0.97:
            return [("MCP-Protocol-Version", self.rng.choice(["garbage", "2025-06-18, 2024-11-05", "", MODERN,
                                                              "1999-01-01", "2025-06-18x", "2025-06-18 x"]))]
        return [("MCP-Protocol-Version", negotiated), ("MCP-Protocol-Version", self.rng.choice(SESSION_VERSIONS))]

    def common(self, accept: AcceptHeader, token: str) -> list[tuple[str, str | bytes]]:
        h: list[tuple[str, str | bytes]] = []
        for value in accept.values or ():
            h.append(("Accept", value))
        if self.rng.random() < 0.02:
            h.append(("Origin", self.rng.choice([OK_ORIGIN, "https://evil.example", "null"])))
        return h

    def session_era(self, names: dict[str, list[str]], ids: dict[str, str]) -> Req:
        """A session-era input: mostly a POST of a hostile body; GET, HEAD, DELETE, and methods
        the route does not serve."""
        r = self.rng
        method = r.choices(["POST", "GET", "DELETE", "HEAD", "PUT", "OPTIONS", "PATCH"], [72, 12, 9, 3, 2, 1, 1])[0]
        token, accept = self.pick_token(), gen_accept(r)
        h = self.common(accept, token)
        sid, target = self.session_header(names, ids)
        body: bytes | None = None
        label = method
        if method == "POST":
            kind = r.random()
            if kind < 0.75:
                body, ctype = self.bodies.body()
            elif kind < 0.92:
                body, ctype = dump(self.plain_request()).encode(), "application/json"
            else:  # a new session (initialize without Mcp-Session-Id)
                body, ctype = dump(self.initialize()).encode(), "application/json"
                sid, target = ([], None) if r.random() < 0.85 else (sid, target)
            if ctype != "application/json" or r.random() < 0.03:
                h.append(("Content-Type", ctype))
            else:
                h.append(("Content-Type", r.choice([JSON_TYPE] * 8 + ["application/json; charset=utf-8",
                                                                      "Application/JSON"])))
        h += sid + self.version_header()
        return Req(method, h, body, accept, token, target, "session", label)

    def plain_request(self) -> dict[str, Any]:
        """A well-formed session-era request (so many inputs get a real answer)."""
        r = self.rng
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": self.bodies.new_id()}
        choice = r.randrange(5)
        if choice == 0:
            msg.update(method="ping")
        elif choice == 1:
            msg.update(method="tools/list")
        elif choice == 2:
            msg.update(method="ping", params={"_meta": {"progressToken": r.choice(["p", 7])}})
        elif choice == 3:
            msg.update(method="tools/call", params={"name": "files/read", "arguments": {"path": r.choice(self.files)}})
        else:
            msg.update(method="tools/call", params={"name": "files/find", "arguments": {
                "root": self.files[-1], "name": "*"}, "_meta": {"progressToken": "f"}})
        return msg

    def initialize(self) -> dict[str, Any]:
        r = self.rng
        params: Any = {"protocolVersion": r.choice([*SESSION_VERSIONS, "1999-01-01"]), "capabilities": {},
                       "clientInfo": {"name": "fuzz", "version": "0"}}
        if r.random() < 0.1:
            params = r.choice([None, {}, {"protocolVersion": 7}, []])
        msg = {"jsonrpc": "2.0", "id": self.bodies.new_id() if r.random() < 0.95 else r.choice(BAD_IDS),
               "method": "initialize", "params": params}
        return msg

    # -- the stateless era ---------------------------------------------------------------------

    def modern_body(self) -> Any:
        r = self.rng
        method: Any = r.choice(["server/discover"] * 3 + ["tools/list"] * 2 + ["tools/call"] * 5
                               + ["resources/read"] * 3 + ["resources/list", "resources/templates/list", "prompts/get",
                                                           "ping", "initialize", "nope", "subscriptions/listen"])
        params: Any = {}
        if method == "tools/call":
            params = {"name": r.choice(["files/read"] * 5 + ["files_read", "files/list", "files/filetype", "files/find",
                                                             "no/such", "é", 7]),
                      "arguments": self.bodies.arguments()}
        elif method == "resources/read":
            params = {"uri": r.choice(["file://" + self.files[0], "file:///no/such", "nope:", "file:é.txt",
                                       "file://" + self.files[1], 5])}
        elif method == "prompts/get":
            params = {"name": "x"}
        meta: Any = {META_V: MODERN, META_C: {}, "io.modelcontextprotocol/clientInfo": {"name": "f", "version": "0"}}
        m = r.random()
        if m < 0.03:
            del meta[META_V]
        elif m < 0.06:
            del meta[META_C]
        elif m < 0.09:
            meta[META_V] = r.choice(["2025-11-25", "2099-01-01", 7, None, ""])
        elif m < 0.11:
            meta[META_C] = r.choice([[], "x", None])
        if r.random() < 0.15:
            meta["progressToken"] = r.choice(["t", 3, None, Raw("1e400")])
        params["_meta"] = meta
        if r.random() < 0.03:
            params = r.choice([[], "x", None, {"_meta": "x"}])
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        k = r.random()
        if k < 0.88:
            msg["id"] = self.bodies.new_id()
        elif k < 0.93:
            msg["id"] = r.choice(BAD_IDS)
        elif k < 0.95:
            msg["id"] = r.choice([0, 2.5, -1, ""])  # unusual but valid (ids may repeat: no session holds them)
        if r.random() < 0.03:
            msg["jsonrpc"] = r.choice(["1.0", None, 2])
        if r.random() < 0.03:
            msg["method"] = r.choice([None, 5, [], {}])
        if r.random() < 0.02:
            msg["id"] = msg.get("id", 1)
            msg = dict(reversed(list(msg.items())))  # another key order
        return msg

    def stateless(self, names: dict[str, list[str]], ids: dict[str, str]) -> Req:
        """A 2026-07-28 input: a request whose headers mirror it, mutated now and then."""
        r = self.rng
        token, accept = self.pick_token(), gen_accept(r)
        h = self.common(accept, token)
        k = r.random()
        if k < 0.03:
            payload: Any = [self.modern_body() for _ in range(r.randrange(0, 3))]
            first = payload[0] if payload else {"method": "tools/list", "params": {"_meta": {META_V: MODERN}}}
        elif k < 0.05:
            body, _ = self.bodies.body()
            payload, first = None, {}
        else:
            payload = first = self.modern_body()
        body = dump(payload).encode("utf-8", "surrogatepass") if payload is not None else body
        h.append(("Content-Type", JSON_TYPE))
        params = first.get("params") if isinstance(first, dict) else None
        meta = params.get("_meta") if isinstance(params, dict) else None
        version = meta.get(META_V) if isinstance(meta, dict) else None
        h += self._mirror("MCP-Protocol-Version", version if isinstance(version, str) else MODERN,
                          ["2025-11-25", "garbage", "", "2099-01-01"])
        method = first.get("method") if isinstance(first, dict) else None
        h += self._mirror("Mcp-Method", method if isinstance(method, str) else "tools/list",
                          ["tools/list", "TOOLS/LIST", "", "=?base64?dG9vbHMvbGlzdA==?="])
        field = NAME_FIELDS.get(method) if isinstance(method, str) else None
        if field is not None:
            value = params.get(field) if isinstance(params, dict) else None
            h += self._name(value)
        target = None
        if r.random() < 0.1:  # a stale session id: ignored when the body names its version
            sid, target = self.session_header(names, ids)
            h += sid
        return Req("POST", h, body, accept, token, target, "stateless", "POST stateless")

    def _mirror(self, name: str, value: str, wrong: list[str]) -> list[tuple[str, str | bytes]]:
        r = self.rng.random()
        if r < 0.93:
            return [(name, value)]
        if r < 0.95:
            return []
        if r < 0.97:
            return [(name, self.rng.choice(wrong))]
        if r < 0.985:
            return [(name, value), (name, value)]
        return [(name, value.encode("latin-1", "replace") + b"\xe9")]

    def _name(self, value: Any) -> list[tuple[str, str | bytes]]:
        r = self.rng
        text = value if isinstance(value, str) else json.dumps(value)
        plain_ok = text.isascii() and text == text.strip()
        k = r.random()
        if k < 0.85:
            if plain_ok and r.random() < 0.6:
                return [("Mcp-Name", text)]
            return [("Mcp-Name", "=?base64?" + base64.b64encode(text.encode("utf-8", "surrogatepass")).decode() + "?=")]
        if k < 0.88:
            return []
        if k < 0.91:
            return [("Mcp-Name", r.choice(["files/list", "=?base64?!!?=", "=?base64??=", "=?base64?/w==?=",
                                           "=?base64?" + base64.b64encode(b"files/list").decode() + "?="]))]
        if k < 0.94:
            return [("Mcp-Name", text.encode("utf-8", "surrogatepass"))]  # not ASCII: invalid as it is
        return [("Mcp-Name", text), ("Mcp-Name", text)] if plain_ok else []


# -- the model ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Outcome:
    """One allowed answer.

    ``kind``: ``plain`` (a text refusal of ``status``), ``refusal`` (``status`` with one JSON-RPC
    error, code in ``codes``, id ``rid``), ``reply`` (the body ran: ``replies`` is
    ``(shape, ids, nulls)``, answered as an event stream with progress when ``progress``, else as
    JSON when ``json_ok``, else as one event), ``empty`` (``202``), ``stream`` (a GET's stream, or a
    HEAD's headers), ``deleted`` (``200``). ``cut``: an event stream may end without the reply
    (its session was deleted meanwhile). ``opens``: an ``initialize`` that opens a session when
    it succeeds.
    """

    kind: str
    status: int = 200
    codes: frozenset[int] | None = None
    rid: Any = None
    replies: tuple[str, tuple[Any, ...], int] | None = None
    progress: bool = False
    json_ok: bool = True
    stateless: bool = False
    cut: bool = False
    opens: bool = False


def _refusal(status: int, code: int | frozenset[int] | None, rid: Any = None) -> Outcome:
    codes = frozenset({code}) if isinstance(code, int) else code
    return Outcome("refusal", status, codes, rid)


def _parse(body: bytes) -> tuple[Any, int | None]:
    """The body as the transport reads it, or the JSON-RPC code of its ``400``."""
    try:
        payload = json.loads(body, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    except (ValueError, RecursionError):
        return None, PARSE_ERROR
    if _depth(payload) > 64:
        return None, PARSE_ERROR
    if not isinstance(payload, (dict, list)):
        return None, INVALID_REQUEST
    return payload, None


def _depth(value: Any) -> int:
    stack, deepest = [(value, 1)], 0
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def request_id(payload: Any) -> Any:
    """The id a refusal of ``payload`` carries: a single request's valid id, else null (a client
    response's id, with no ``method`` and a ``result`` or ``error``, names no request)."""
    if not isinstance(payload, dict) or not valid_id(payload.get("id")):
        return None
    if "method" not in payload and ("result" in payload or "error" in payload):
        return None
    return payload["id"]


def _progress(msg: Any) -> bool:
    params = msg.get("params") if isinstance(msg, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and meta.get("progressToken") is not None


def _replies(payload: Any) -> tuple[str, tuple[Any, ...], int] | None:
    """``(shape, valid ids, nulls)`` of the replies a session-era body gets, ``None``: none."""
    members = payload if isinstance(payload, list) else [payload]
    if isinstance(payload, list) and not payload:
        return "one", (), 1  # an empty batch: one error without an id
    got = [m for m in members if answered(m)]
    if not got:
        return None
    ids = tuple(m["id"] for m in got if isinstance(m, dict) and "id" in m and valid_id(m["id"]))
    return ("batch" if isinstance(payload, list) else "one"), ids, len(got) - len(ids)


SessionState = Callable[[str | None, str], str]  # (target, principal) → live | racing | absent


def _session_checks(req: Req, rid: Any, state: SessionState, principal: str) -> list[Outcome] | str:
    """The session era's header checks, in the notes' order: ``MCP-Protocol-Version`` (one copy,
    a supported value), then ``Mcp-Session-Id`` (one copy, 32 lowercase hex, a session of the
    caller on ``/mcp``). Returns the refusal, or the session's state (``live``, ``racing``)."""
    versions = req.header("MCP-Protocol-Version")
    if len(versions) > 1 or (versions and versions[0] not in SESSION_VERSIONS):
        return [_refusal(400, INVALID_REQUEST, rid)]
    sids = req.header("Mcp-Session-Id")
    if len(sids) != 1 or not SID_RE.fullmatch(sids[0]):
        return [_refusal(400, INVALID_REQUEST, rid)]
    found = state(req.target, principal)
    if found == "absent":
        return [_refusal(404, INVALID_REQUEST, rid)]
    return found


def _header_value(raw: str, decode: bool) -> str | None:
    """A mirrored header's value, ``None`` when malformed (characters outside visible ASCII,
    space and tab; for ``Mcp-Name`` a bad ``=?base64?…?=``)."""
    if any(not (0x20 <= ord(c) <= 0x7E or c == "\t") for c in raw):
        return None
    if decode and raw.startswith("=?base64?") and raw.endswith("?=") and len(raw) >= 11:
        try:
            return base64.b64decode(raw[9:-2], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
    return raw


def _stateless(req: Req, payload: Any) -> list[Outcome]:
    """The stateless era's rules: envelope (one object, ``jsonrpc`` ``"2.0"``, a string method), then ``_meta``, the version header, the version, the
    method header, the name header, the method; then it runs."""
    rid = request_id(payload)
    if not isinstance(payload, dict) or not isinstance(payload.get("method"), str) or payload.get("jsonrpc") != "2.0":
        return [_refusal(400, INVALID_REQUEST, rid)]
    if "id" not in payload:
        return [Outcome("empty", 202)]
    params = payload.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get(META_V), str) or not isinstance(meta.get(META_C), dict):
        return [_refusal(400, INVALID_PARAMS, rid)]
    versions = req.header("MCP-Protocol-Version")
    if len(versions) != 1 or versions[0] != meta[META_V]:
        return [_refusal(400, HEADER_MISMATCH, rid)]
    if meta[META_V] != MODERN:
        return [_refusal(400, UNSUPPORTED_VERSION, rid)]
    methods = req.header("Mcp-Method")
    if len(methods) != 1 or _header_value(methods[0], False) != payload["method"]:
        return [_refusal(400, HEADER_MISMATCH, rid)]
    field = NAME_FIELDS.get(payload["method"])
    if field is not None:
        names = req.header("Mcp-Name")
        if len(names) != 1 or _header_value(names[0], True) != params.get(field):  # type: ignore[union-attr]
            return [_refusal(400, HEADER_MISMATCH, rid)]
    if payload["method"] not in MODERN_METHODS:
        return [_refusal(404, METHOD_NOT_FOUND, rid)]
    progress = req.accept.sse and _progress(payload)
    return [Outcome("reply", replies=("one", (rid,) if rid is not None else (), 0 if rid is not None else 1),
                    progress=progress, json_ok=req.accept.json, stateless=True)]


def predict(req: Req, state: SessionState,
            batches: Callable[[str | None], bool | None] = lambda target: None) -> tuple[str, list[Outcome]]:
    """The route the request takes (``stateless``, ``session``, or where it was refused first) and
    the outcomes the documented rules allow. ``state`` tells a session's state when asked;
    ``batches`` whether the target session takes batches (it negotiated a version before
    2025-06-18), ``None`` when the harness does not know (then either answer is allowed)."""
    origins = req.header("Origin")
    if origins and any(o != OK_ORIGIN for o in origins):
        return "origin", [Outcome("plain", 403)]
    if req.token in ("bad", "none"):
        return "auth", [Outcome("plain", 401)]
    principal = req.token
    if req.method not in ("GET", "HEAD", "POST", "DELETE"):
        return "method", [Outcome("plain", 405)]
    if req.method in ("GET", "HEAD", "POST") and req.accept.malformed:
        return "accept", [_refusal(400, INVALID_REQUEST)]
    if req.method in ("GET", "HEAD"):
        if not req.accept.sse:
            return "accept", [_refusal(406, INVALID_REQUEST)]
        found = _session_checks(req, None, state, principal)
        if isinstance(found, list):
            return "session", found
        allowed = [Outcome("stream"), _refusal(409, INVALID_REQUEST)]
        return "session", allowed + ([_refusal(404, INVALID_REQUEST)] if found == "racing" else [])
    if req.method == "DELETE":
        found = _session_checks(req, None, state, principal)
        if isinstance(found, list):
            return "session", found
        return "session", [Outcome("deleted")] + ([_refusal(404, INVALID_REQUEST)] if found == "racing" else [])
    if not (req.accept.json or req.accept.sse):
        return "accept", [_refusal(406, INVALID_REQUEST)]
    ctypes = req.header("Content-Type")
    if not ctypes or ctypes[0].split(";", 1)[0].strip().lower() != JSON_TYPE:
        return "content-type", [_refusal(415, INVALID_REQUEST)]
    assert req.body is not None
    payload, code = _parse(req.body)
    if code is not None:
        return "body", [_refusal(400, code)]
    sids, versions = req.header("Mcp-Session-Id"), req.header("MCP-Protocol-Version")
    is_init = isinstance(payload, dict) and payload.get("method") == "initialize"
    params = payload.get("params") if isinstance(payload, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    named = meta.get(META_V) if isinstance(meta, dict) else None
    if named is not None or (not sids and not is_init and versions and versions[0] not in SESSION_VERSIONS):
        return "stateless", _stateless(req, payload)
    rid = request_id(payload)
    if not sids and is_init:
        if len(versions) > 1 or (versions and versions[0] not in SESSION_VERSIONS):
            return "session", [_refusal(400, INVALID_REQUEST, rid)]
        replies = _replies(payload)
        assert replies is not None
        return "session", [Outcome("reply", replies=replies, json_ok=req.accept.json, opens=True)]
    found = _session_checks(req, rid, state, principal)
    if isinstance(found, list):
        return "session", found
    racing = found == "racing"
    gone = [_refusal(404, INVALID_REQUEST, rid)] if racing else []
    members = payload if isinstance(payload, list) else [payload]
    progress = req.accept.sse and any(isinstance(m, dict) and "method" in m and "id" in m and _progress(m)
                                      for m in members)
    refused: list[Outcome] = []
    if isinstance(payload, list) and payload and batches(req.target) is not True:
        # a session of 2025-06-18 or later: the batch is refused whole, one -32600 without an id
        refused = [Outcome("reply", replies=("one", (), 1), progress=progress, json_ok=req.accept.json, cut=racing)]
        if batches(req.target) is False:
            return "session", refused + gone
    replies = _replies(payload)
    if progress:
        return "session", [Outcome("reply", replies=replies, progress=True, cut=racing)] + refused + gone
    if replies is None:
        return "session", [Outcome("empty", 202)] + refused + gone
    return "session", [Outcome("reply", replies=replies, json_ok=req.accept.json)] + refused + gone


# -- checking a response --------------------------------------------------------------------------

def rpc_problem(msg: Any, notification_ok: bool = False) -> str | None:
    """What makes ``msg`` not a JSON-RPC 2.0 response (or, when allowed, a notification)."""
    if not isinstance(msg, dict):
        return "not an object"
    if msg.get("jsonrpc") != "2.0":
        return "jsonrpc is not 2.0"
    if "method" in msg:
        if notification_ok and isinstance(msg["method"], str) and "id" not in msg:
            return None
        return "a request or notification where a response belongs"
    if "id" not in msg:
        return "no id"
    rid = msg["id"]
    if not (rid is None or (isinstance(rid, (str, int, float)) and not isinstance(rid, bool))):
        return "an id of the wrong type"
    if ("result" in msg) == ("error" in msg):
        return "not exactly one of result and error"
    if set(msg) - {"jsonrpc", "id", "result", "error"}:
        return "extra members"
    if "error" in msg:
        err = msg["error"]
        if not isinstance(err, dict) or type(err.get("code")) is not int or not isinstance(err.get("message"), str) \
                or set(err) - {"code", "message", "data"}:
            return "a malformed error object"
    return None


def _key(value: Any) -> str:
    return json.dumps(value)


def _replies_match(reply: Any, want: tuple[str, tuple[Any, ...], int], stateless: bool) -> str | None:
    shape, ids, nulls = want
    members = reply if isinstance(reply, list) else [reply]
    if (shape == "batch") != isinstance(reply, list):
        return f"a {shape} answered by {type(reply).__name__}"
    for m in members:
        problem = rpc_problem(m)
        if problem:
            return f"reply member: {problem}"
    got = Counter(_key(m["id"]) for m in members if m["id"] is not None)
    got_nulls = sum(1 for m in members if m["id"] is None)
    if got != Counter(_key(i) for i in ids) or got_nulls != nulls:
        return f"ids {dict(got)} + {got_nulls} null, expected {list(ids)} + {nulls} null"
    for m in members:
        err = m.get("error")
        if isinstance(err, dict) and err.get("code") == -32603:
            return "an internal error"
        result = m.get("result")
        if isinstance(result, dict):
            sc = result.get("structuredContent")
            if isinstance(sc, dict) and isinstance(sc.get("error"), dict) and sc["error"].get("code") == "INTERNAL_ERROR":
                return "a tool's INTERNAL_ERROR"
            if stateless and result.get("resultType") != "complete":
                return "a stateless result without resultType complete"
    return None


def sse_messages(text: str) -> list[Any] | str:
    """The JSON of an event stream's ``message`` events, or what is wrong with the stream."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = [x for x in block.split("\n") if x]
        if not lines or all(x.startswith(":") for x in lines):
            continue
        data = [x[len("data: "):] for x in lines if x.startswith("data: ")]
        if [x for x in lines if not x.startswith(("data: ", ":"))] != ["event: message"] or not data:
            return f"an event that is not a message: {block[:120]!r}"
        try:
            out.append(strict("\n".join(data)))
        except (ValueError, AssertionError, UnicodeEncodeError) as exc:
            return f"event data not strict JSON: {exc}"
    return out


def _match(o: Outcome, status: int, ctype: str, body: bytes, headers: Any, method: str) -> str | None:
    """Why the response is not outcome ``o`` (``None``: it is)."""
    if method == "HEAD":  # (headers only)
        return None if status == (200 if o.kind == "stream" else o.status) else f"status {status}, expected {o.status}"
    if o.kind == "plain":
        return None if status == o.status else f"status {status}, expected {o.status}"
    if o.kind == "empty":
        return None if status == 202 and body == b"" else f"status {status} {body[:80]!r}, expected an empty 202"
    if o.kind == "deleted":
        return None if status == 200 else f"status {status}, expected 200"
    if o.kind == "stream":
        if status != 200 or not ctype.startswith(SSE_TYPE):
            return f"status {status} {ctype}, expected a stream"
        return None
    if o.kind == "refusal":
        if status != o.status:
            return f"status {status}, expected {o.status}"
        if not ctype.startswith(JSON_TYPE):
            return f"a refusal as {ctype}"
        try:
            msg = strict(body.decode("utf-8"))
        except (ValueError, AssertionError, UnicodeDecodeError) as exc:
            return f"not strict JSON: {exc}"
        problem = rpc_problem(msg)
        if problem or "error" not in msg:
            return f"refusal body: {problem or 'not an error'}"
        if o.codes is not None and msg["error"]["code"] not in o.codes:
            return f"code {msg['error']['code']}, expected {sorted(o.codes)}"
        if _key(msg["id"]) != _key(o.rid):
            return f"id {msg['id']!r}, expected {o.rid!r}"
        return None
    # a reply
    assert o.replies is not None
    if o.progress or not o.json_ok:
        if status != 200 or not ctype.startswith(SSE_TYPE):
            return f"status {status} {ctype}, expected an event stream"
        msgs = sse_messages(body.decode("utf-8"))
        if isinstance(msgs, str):
            return msgs
        for m in msgs[:-1] if msgs else []:
            if rpc_problem(m, notification_ok=True) or m.get("method") != "notifications/progress":
                return f"before the reply: {json.dumps(m)[:120]}"
        if not msgs or (isinstance(msgs[-1], dict) and "method" in msgs[-1]):
            return None if o.cut else "the stream ended without the reply"
        if not o.progress and len(msgs) != 1:
            return f"{len(msgs)} events, expected the reply alone"
        return _replies_match(msgs[-1], o.replies, o.stateless)
    want_status = 400 if o.replies[0] == "one" and o.replies[2] == 1 else 200
    if status != want_status or not ctype.startswith(JSON_TYPE):
        return f"status {status} {ctype}, expected {want_status} JSON"
    try:
        reply = strict(body.decode("utf-8"))
    except (ValueError, AssertionError, UnicodeDecodeError) as exc:
        return f"not strict JSON: {exc}"
    return _replies_match(reply, o.replies, o.stateless)


def check(outcomes: list[Outcome], status: int, headers: Any, body: bytes, method: str) -> str | None:
    """``None`` when the response is one of ``outcomes``; else why not (one reason per outcome)."""
    if status >= 500:
        return f"a {status}"
    ctype = headers.get("content-type", "")
    reasons = []
    for o in outcomes:
        why = _match(o, status, ctype, body, headers, method)
        if why is None:
            return None
        reasons.append(f"{o.kind}: {why}")
    return "; ".join(reasons)
