"""Secret redaction as policy, through the real daemon (docs/REFERENCE.md §3 "Redaction").

A principal with ``redact: secrets`` in ``users.yaml`` gets files/read, files/grep and the file
resource redacted in its own worker, counted in ``structuredContent``/``_meta`` and in the access
record; a grant with ``redact`` redacts a privileged read and its audit record counts it. The
attacker pages through a secret byte by byte, greps for it, and feeds a pathological file.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from mcpd.client.api import Client
from mcpd.common import identity
from mcpd.common.redaction import parse_redact
from tests.support.privsep_fixture import PrivsepDaemon, privsep_daemon  # noqa: F401

pytestmark = pytest.mark.root

SECRET = "Zq8-not-for-models-" + secrets.token_hex(4)


def _key() -> bytes:
    return ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())


KEY = _key()
CONF = (b"[db]\nhost = db.internal\npassword = " + SECRET.encode() + b"\nurl = postgres://app:" + SECRET.encode()
        + b"@db/app\n" + KEY + b"token=" + SECRET.encode() + b"\nend = here\n")


@pytest.fixture(scope="module")
def redacting(privsep_daemon: PrivsepDaemon) -> Iterator[tuple[PrivsepDaemon, str, Path]]:  # noqa: F811
    """``carol``, a principal of alice's account with ``redact: secrets`` and a token of its own,
    and a folder of alice's holding ``app.conf``."""
    d = privsep_daemon
    users_file = d.config_path.parent / "users.yaml"
    users = identity.load_users(users_file)
    token, rec = identity.new_token()
    users["carol"] = identity.UserRecord(name="carol", os_user=d.accounts["alice"].name, tokens=[rec],
                                         redact=parse_redact("secrets"))
    identity.save_users(users_file, users)
    own = d.srv / "alice-own"
    own.mkdir(mode=0o700)
    alice = d.accounts["alice"]
    os.chown(own, alice.uid, alice.gid)
    conf = own / "app.conf"
    conf.write_bytes(CONF)
    os.chown(conf, alice.uid, alice.gid)
    (d.app / "app.conf").write_bytes(CONF)  # root's 0600: only a grant reads it
    yield d, token, conf


def _run(d: PrivsepDaemon, token: str, name: str, **args: Any) -> dict[str, Any]:
    async def go() -> Any:
        async with Client(d.url, token, d.cacert, timeout=60) as c:
            return await c.call_tool(name, args, check=False)

    return dict(asyncio.run(go()))


def _text(result: dict[str, Any]) -> str:
    return "".join(item.get("text", "") for item in result.get("content", []))


def _access(d: PrivsepDaemon) -> list[dict[str, Any]]:
    text = d.access_path.read_text() if d.access_path.exists() else ""
    return [json.loads(x) for x in text[:text.rfind("\n") + 1].splitlines() if x.strip()]


def test_a_redacting_principal_reads_no_secret(redacting: tuple[PrivsepDaemon, str, Path]) -> None:
    d, token, conf = redacting
    got = _run(d, token, "files/read", path=str(conf))
    text = _text(got)
    assert SECRET not in text and not any(x.decode() in text for x in KEY.split(b"\n")[1:-2] if x)
    assert text.count("\n") == CONF.count(b"\n")  # line numbers unchanged
    assert "password = [REDACTED:assignment]" in text and "postgres://app:[REDACTED:url-password]@db" in text
    counts = got["structuredContent"]["redacted"]
    assert counts == {"private-key": 1, "url-password": 1, "assignment": 2}
    rec = [r for r in _access(d) if r.get("user") == "carol" and r.get("tool") == "files/read"][-1]
    assert rec["redacted"] == "private-key:1,url-password:1,assignment:2"
    assert SECRET not in d.access_path.read_text()
    plain = _run(d, d.tokens["alice"], "files/read", path=str(conf))  # alice's own principal: no redact
    assert SECRET in _text(plain)
    # carol's workers were started with her redaction (a floor no call lowers), alice's without
    starts = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in d.workers("alice")]
    assert any(b'"_redact": ["private-key"' in x for x in starts) and any(b"_redact" not in x for x in starts)


