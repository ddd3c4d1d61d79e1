"""Attacks on secret redaction and on the privileged files/grep, through the real daemon (docs/REFERENCE.md
§3 "Redaction", §3 ``files/grep``, §4.1): the root helper, the policy process, real accounts.

The attacker is a redacting principal (``carol``: ``redact: secrets``, bound to alice's account)
or alice herself under grants. Each test names the property it pins; a test that passes means
the property holds. A test marked ``xfail(strict=True)`` is an attack that succeeds today: its
reason says what leaks.
"""

from __future__ import annotations

import asyncio
import base64
import grp
import gzip
import json
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.client.api import Client
from mcpd.common import identity
from mcpd.common.redaction import parse_redact
from mcpd.core.grepargs import encode_cursor, parse_grep_args
from tests.support.privsep_fixture import SECRET_TEXT, PrivsepDaemon, privsep_daemon  # noqa: F401

pytestmark = pytest.mark.root

PW = "Zq8-never-shown-" + secrets.token_hex(4)
CONF = f"[db]\nhost = db.internal\npassword = {PW}\nend = here\n"
#: a small PEM key, and a PGP private key block longer than the 64 KiB the reader looks back
KEY_LINES = [base64.b64encode(secrets.token_bytes(48)).decode() for _ in range(20)]
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(KEY_LINES) + "\n-----END OPENSSH PRIVATE KEY-----\n"
BIG_LINES = [base64.b64encode(secrets.token_bytes(48)).decode() for _ in range(1300)]  # 1300 * 65 bytes: 84 KiB
BIG_KEY = ("-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n" + "\n".join(BIG_LINES)
           + "\n=AbCd\n-----END PGP PRIVATE KEY BLOCK-----\n")


def _leaks(text: str, lines: list[str] = KEY_LINES) -> list[str]:
    """The key lines (or 16-character pieces of them) ``text`` shows."""
    return [x for x in lines if x[:16] in text or x[-16:] in text]


@pytest.fixture(scope="module")
def setup(privsep_daemon: PrivsepDaemon) -> Iterator[tuple[PrivsepDaemon, str, Path]]:  # noqa: F811
    """``carol`` (redact: secrets, alice's account) with a token, and ``own``: a folder of alice's."""
    d = privsep_daemon
    users_file = d.config_path.parent / "users.yaml"
    users = identity.load_users(users_file)
    token, rec = identity.new_token()
    users["carol"] = identity.UserRecord(name="carol", os_user=d.accounts["alice"].name, tokens=[rec],
                                         redact=parse_redact("secrets"))
    identity.save_users(users_file, users)
    own = d.srv / "alice-own"
    own.mkdir(mode=0o700)
    os.chown(own, d.accounts["alice"].uid, d.accounts["alice"].gid)
    yield d, token, own
    d.write_grants(d.default_grants())


