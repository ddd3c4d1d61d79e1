"""A seeded generator of hostile JSON-RPC bodies for the transport fuzz test, and the envelope rules
(docs/REFERENCE.md §2.3) that say which members of a body get a reply.

Bodies are built as JSON *text* (:class:`Raw` pieces go in verbatim), so values no Python
serialiser writes are reachable: ``1e400``, ``"\\ud800"``, 2^64, nesting past 64 levels, bytes that
are not JSON. Request ids are unique per generator, so replies can be matched; invalid ids are
counted instead (their replies carry ``id: null``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from typing import Any


@dataclasses.dataclass(frozen=True)
class Raw:
    """JSON text put into a body verbatim."""

    text: str


def dump(value: Any) -> str:
    """JSON text of ``value``; :class:`Raw` pieces are copied as they are."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value)


def strict(text: str) -> Any:
    """Parse a reply as strict JSON: ``NaN``/``Infinity`` fail the test, as a lone surrogate does."""
    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} in a reply: {text[:200]}")

    text.encode("utf-8")
    return json.loads(text, parse_constant=refuse)


def valid_id(value: Any) -> bool:
    """docs/REFERENCE.md §2.3: a string that is valid Unicode, or a finite number (not a boolean)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    return isinstance(value, int)


def answered(member: Any) -> bool:
    """Whether a member of a parsed body gets a reply: requests and malformed messages do;
    notifications and the client's own responses do not."""
    if not isinstance(member, dict) or member.get("jsonrpc") != "2.0":
        return True
    if "method" not in member:
        return not ("id" in member and ("result" in member or "error" in member))
    return not isinstance(member["method"], str) or "id" in member


WEIRD_NUMBERS = [0, -1, 1, 3, 3.0, 2.5, -0.0, 2 ** 31, 2 ** 63 - 1, 2 ** 63, 2 ** 64, 10 ** 30, Raw("1e400"),
                 Raw("-1e400"), Raw("1E2"), Raw("123456789012345678901234567890123456789"), "1", True, None, [], {}]
BAD_IDS = [None, True, False, Raw("1e400"), Raw("-1e400"), Raw('"\\ud800"'), Raw('"x\\udc80y"'), [], {}, [1]]