def test_lines_and_offsets_stay_the_files(redacting: tuple[PrivsepDaemon, str, Path]) -> None:
    d, token, conf = redacting
    end_line = CONF[:CONF.index(b"end = here")].count(b"\n") + 1
    got = _run(d, token, "files/read", path=str(conf), start_line=end_line, include_metadata=True)
    assert _text(got) == "end = here\n" and got["structuredContent"]["lineRange"]["start"] == end_line
    at = CONF.index(b"password")
    got = _run(d, token, "files/read", path=str(conf), offset=at, limit=200, include_metadata=True)
    assert got["structuredContent"]["byteRange"]["start"] == at


def test_paging_through_a_secret_never_shows_part_of_it(redacting: tuple[PrivsepDaemon, str, Path]) -> None:
    """The attacker reads windows that start and end inside the secret's line: each withholds the
    cut line; following the warning's offset, the page starts on the line, redacted."""
    d, token, conf = redacting
    at = CONF.index(SECRET.encode())
    seen = []
    for offset, limit in ((at - 4, 10), (at + 3, 6), (at + 5, 40), (0, at + 5)):
        seen.append(_text(_run(d, token, "files/read", path=str(conf), offset=offset, limit=limit)))
    first = _text(_run(d, token, "files/read", path=str(conf), offset=0, limit=at + 5))
    m = re.search(r'"offset": (\d+)', first)
    assert m is not None
    after = _text(_run(d, token, "files/read", path=str(conf), offset=int(m.group(1)), limit=60))
    assert after.startswith("password = [REDACTED:assignment]\n")
    joined = "".join(seen) + after
    assert not any(SECRET[i:i + 5] in joined for i in range(len(SECRET) - 4)), joined


def test_grep_for_the_secret_finds_only_markers(redacting: tuple[PrivsepDaemon, str, Path]) -> None:
    d, token, conf = redacting
    out = _run(d, token, "files/grep", pattern=SECRET, path=str(conf.parent), fixed_string=True)
    assert out["structuredContent"]["matches"] == [] and SECRET not in _text(out)
    out = _run(d, token, "files/grep", pattern="password|token|url", path=str(conf))
    sc = out["structuredContent"]
    assert [m["line"] for m in sc["matches"]] == [3, 4, CONF.count(b"\n") - 1]
    assert sc["matches"][0]["byte_offset"] == CONF.index(b"password")
    assert sc["redacted"] == {"url-password": 1, "assignment": 2} and SECRET not in _text(out)
    body = KEY.split(b"\n")[2][:16].decode()
    assert _run(d, token, "files/grep", pattern=body, path=str(conf), fixed_string=True)["structuredContent"][
        "matches"] == []


def test_the_file_resource_is_redacted(redacting: tuple[PrivsepDaemon, str, Path]) -> None:
    d, token, conf = redacting

    async def go() -> Any:
        async with Client(d.url, token, d.cacert, timeout=60) as c:
            return await c.read_resource(f"file://{conf}", include_metadata=True)

    item = asyncio.run(go())
    assert SECRET not in item["text"] and item["_meta"]["redacted"]["assignment"] == 2
    assert item["text"].count("\n") == CONF.count(b"\n")


def test_a_grant_with_redact_redacts_a_privileged_read(redacting: tuple[PrivsepDaemon, str, Path]) -> None:
    d, _, _ = redacting
    target = d.app / "app.conf"
    plain = _run(d, d.tokens["alice"], "files/read", path=str(target), privileged=True)
    assert SECRET in _text(plain)  # the default grant has no redact
    grants = d.default_grants()
    rules = grants["users"][d.accounts["alice"].name]["privileged"]["tools"]
    rules["files/read"]["redact"] = ["assignment", "private-key"]
    d.write_grants(grants)
    try:
        for _ in range(100):  # the reload is seen within a moment
            got = _run(d, d.tokens["alice"], "files/read", path=str(target), privileged=True)
            if "[REDACTED:" in _text(got):
                break
            asyncio.run(asyncio.sleep(0.1))
        text = _text(got)
        assert "password = [REDACTED:assignment]" in text and "[REDACTED:private-key]" in text
        assert f"postgres://app:{SECRET}@db" in text  # url-password is not among the grant's detectors
        assert got["structuredContent"]["redacted"] == {"private-key": 1, "assignment": 2}
        rec = [r for r in d.audit() if r.get("event") == "accept" and r.get("requested_path") == str(target)][-1]
        assert rec["redacted"] == "private-key:1,assignment:2" and SECRET not in d.audit_text()
    finally:
        d.write_grants(d.default_grants())