def _alices(d: PrivsepDaemon, path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    os.chown(path, d.accounts["alice"].uid, d.accounts["alice"].gid)
    return path


def _run(d: PrivsepDaemon, token: str, name: str, **args: Any) -> dict[str, Any]:
    async def go() -> Any:
        async with Client(d.url, token, d.cacert, timeout=60) as c:
            return await c.call_tool(name, args, check=False)

    return dict(asyncio.run(go()))


def _text(result: dict[str, Any]) -> str:
    return "".join(item.get("text", "") for item in result.get("content", []))


def _granted(d: PrivsepDaemon, result: Any, probe: dict[str, Any], token: str) -> dict[str, Any]:
    """Poll the call ``probe`` until the reloaded grants answer it without an error (bounded)."""
    got: dict[str, Any] = {}
    for _ in range(100):
        got = _run(d, token, **probe)
        if not got.get("isError") and result(got):
            return got
        time.sleep(0.1)
    return got


def _grep_grant(d: PrivsepDaemon, **rule: Any) -> None:
    grants = d.default_grants()
    grants["users"][d.accounts["alice"].name]["privileged"]["tools"]["files/grep"] = {
        "allowed": True, "paths": [str(d.app)], **rule}
    d.write_grants(grants)


# --- the text the detectors judge is the text the caller gets back -----------------------------------


@pytest.mark.parametrize("privileged", [False, True])
def test_reading_in_another_encoding_gives_no_secret_back(setup: tuple[PrivsepDaemon, str, Path],
                                                         privileged: bool) -> None:
    """An ASCII file read with ``encoding: utf-16`` decodes to CJK text no detector matches, and
    encoded back as UTF-16LE it is the file, secrets and keys whole (found by this attack): a
    redacted caller's utf-16 read of a file without a UTF-16 BOM is refused as bytes are."""
    d, token, own = setup
    data = (CONF + KEY).encode()
    data += b"\n" * (len(data) % 2)  # UTF-16 wants whole code units
    path = d.app / "enc.conf" if privileged else own / "enc.conf"
    if privileged:
        path.write_bytes(data)  # root's 0600: alice's grant (no redact) reads it, carol's redaction applies
    else:
        _alices(d, path, data)
    for args in ({"encoding": "utf-16"}, {"encoding": "utf-16", "offset": 0, "limit": len(data)},
                 {"encoding": "utf-16", "start_line": 1}):
        got = _run(d, token, "files/read", path=str(path), privileged=privileged, **args)
        back = _text(got).encode("utf-16-le", "surrogatepass") if not got.get("isError") else b""
        assert PW.encode() not in back and not _leaks(back.decode("latin-1")), (args, back[:200])
        assert got["structuredContent"]["error"]["code"] == "PERMISSION_DENIED", got
        assert "redaction applies" in _text(got)
    bom = _alices(d, own / "bom16.conf", CONF.encode("utf-16"))  # real UTF-16 (its BOM): read and redacted
    got = _run(d, token, "files/read", path=str(bom), encoding="utf-16")
    assert "password = [REDACTED:assignment]" in _text(got) and PW not in _text(got), got


def test_the_resource_in_another_encoding_gives_no_secret_back(setup: tuple[PrivsepDaemon, str, Path]) -> None:
    """The file resource with ``?encoding=utf-16`` on an ASCII file: refused, as files/read is."""
    from mcpd.client.api import ResourceFailed

    d, token, own = setup
    data = (CONF + KEY).encode()
    path = _alices(d, own / "enc-res.conf", data + b"\n" * (len(data) % 2))

    async def go() -> Any:
        async with Client(d.url, token, d.cacert, timeout=60) as c:
            return await c.read_resource(f"file://{path}?encoding=utf-16")

    with pytest.raises(ResourceFailed) as err:
        asyncio.run(go())
    assert err.value.code == "PERMISSION_DENIED" and PW not in str(err.value)


# --- the grant that allows a file decides its redaction ------------------------------------------


def test_a_privileged_tree_grep_redacts_a_file_as_its_own_grant_says(setup: tuple[PrivsepDaemon, str, Path]) -> None:
    """alice's own rule grants ``app/vault`` with ``redact: secrets``; her group's grants ``app``
    without. A privileged read of ``app/vault/db.conf`` is redacted (alice's rule allows it); so
    must be the same file found by a privileged grep of ``app`` (found by this attack: it was
    searched with the root's rule's redaction, none, and shown whole; now it is skipped)."""
    d, _, _ = setup
    alice = d.accounts["alice"]
    vault = d.app / "vault"
    vault.mkdir(mode=0o700, exist_ok=True)
    vault_pw = "vault-" + secrets.token_hex(6)
    (vault / "db.conf").write_text(CONF.replace(PW, vault_pw))  # root's 0600: only a grant reads it
    group = grp.getgrgid(alice.gid).gr_name
    redacting = {"allowed": True, "paths": [str(vault)], "redact": "secrets"}
    plain = {"allowed": True, "paths": [str(d.app)]}
    d.write_grants({"users": {alice.name: {"privileged": {"tools": {"files/read": redacting,
                                                                     "files/grep": dict(redacting)}}}},
                    "groups": {group: {"privileged": {"tools": {"files/read": plain, "files/grep": dict(plain)}}}}})
    try:
        read = _granted(d, lambda r: "[REDACTED:" in _text(r), {"name": "files/read", "path": str(vault / "db.conf"),
                                                               "privileged": True}, d.tokens["alice"])
        assert "password = [REDACTED:assignment]" in _text(read) and vault_pw not in _text(read), read
        one = _run(d, d.tokens["alice"], "files/grep", pattern="password", path=str(vault / "db.conf"), privileged=True)
        assert vault_pw not in json.dumps(one) and one["structuredContent"]["matches"], one
        tree = _run(d, d.tokens["alice"], "files/grep", pattern="password", path=str(d.app), privileged=True)
        assert not tree.get("isError") and tree["structuredContent"]["files_searched"] >= 1, tree
        assert vault_pw not in json.dumps(tree), "the vault's password is shown by a grep of the tree"
        sc = tree["structuredContent"]
        assert sc["files_skipped"].get("redacted_grant") == 1, sc
        assert {"path": str(vault / "db.conf"), "reason": "redacted_grant"} in sc["skipped"]
    finally:
        d.write_grants(d.default_grants())


# --- a changed principal redaction reaches a live session --------------------------------------------


def test_redaction_given_to_a_principal_reaches_its_open_session(setup: tuple[PrivsepDaemon, str, Path]) -> None:
    """dave (alice's account, no redact) reads in one MCP session; the operator gives him
    ``redact: secrets``: within seconds the same session's answers are redacted (his workers'
    floor is none, the call carries the new detectors)."""
    d, _, own = setup
    conf = _alices(d, own / "dave.conf", CONF.encode())
    users_file = d.config_path.parent / "users.yaml"
    users = identity.load_users(users_file)
    token, rec = identity.new_token()
    users["dave"] = identity.UserRecord(name="dave", os_user=d.accounts["alice"].name, tokens=[rec])
    identity.save_users(users_file, users)

    async def go() -> list[str]:
        seen = []
        async with Client(d.url, token, d.cacert, timeout=60) as c:
            seen.append(_text(await c.call_tool("files/read", {"path": str(conf)}, check=False)))
            users = identity.load_users(users_file)
            users["dave"] = identity.UserRecord(name="dave", os_user=d.accounts["alice"].name, tokens=[rec],
                                                redact=parse_redact("secrets"))
            identity.save_users(users_file, users)
            changed = time.monotonic()
            while time.monotonic() - changed < 15:
                seen.append(_text(await c.call_tool("files/read", {"path": str(conf)}, check=False)))
                if "[REDACTED:assignment]" in seen[-1]:
                    seen.append(f"{time.monotonic() - changed:.1f}")
                    break
                await asyncio.sleep(0.25)
        return seen

    seen = asyncio.run(go())
    assert PW in seen[0]
    assert "[REDACTED:assignment]" in seen[-2], seen[-3:]
    assert float(seen[-1]) < 10  # "within seconds"


# --- pages, lines and cursors that start inside a key ------------------------------------------------


def test_a_page_or_cursor_inside_a_small_key_shows_none_of_it(setup: tuple[PrivsepDaemon, str, Path]) -> None:
    """Byte windows, line ranges and a forged grep cursor that start or end inside a key, in a
    plain file, a CRLF file, a UTF-16 file and a gzip file: no line of the key is shown."""
    d, token, own = setup
    text = "intro\n" * 3 + KEY + "outro\n"
    files = {"plain": _alices(d, own / "k.txt", text.encode()),
             "crlf": _alices(d, own / "k-crlf.txt", text.replace("\n", "\r\n").encode()),
             "utf16": _alices(d, own / "k16.txt", text.encode("utf-16")),
             "gz": _alices(d, own / "k.txt.gz", gzip.compress(text.encode()))}
    mid = text.index(KEY_LINES[10])
    first = text[:mid].count("\n") + 1
    for kind, path in files.items():
        scale = 2 if kind == "utf16" else 1
        at = (mid + (text[:mid].count("\n") if kind == "crlf" else 0)) * scale + (2 if kind == "utf16" else 0)
        shown = []
        for offset, limit in ((at, 500), (at + 7, 300), (0, at + 30)):
            got = _run(d, token, "files/read", path=str(path), offset=offset, limit=limit)
            assert not got.get("isError"), (kind, got)
            shown.append(_text(got))
        for start, end in ((first, first + 3), (1, first), (first, None)):
            got = _run(d, token, "files/read", path=str(path), start_line=start, end_line=end)
            assert not got.get("isError"), (kind, got)
            shown.append(_text(got))
        if kind != "utf16":  # grep skips UTF-16 (it holds NUL bytes)
            args = {"pattern": ".", "path": str(path)}
            cursor = encode_cursor(parse_grep_args(args), str(path), at, first)
            got = _run(d, token, "files/grep", cursor=cursor, **args)
            assert not got.get("isError"), (kind, got)
            shown.append(json.dumps(got))
            for extra in ({"invert": True, "pattern": "^intro$"}, {"context": 10, "pattern": "intro|outro"}):
                got = _run(d, token, "files/grep", **{**args, **extra})
                assert not got.get("isError") and got["structuredContent"]["matches"], (kind, got)
                shown.append(json.dumps(got))
        assert not _leaks("".join(shown)), (kind, _leaks("".join(shown)))


@pytest.mark.xfail(strict=True, reason="a page starting more than 64 KiB inside a private key block (a PGP key "
                   "with a photo ID, say) is not known to be inside it: its lines are shown")
def test_a_page_deep_inside_a_large_key_block_shows_none_of_it(setup: tuple[PrivsepDaemon, str, Path]) -> None:
    d, token, own = setup
    text = "intro\n" + BIG_KEY + "outro\n"
    path = _alices(d, own / "big.asc", text.encode())
    deep = text.index(BIG_LINES[1200])
    line = text[:deep].count("\n") + 1
    shown = [_text(_run(d, token, "files/read", path=str(path), offset=deep, limit=2000)),
             _text(_run(d, token, "files/read", path=str(path), start_line=line, end_line=line + 20))]
    args = {"pattern": ".", "path": str(path)}
    shown.append(json.dumps(_run(d, token, "files/grep", cursor=encode_cursor(parse_grep_args(args), str(path),
                                                                                deep, line), **args)))
    counts = [len(_leaks(x, BIG_LINES)) for x in shown]
    assert not any(counts), f"key lines shown by the byte page, the line range, the grep cursor: {counts}"


def test_a_key_across_a_decompression_chunk_is_redacted(setup: tuple[PrivsepDaemon, str, Path]) -> None:
    """A key whose block the 1 MiB decompression chunk cuts in two: grep (plain and inverted)
    and a read at the cut show none of it."""
    d, token, own = setup
    pad = ""
    while len(pad) < 1024 * 1024 - 600:  # text that compresses about 2:1 (under the bomb ratio)
        pad += f"filler {secrets.token_hex(20)}\n"
    text = pad + KEY + "tail line\n"
    path = _alices(d, own / "cut.log.gz", gzip.compress(text.encode(), 6))
    shown = [json.dumps(_run(d, token, "files/grep", pattern="^[A-Za-z0-9+/]{64}$", path=str(path)))]
    shown.append(json.dumps(_run(d, token, "files/grep", pattern="filler", invert=True, path=str(path))))
    shown.append(_text(_run(d, token, "files/read", path=str(path), offset=1024 * 1024 - 8, limit=4000)))
    shown.append(_text(_run(d, token, "files/read", path=str(path), offset=len(pad) + 40, limit=4000)))
    assert "tail line" in shown[1]
    assert not _leaks("".join(shown)), _leaks("".join(shown))


def test_the_privileged_resource_route_is_redacted(setup: tuple[PrivsepDaemon, str, Path]) -> None:
    """carol reads the root-only file as a resource through alice's grant (no redact): redacted."""
    d, token, _ = setup
    target = d.app / "res.conf"
    target.write_text(CONF)

    async def go() -> Any:
        async with Client(d.url, token, d.cacert, timeout=60) as c:
            return await c.read_resource(f"file://{target}?privileged=true")

    item = asyncio.run(go())
    assert PW not in json.dumps(item) and "password = [REDACTED:assignment]" in item["text"], item
    assert item["_meta"]["redacted"] == {"assignment": 1}


# --- privileged grep reads only what the grant covers, as root opens it ------------------------------


def _plant(d: PrivsepDaemon) -> Path:
    """A folder of alice's inside the granted tree, holding what she could plant there: symlinks
    (file and folder) out of the grant, a FIFO, a device node, a hard link to a root-only file
    outside the grant, and an ordinary file."""
    up = d.app / "uploads"
    if up.exists():
        return up
    up.mkdir(mode=0o755)
    os.chown(up, d.accounts["alice"].uid, d.accounts["alice"].gid)
    os.symlink(d.secret, up / "to-secret")
    os.symlink(d.srv, up / "to-srv")
    os.symlink("/proc/self/root" + str(d.secret), up / "via-proc")
    os.mkfifo(up / "fifo")
    os.mknod(up / "null", 0o666 | 0o020000, os.makedev(1, 3))
    os.link(d.secret, up / "hard")  # (protected_hardlinks keeps alice from this; root may, by mistake)
    _alices(d, up / "ok.txt", b"an ordinary uploaded file\n")
    return up


@pytest.mark.parametrize("follow", [False, True])
def test_privileged_grep_never_leaves_the_grant(setup: tuple[PrivsepDaemon, str, Path], follow: bool) -> None:
    d, _, _ = setup
    up = _plant(d)
    _grep_grant(d)
    word = SECRET_TEXT.split()[0]
    probe = {"name": "files/grep", "pattern": "ordinary", "path": str(up), "privileged": True}
    assert _granted(d, lambda r: r["structuredContent"]["matches"], probe, d.tokens["alice"])["structuredContent"][
        "matches"]
    if follow:  # refused whole: the walker never follows a link
        got = _run(d, d.tokens["alice"], "files/grep", pattern=word, path=str(d.app), privileged=True,
                   follow_symlinks=True)
        assert got["structuredContent"]["error"]["code"] == "INVALID_ARGUMENT" and SECRET_TEXT not in json.dumps(got)
        return
    started = time.monotonic()
    got = _run(d, d.tokens["alice"], "files/grep", pattern=word, fixed_string=True, path=str(d.app), privileged=True,
               time_budget_seconds=20)
    took = time.monotonic() - started
    assert not got.get("isError"), got
    assert SECRET_TEXT not in json.dumps(got) and got["structuredContent"]["matches"] == [], got
    assert took < 15 and not got["structuredContent"]["truncated"], (took, got)  # the FIFO hung nothing
    for name in ("fifo", "null", "hard", "to-secret", "via-proc"):
        one = _run(d, d.tokens["alice"], "files/grep", pattern=word, path=str(up / name), privileged=True)
        assert SECRET_TEXT not in json.dumps(one) and (one.get("isError") or not one["structuredContent"]["matches"])
        read = _run(d, d.tokens["alice"], "files/read", path=str(up / name), privileged=True)
        assert read.get("isError") and SECRET_TEXT not in json.dumps(read), (name, read)


def test_privileged_grep_with_a_folder_swapped_for_a_symlink_stays_in_the_grant(
        setup: tuple[PrivsepDaemon, str, Path]) -> None:
    """alice swaps a folder of hers inside the tree for a symlink to the tree's parent (which holds
    a root-only ``secret``) while privileged greps run: no search ever shows the secret."""
    d, _, _ = setup
    up = _plant(d)
    _grep_grant(d)
    box = up / "box"
    real = up / "box.real"
    real.mkdir(exist_ok=True)
    _alices(d, real / "secret", b"decoy, not secret\n")
    link = up / "box.link"
    if not link.is_symlink():
        os.symlink(d.srv, link)
    os.rename(real, box)
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            os.rename(box, real)
            os.rename(link, box)
            time.sleep(0.0005)
            os.rename(box, link)
            os.rename(real, box)
            time.sleep(0.0005)

    t = threading.Thread(target=swap, daemon=True)
    t.start()
    shown = []
    try:
        for _ in range(25):
            shown.append(json.dumps(_run(d, d.tokens["alice"], "files/grep", pattern=".", path=str(up),
                                         privileged=True)))
            shown.append(json.dumps(_run(d, d.tokens["alice"], "files/grep", pattern=".", path=str(box / "secret"),
                                         privileged=True)))
    finally:
        stop.set()
        t.join(5)
    assert not any(SECRET_TEXT in s for s in shown)
    assert any("decoy" in s for s in shown)  # the searches did run


# --- root reads nothing of /proc that is a process's, or the kernel's memory ------------------------


def test_a_grant_on_proc_serves_no_process_folder_and_no_kernel_memory(setup: tuple[PrivsepDaemon, str, Path]) -> None:
    """An operator grants ``/proc`` (for meminfo, loadavg ...): root still opens no process's folder
    (the helper's environ, ``/proc/self``) and no memory image (``/proc/kcore``), by read or grep."""
    d, _, _ = setup
    rule = {"allowed": True, "paths": ["/proc"]}
    grants = d.default_grants()
    grants["users"][d.accounts["alice"].name]["privileged"]["tools"].update(
        {"files/read": rule, "files/grep": dict(rule)})
    d.write_grants(grants)
    try:
        token = d.tokens["alice"]
        ok = _granted(d, lambda r: "MemTotal" in _text(r), {"name": "files/read", "path": "/proc/meminfo",
                                                           "privileged": True}, token)
        assert "MemTotal" in _text(ok), ok
        helper = f"/proc/{d.helper_pid}"
        for path in (f"{helper}/environ", f"{helper}/cmdline", "/proc/self/environ", "/proc/1/environ"):
            got = _run(d, token, "files/read", path=path, privileged=True)
            assert got.get("isError"), (path, got)
            got = _run(d, token, "files/grep", pattern=".", path=path, privileged=True)
            assert got.get("isError") or not got["structuredContent"]["matches"], (path, got)
        for encoding in ("base64", "latin-1"):
            got = _run(d, token, "files/read", path="/proc/kcore", privileged=True, encoding=encoding,
                       offset=4096, limit=64)
            assert got.get("isError"), got
        got = _run(d, token, "files/grep", pattern="PATH=", path=helper, privileged=True)
        assert not got["structuredContent"].get("matches"), got
    finally:
        d.write_grants(d.default_grants())


# --- very long lines ----------------------------------------------------------------------------


def test_linuxctl_pages_past_long_lines_without_a_secret(setup: tuple[PrivsepDaemon, str, Path]) -> None:
    """Lines longer than a page (one holding a password mid-way, one holding a JWT at its end)
    around a key: ``linuxctl get files`` ends, shows each short line once and no secret; the
    long line read whole by its line number is redacted."""
    from tests.support.linuxctl import flags, linuxctl

    d, token, own = setup
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjYXJvbCJ9." + secrets.token_urlsafe(32)
    long1 = "x" * 15000 + f" password={PW} " + "y" * 15000
    long2 = "z" * 40000 + " Authorization: " + jwt
    text = f"head\n{long1}\nmid\n{KEY}{long2}\ntail\n"
    path = _alices(d, own / "long.txt", text.encode())
    res = linuxctl(*flags(d, token), "get", "files", str(path))
    out = res.stdout.decode("utf-8", "replace")
    assert res.returncode == 0, res
    assert PW not in out and jwt[-20:] not in out and not _leaks(out), out[:300]
    for line in ("head", "mid", "tail"):
        assert out.count(f"\n{line}\n") + out.startswith(f"{line}\n") == 1, (line, out[:200])
    whole = _run(d, token, "files/read", path=str(path), start_line=2, end_line=2)
    assert PW not in _text(whole) and "password=[REDACTED:assignment]" in _text(whole)
    whole = _run(d, token, "files/read", path=str(path), start_line=text[:text.index(long2)].count("\n") + 1,
                 end_line=text[:text.index(long2)].count("\n") + 1)
    assert jwt[-20:] not in _text(whole) and "[REDACTED:token]" in _text(whole), _text(whole)[-200:]
    grep = _run(d, token, "files/grep", pattern="password|Authorization", path=str(path), context=2)
    assert PW not in json.dumps(grep) and jwt[-20:] not in json.dumps(grep)
    assert len(grep["structuredContent"]["matches"]) == 2


# --- the counts say what was redacted, not what a file says ----------------------------------------


@pytest.mark.xfail(strict=True, reason="files/grep counts the markers in the lines shown: a file holding the "
                   "literal text '[REDACTED:private-key]' makes the answer and the access record claim a redaction")
def test_a_file_cannot_forge_the_redaction_counts(setup: tuple[PrivsepDaemon, str, Path]) -> None:
    d, token, own = setup
    path = _alices(d, own / "forged.txt", b"note: [REDACTED:private-key] [REDACTED:token] nothing secret\n")
    read = _run(d, token, "files/read", path=str(path), include_metadata=True)
    assert read["structuredContent"]["redacted"] == {}, read["structuredContent"]
    grep = _run(d, token, "files/grep", pattern="note", path=str(path))
    assert grep["structuredContent"]["redacted"] == {}, grep["structuredContent"]


def test_redaction_given_to_a_principal_reaches_its_privileged_calls(setup: tuple[PrivsepDaemon, str, Path]) -> None:
    """erin (alice's account, no redact) reads a root-only file through alice's grant (no redact);
    once the operator gives erin ``redact: secrets``, her privileged reads and greps are redacted
    within seconds, in one session."""
    d, _, _ = setup
    target = d.app / "erin.conf"
    target.write_text(CONF)
    _grep_grant(d)
    users_file = d.config_path.parent / "users.yaml"
    users = identity.load_users(users_file)
    token, rec = identity.new_token()
    users["erin"] = identity.UserRecord(name="erin", os_user=d.accounts["alice"].name, tokens=[rec])
    identity.save_users(users_file, users)
    probe = {"name": "files/grep", "pattern": "password", "path": str(target), "privileged": True}
    assert PW in _text(_granted(d, lambda r: PW in _text(r), probe, token))

    async def go() -> tuple[str, str, float]:
        async with Client(d.url, token, d.cacert, timeout=60) as c:
            users = identity.load_users(users_file)
            users["erin"] = identity.UserRecord(name="erin", os_user=d.accounts["alice"].name, tokens=[rec],
                                                redact=parse_redact("secrets"))
            identity.save_users(users_file, users)
            changed = time.monotonic()
            read = grep = ""
            while time.monotonic() - changed < 15:
                read = _text(await c.call_tool("files/read", {"path": str(target), "privileged": True}, check=False))
                grep = _text(await c.call_tool("files/grep", {"pattern": "password", "path": str(target),
                                                              "privileged": True}, check=False))
                if "[REDACTED:" in read and "[REDACTED:" in grep:
                    break
                await asyncio.sleep(0.25)
            return read, grep, time.monotonic() - changed

    read, grep, took = asyncio.run(go())
    assert PW not in read + grep and "[REDACTED:assignment]" in read + grep, (read, grep)
    assert took < 10


def test_a_line_over_a_grep_piece_never_shows_a_secret_it_holds(setup: tuple[PrivsepDaemon, str, Path]) -> None:
    """A 3 MiB line (searched in pieces) whose password the piece boundary cuts in two, plain
    and gzip: grep (any pattern, inverted too, with context) shows it withheld, never a part of it."""
    d, token, own = setup
    cut = 2 * 1024 * 1024 - len("before\n")  # the line's bytes in the first piece searched
    noise = secrets.token_hex(1024 * 1024)  # (compresses about 2:1: no bomb)
    line = noise[:cut - 20] + f" password={PW} " + noise[-1024 * 1024:]
    text = f"before\n{line}\nafter\n"
    for path in (_alices(d, own / "huge.txt", text.encode()), _alices(d, own / "huge.txt.gz",
                                                                      gzip.compress(text.encode()))):
        shown = []
        for args in ({"pattern": "password"}, {"pattern": "Zq8"}, {"pattern": "before", "invert": True},
                     {"pattern": "after", "context": 3}, {"pattern": "[0-9a-f]{4} pass"}):
            got = _run(d, token, "files/grep", path=str(path), **args)
            assert not got.get("isError"), got
            shown.append(json.dumps(got))
        assert not any(PW[:8] in s or PW[-8:] in s for s in shown), path
        assert "WITHHELD" in shown[2]


# --- a compressed file's header costs no more than its budget ----------------------------------------


def _gz_with_comment(n: int, text: bytes) -> bytes:
    """A valid gzip member whose header holds an ``n``-byte comment (FCOMMENT), then ``text``."""
    import struct
    import zlib

    z = zlib.compressobj(6, zlib.DEFLATED, -15)
    body = z.compress(text) + z.flush()
    return (b"\x1f\x8b\x08\x10\0\0\0\0\0\x03" + b"c" * n + b"\0" + body
            + struct.pack("<II", zlib.crc32(text), len(text)))


@pytest.mark.xfail(strict=True, reason="gzip's header parser reads a comment (FCOMMENT, FNAME) one byte per "
                   "pread (~2 us a byte, twice per file) before the time budget is checked: a .gz with a few MB of "
                   "comment ends the grep in TIMEOUT, its worker killed, with no partial answer and no cursor, so "
                   "a tree holding it cannot be searched past it")
def test_a_gzip_header_cannot_outlast_the_grep_time_budget(setup: tuple[PrivsepDaemon, str, Path]) -> None:
    d, token, own = setup
    path = _alices(d, own / "comment.log.gz", _gz_with_comment(5 * 1024 * 1024, b"password=x\nhello\n"))
    started = time.monotonic()
    got = _run(d, token, "files/grep", pattern="hello", path=str(path), time_budget_seconds=1)
    took = time.monotonic() - started
    assert not got.get("isError"), f"a 5 MiB gzip comment: {_text(got)[:200]} after {took:.1f} s (budget 1 s)"
    assert took < 6