class Generator:
    """Hostile bodies from a fixed seed.

    Args:
        seed: the random seed (the same seed gives the same bodies).
        files: absolute paths of real files and folders the daemon may read.
        slot: 0-15, keeps this generator's ids apart from other generators'.
    """

    def __init__(self, seed: int, files: list[str], slot: int) -> None:
        self.rng = random.Random(seed)
        self.files = files
        self.slot = slot
        self.count = 0

    def new_id(self) -> Any:
        self.count += 1
        return f"g{self.slot}-{self.count}" if self.rng.random() < 0.6 else self.count * 16 + self.slot

    def path(self) -> Any:
        r = self.rng
        choice = r.randrange(12)
        if choice < 5:
            return r.choice(self.files)
        return r.choice([
            "/no/such/file", "relative/path", "", "/", "/dev/null", "/proc/self/status",
            Raw('"/tmp/\\ud800.txt"'), Raw('"/tmp/a\\u0000b"'), "/" + "x" * 300, "/" + "a/" * 3000,
            "/tmp/../etc/hostname", "/tmp/\u2028\x85.txt", 7, None, ["/etc/hostname"],
        ])

    def arguments(self) -> Any:
        r = self.rng
        if r.random() < 0.05:
            return r.choice([None, [], "x", 5, Raw("1e400")])
        args: dict[str, Any] = {"path": self.path()}
        for key in ("start_line", "end_line", "offset", "limit"):
            if r.random() < 0.3:
                args[key] = r.choice(WEIRD_NUMBERS) if r.random() < 0.5 else r.randrange(1, 50)
        if r.random() < 0.15:
            args["privileged"] = r.choice([True, False, "yes", 1, None])
        if r.random() < 0.1:
            args["encoding"] = r.choice(["utf-8", "latin-1", "utf-16", "auto", "klingon", 8])
        if r.random() < 0.1:
            args["include_metadata"] = r.choice([True, False, "no"])
        if r.random() < 0.05:
            args[r.choice(["bogus", "", "\u00e9"])] = 1
        if r.random() < 0.05:
            del args["path"]
        return args

    def request(self) -> dict[str, Any]:
        r = self.rng
        kind = r.randrange(10)
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": self.new_id()}
        if kind < 5:
            name = r.choice(["files/read"] * 6 + ["files_read", "files/list", "files/filetype", "files/find",
                                                  "no/such", 7])
            msg.update(method="tools/call", params={"name": name, "arguments": self.arguments()})
            if name in ("files/list", "files/find") and isinstance(msg["params"]["arguments"], dict):
                msg["params"]["arguments"]["path"] = r.choice(["/proc/self", self.files[-1], "/no/such"])
        elif kind == 5:
            msg.update(method=r.choice(["ping", "tools/list", "resources/list", "resources/templates/list"]))
        elif kind == 6:
            msg.update(method="resources/read", params={"uri": r.choice(
                ["file://" + self.files[0], "file:///no/such", "nope:", Raw('"file:///\\ud800"'), 5])})
        elif kind == 7:
            msg.update(method=r.choice(["nope", "", "server/discover", "initialize"]),
                       params=r.choice([None, {}, [], "x", {"protocolVersion": "2025-03-26", "capabilities": {},
                                                            "clientInfo": {"name": "f", "version": "0"}}]))
        elif kind == 8:
            msg.update(method="ping", params={"_meta": {"progressToken": r.choice(["t", 1, Raw("1e400"), None])}})
        else:
            msg.update(method="ping")
            msg["id"] = r.choice(BAD_IDS)
        return msg

    def member(self) -> Any:
        r = self.rng
        kind = r.randrange(20)
        if kind < 14:
            return self.request()
        if kind == 14:
            return {"jsonrpc": "2.0", "method": r.choice(["notifications/initialized", "notifications/whatever",
                                                          "notifications/cancelled"]),
                    "params": {"requestId": r.choice(["nope", 1, None])}}
        if kind == 15:
            return {"jsonrpc": "2.0", "id": self.new_id(), "result": {}}  # a client response: no reply
        if kind == 16:
            msg = self.request()
            msg.pop("jsonrpc")
            msg["jsonrpc"] = r.choice([None, "1.0", 2.0, Raw("1e400")])  # answered, id kept if valid
            return msg
        if kind == 17:
            return r.choice([1, "x", None, True, [], Raw("1e400"), Raw('"\\udfff"')])
        if kind == 18:
            return {"jsonrpc": "2.0", "id": self.new_id(), "method": r.choice([5, None, [], Raw("1e400")])}
        return {"jsonrpc": "2.0", "id": self.new_id()}

    def body(self) -> tuple[bytes, str]:
        """One POST body and its content type."""
        r = self.rng
        kind = r.randrange(40)
        if kind == 0:
            return r.choice([b"", b"{", b"\xff\xfe{}", b"nul", b"[1,", b"{}garbage", b'"text"', b"NaN", b"1e400",
                             b'{"a":1e400}', b'\xed\xa0\x80']), "application/json"
        if kind == 1:
            depth = r.choice([64, 65, 66, 100, 1000, 100_000])
            return ("[" * depth + "]" * depth).encode(), "application/json"
        if kind == 2:
            return b'{"jsonrpc":"2.0","id":1,"method":"ping"}', r.choice(["text/plain", "", "application/jsonx"])
        if kind < 8:
            members = [self.member() for _ in range(r.randrange(0, 6))]
            return dump(members).encode("utf-8", "surrogatepass"), "application/json"
        return dump(self.member()).encode("utf-8", "surrogatepass"), "application/json"


def expectation(body: bytes, content_type: str) -> tuple[str, list[Any], int, bool] | None:
    """What a body should get: ``None`` when it is refused (4xx), else ``(shape, ids, nulls, any)``:
    ``shape`` is ``"one"`` (an object) or ``"batch"``, ``ids`` the valid ids of the answered members,
    ``nulls`` how many answered members have no valid id, ``any`` whether anything is answered."""
    if content_type != "application/json":
        return None
    try:
        payload = json.loads(body, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    except (ValueError, RecursionError):
        return None
    if not isinstance(payload, (dict, list)) or _depth(payload) > 64:
        return None
    members = payload if isinstance(payload, list) else [payload]
    if isinstance(payload, list) and not payload:
        return "batch", [], 1, True
    answered_members = [m for m in members if answered(m)]
    ids = [m["id"] for m in answered_members if isinstance(m, dict) and "id" in m and valid_id(m["id"])]
    nulls = len(answered_members) - len(ids)
    return ("batch" if isinstance(payload, list) else "one"), ids, nulls, bool(answered_members)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0