def test_a_pathological_file_is_answered_whole(redacting: tuple[PrivsepDaemon, str, Path]) -> None:
    d, token, conf = redacting
    bad = conf.parent / "bad.env"
    bad.write_bytes(b"a=" * 30_000 + b"\n" + b"password=" * 7_000 + b"\n" + b"-----BEGIN PRIVATE KEY-----" * 2000
                    + b"\nafter\n")
    alice = d.accounts["alice"]
    os.chown(bad, alice.uid, alice.gid)
    got = _run(d, token, "files/read", path=str(bad), start_line=1, end_line=3)
    text = _text(got)
    assert text.startswith("a=a=a=") and text.count("\n") == 3
    assert text.split("\n")[1] == "password=[REDACTED:assignment]"
    assert text.split("\n")[2] == "[REDACTED:private-key]"
    out = _run(d, token, "files/grep", pattern="after", path=str(bad))
    assert out["structuredContent"]["matches"] == []  # inside the unterminated key block: redacted too


def test_linuxctl_pages_a_redacted_file_whole(redacting: tuple[PrivsepDaemon, str, Path]) -> None:
    """The pager of ``linuxctl get files`` over pages that cut lines: every line comes once, in
    order, redacted, and no truncation warning is printed as content."""
    from mcpd.client.pager import read_pages

    d, token, conf = redacting
    big = conf.parent / "many.conf"
    lines = [f"line {i} password=pw{i}-{SECRET}\n" if i % 7 == 0 else f"line {i} plain text {'x' * (i % 50)}\n"
             for i in range(3000)]
    big.write_text("".join(lines))
    alice = d.accounts["alice"]
    os.chown(big, alice.uid, alice.gid)

    async def go() -> bytes:
        async with Client(d.url, token, d.cacert, timeout=60) as c:
            return b"".join([p async for p in read_pages(c, str(big), page_bytes=1000)])

    got = asyncio.run(go()).decode()
    assert "[WARNING" not in got and SECRET not in got
    want = [x.split(" password=")[0] + " password=[REDACTED:assignment]\n" if "password=" in x else x for x in lines]
    assert got == "".join(want)


def test_a_client_cannot_turn_redaction_off(redacting: tuple[PrivsepDaemon, str, Path]) -> None:
    """The call's redaction key is no argument: sent by a client, the call is refused, on either
    route and through the resource's query, and nothing is read."""
    d, token, conf = redacting
    for privileged in (False, True):
        got = _run(d, token, "files/read", path=str(conf), privileged=privileged, _redact=[])
        assert got["isError"] and got["structuredContent"]["error"]["code"] == "INVALID_ARGUMENT"
        assert SECRET not in json.dumps(got)
    got = _run(d, token, "files/grep", pattern=SECRET, path=str(conf), _redact=[])
    assert got["isError"] and SECRET not in json.dumps(got)

    async def go() -> Any:
        async with Client(d.url, token, d.cacert, timeout=60) as c:
            return await c.read_resource(f"file://{conf}?_redact=")

    from mcpd.client.errors import ResourceFailed

    with pytest.raises(ResourceFailed) as err:
        asyncio.run(go())
    assert err.value.code == "INVALID_ARGUMENT"


def _grep_grant(d: PrivsepDaemon, redact: Any = None) -> None:
    grants = d.default_grants()
    rule: dict[str, Any] = {"allowed": True, "paths": [str(d.app)]}
    if redact is not None:
        rule["redact"] = redact
    grants["users"][d.accounts["alice"].name]["privileged"]["tools"]["files/grep"] = rule
    d.write_grants(grants)


def _priv_grep(d: PrivsepDaemon, token: str, want_marker: bool) -> dict[str, Any]:
    target = d.app / "app.conf"
    for _ in range(100):  # the reload is seen within a moment
        got = _run(d, token, "files/grep", pattern="password|token", path=str(target), privileged=True)
        if not got.get("isError") and ("[REDACTED:" in _text(got)) == want_marker:
            return got
        asyncio.run(asyncio.sleep(0.1))
    return got


def test_a_redacting_principal_greps_a_root_only_file_redacted(redacting: tuple[PrivsepDaemon, str, Path]) -> None:
    """carol (redact: secrets) with a files/grep grant without redact: the privileged search is
    redacted all the same, counted in the answer and in the audit record."""
    d, token, _ = redacting
    _grep_grant(d)
    try:
        got = _priv_grep(d, token, True)
        assert not got.get("isError"), got
        text = json.dumps(got)
        assert SECRET not in text and "[REDACTED:assignment]" in _text(got)
        # (the url line matches too: its marker holds "password")
        assert got["structuredContent"]["redacted"] == {"url-password": 1, "assignment": 2}
        rec = [r for r in d.audit() if r.get("tool") == "files/grep" and r.get("user") == "carol"][-1]
        assert rec["redacted"] == "url-password:1,assignment:2" and SECRET not in d.audit_text()
        plain = _priv_grep(d, d.tokens["alice"], False)  # alice's own principal: no redaction
        assert SECRET in _text(plain)
    finally:
        d.write_grants(d.default_grants())


def test_a_grant_with_redact_redacts_a_privileged_grep(redacting: tuple[PrivsepDaemon, str, Path]) -> None:
    d, _, _ = redacting
    _grep_grant(d, ["assignment"])
    try:
        got = _priv_grep(d, d.tokens["alice"], True)
        assert SECRET not in json.dumps(got) and got["structuredContent"]["redacted"] == {"assignment": 2}
        rec = [r for r in d.audit() if r.get("tool") == "files/grep" and r.get("user") == "alice"][-1]
        assert rec["redacted"] == "assignment:2"
    finally:
        d.write_grants(d.default_grants())


def test_base64_reads_are_refused_on_both_routes(redacting: tuple[PrivsepDaemon, str, Path]) -> None:
    d, token, conf = redacting
    for path, privileged in ((conf, False), (d.app / "app.conf", True)):
        got = _run(d, token, "files/read", path=str(path), encoding="base64", privileged=privileged)
        assert got["isError"] and got["structuredContent"]["error"]["code"] == "PERMISSION_DENIED", got
        assert "redaction applies" in _text(got) and SECRET not in json.dumps(got)


def test_linuxctl_says_a_binary_file_cannot_be_redacted(redacting: tuple[PrivsepDaemon, str, Path]) -> None:
    from tests.support.linuxctl import flags, linuxctl

    d, token, conf = redacting
    blob = conf.parent / "blob.bin"
    blob.write_bytes(b"\0\1\2password=" + SECRET.encode() + b"\n")
    alice = d.accounts["alice"]
    os.chown(blob, alice.uid, alice.gid)
    res = linuxctl(*flags(d, token), "get", "files", str(blob))
    assert res.returncode != 0 and b"redaction applies" in res.stderr, res
    assert SECRET.encode() not in res.stdout + res.stderr


def test_a_compressed_file_read_as_text_is_redacted(redacting: tuple[PrivsepDaemon, str, Path]) -> None:
    import gzip

    d, token, conf = redacting
    gz = conf.parent / "app.conf.gz"
    gz.write_bytes(gzip.compress(CONF))
    alice = d.accounts["alice"]
    os.chown(gz, alice.uid, alice.gid)
    got = _run(d, token, "files/read", path=str(gz))
    assert not got.get("isError"), got
    assert SECRET not in _text(got) and "password = [REDACTED:assignment]" in _text(got)
    assert got["structuredContent"]["redacted"]["assignment"] == 2
