"""Redacted answers of the worker's ops (docs/REFERENCE.md §3 "Redaction"): files/read pages keep
line numbers and the file's byte offsets, never show part of a line, never part of a key cut by
a page, and files/grep searches the redacted text, so no pattern finds a secret."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from mcpd.common.config import ReadLimits
from mcpd.common.redaction import DETECTORS, REDACT_KEY
from mcpd.core import fileopen
from mcpd.core.ops import OpContext, run

CTX = OpContext(limits=ReadLimits(), open_file=fileopen.open_regular, open_dir=fileopen.open_directory)
ALL = list(DETECTORS)
SECRET = "hunter2-Very-Secret"


def op(name: str, redact: list[str] | None = ALL, **args: Any) -> dict[str, Any]:
    if redact is not None:
        args[REDACT_KEY] = redact
    reply = run({"id": 1, "op": name, "args": args}, CTX)
    assert reply["ok"], reply
    return dict(reply["result"])


def _key() -> bytes:
    k = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                           serialization.NoEncryption())


def _config(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    key = _key()
    data = (b"# app\nname = demo\npassword = " + SECRET.encode() + b"\nlog = /var/log/app\n" + key
            + b"api_key=0123456789abcdef\nend = yes\n")
    f = tmp_path / "app.conf"
    f.write_bytes(data)
    return f, data, key


def test_a_read_is_redacted_and_counted(tmp_path: Path) -> None:
    f, data, key = _config(tmp_path)
    r = op("files/read", path=str(f))
    assert SECRET not in r["text"] and "0123456789abcdef" not in r["text"]
    assert r["redacted"] == {"private-key": 1, "assignment": 2}
    assert r["text"].count("\n") == data.count(b"\n")  # every line kept
    lines = r["text"].split("\n")
    assert lines[2] == "password = [REDACTED:assignment]" and lines[4] == "[REDACTED:private-key]"
    plain = op("files/read", redact=None, path=str(f))
    assert SECRET in plain["text"] and "redacted" not in plain


def test_line_numbers_stay_and_a_page_inside_a_key_shows_none_of_it(tmp_path: Path) -> None:
    f, data, key = _config(tmp_path)
    body = key.split(b"\n")[3:5]
    r = op("files/read", path=str(f), start_line=8, end_line=9, include_metadata=True)
    assert r["text"] == "[REDACTED:private-key]\n\n"
    assert r["metadata"]["lineRange"] == {"start": 8, "end": 9} and r["redacted"] == {"private-key": 1}
    assert r["metadata"]["sha256"] is None and r["metadata"]["size"] == len(data)  # no digest to guess against
    assert not any(b.decode() in r["text"] for b in body)
    last = data.count(b"\n") - 1  # "api_key=..." is the line before the last
    r = op("files/read", path=str(f), start_line=last, end_line=last)
    assert r["text"] == "api_key=[REDACTED:assignment]\n"


def test_a_page_boundary_never_splits_a_secret(tmp_path: Path) -> None:
    """An attacker pages byte by byte through a secret: every window that cuts its line withholds
    the line; the warning's offset then starts the next page on the line, shown redacted."""
    f, data, _ = _config(tmp_path)
    at = data.index(SECRET.encode())
    seen = ""
    for offset in range(at - 12, at + len(SECRET) + 2):
        for limit in (3, 8, 20):
            r = op("files/read", path=str(f), offset=offset, limit=limit)
            seen += r["text"]
    assert not any(SECRET[i:i + 4] in seen for i in range(len(SECRET) - 3)), seen
    line_start = data.rindex(b"\n", 0, at) + 1
    r = op("files/read", path=str(f), offset=0, limit=line_start + 5, include_metadata=True)
    assert r["metadata"]["byteRange"] == {"start": 0, "end": line_start}  # the cut line withheld
    m = re.search(r'"offset": (\d+)', r["text"])
    assert m is not None and int(m.group(1)) == line_start  # the warning names the file's offset
    r = op("files/read", path=str(f), offset=line_start, limit=200)
    assert r["text"].startswith("password = [REDACTED:assignment]\n")


def test_a_window_inside_one_line_withholds_it(tmp_path: Path) -> None:
    f = tmp_path / "one.json"
    f.write_bytes(b'{"password": "' + SECRET.encode() + b'", "pad": "' + b"x" * 5000 + b'"}\n')
    r = op("files/read", path=str(f), offset=3, limit=100, include_metadata=True)
    assert r["text"].startswith("[WITHHELD:") and SECRET not in r["text"]
    assert r["metadata"]["byteRange"]["start"] == 3


def test_pathological_lines_come_back_whole(tmp_path: Path) -> None:
    f = tmp_path / "bad.env"
    line = b"a=" * 30_000
    f.write_bytes(line + b"\n" + b"password=" * 7_000 + b"\nok\n")
    r = op("files/read", path=str(f), start_line=1, end_line=3)
    assert r["text"].startswith("a=a=a=") and r["text"].endswith("\nok\n")
    assert r["text"].count("\n") == 3


def test_grep_never_finds_a_secret_and_keeps_the_files_offsets(tmp_path: Path) -> None:
    f, data, key = _config(tmp_path)
    assert op("files/grep", pattern=SECRET, path=str(f))["matches"] == []
    assert op("files/grep", pattern="hunter2", path=str(f), fixed_string=True)["matches"] == []
    body = key.split(b"\n")[2][:12].decode()
    assert op("files/grep", pattern=body, path=str(f), fixed_string=True)["matches"] == []
    r = op("files/grep", pattern="^password", path=str(f), context=1)
    (m,) = r["matches"]
    assert m["text"] == "password = [REDACTED:assignment]" and m["line"] == 3
    assert m["byte_offset"] == data.index(b"password")
    assert r["redacted"] == {"assignment": 1}
    r = op("files/grep", pattern="^end", path=str(f))
    assert r["matches"][0]["byte_offset"] == data.index(b"end = yes")  # after the shorter redacted key
    assert r["matches"][0]["line"] == data.count(b"\n")
    plain = op("files/grep", redact=None, pattern=SECRET, path=str(f))
    assert len(plain["matches"]) == 1 and "redacted" not in plain


def test_grep_resumed_inside_a_key_shows_none_of_it(tmp_path: Path) -> None:
    from mcpd.core.grepargs import encode_cursor, parse_grep_args

    f, data, key = _config(tmp_path)
    mid = data.index(key) + key.index(b"\n") + 1  # the key's second line
    args = parse_grep_args({"pattern": ".", "path": str(f)})
    cursor = encode_cursor(args, str(f), mid, 6)
    r = op("files/grep", pattern=".", path=str(f), cursor=cursor)
    texts = [m["text"] for m in r["matches"]]
    assert texts[0] == "[REDACTED:private-key]"
    assert not any(x.decode() in "\n".join(texts) for x in key.split(b"\n")[1:-2] if x)


def test_grep_withholds_a_line_searched_in_pieces(tmp_path: Path) -> None:
    """A secret on a line over 1 MiB could be cut by a piece edge: such a line is never searched
    nor shown when redacting; the lines around it are."""
    from mcpd.core.grepscan import PIECE

    f = tmp_path / "min.js"
    edge = PIECE - 9  # "password=" ends right at the first piece's edge
    long = b"x" * edge + b"password=" + SECRET.encode() + b"y" * PIECE
    f.write_bytes(b"before password=a1\n" + long + b"\nafter token=b2\n")
    r = op("files/grep", pattern="password|token|WITHHELD|hunter", path=str(f))
    texts = [(m["line"], m["text"][:60]) for m in r["matches"]]
    assert texts[0] == (1, "before password=[REDACTED:assignment]") and texts[-1] == (3, "after token=[REDACTED:assignment]")
    assert all(t.startswith("[WITHHELD") for n, t in texts if n == 2) and SECRET not in repr(r)
    assert r["matches"][-1]["byte_offset"] == 19 + len(long) + 1


def test_grep_resumes_at_the_files_offsets(tmp_path: Path) -> None:
    f = tmp_path / "many.env"
    lines = [f"K{i}_PASSWORD={SECRET}{i}\n".encode() for i in range(20)]
    data = b"".join(lines)
    f.write_bytes(data)
    seen, cursor = [], None
    for _ in range(25):
        args: dict[str, Any] = {"pattern": "PASSWORD", "path": str(f), "max_matches": 3}
        if cursor:
            args["cursor"] = cursor
        r = op("files/grep", **args)
        seen += [(m["line"], m["byte_offset"]) for m in r["matches"]]
        cursor = r["next_cursor"]
        if not cursor:
            break
    assert seen == [(i + 1, sum(len(x) for x in lines[:i])) for i in range(20)]


def test_a_worker_started_with_a_principals_redaction_redacts_every_call(tmp_path: Path) -> None:
    """The policy process starts a principal's worker with its redaction: a call that carries no
    detectors (a front that dropped them) is still redacted, and a call's own add to them."""
    import json
    import os
    import socket
    import subprocess
    import sys

    from mcpd.common import frames

    def exact(sock: socket.socket, n: int) -> bytes:
        got = b""
        while len(got) < n:
            part = sock.recv(n - len(got))
            assert part, "the worker closed the socket"
            got += part
        return got

    def answer(sock: socket.socket) -> tuple[dict[str, Any], str]:
        reply = frames.recv_frame(sock, 1 << 24)
        assert reply is not None and reply.get("ok"), reply
        (size,) = frames.HEADER.unpack(exact(sock, frames.HEADER.size))
        return reply["result"], exact(sock, size).decode()

    f, _, _ = _config(tmp_path)
    os.chmod(tmp_path, 0o755)
    os.chmod(f, 0o644)
    mine, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-I", "-m", "mcpd.worker", "--fd", str(theirs.fileno()),
                             "--parent", str(os.getpid()), "--limits", json.dumps({REDACT_KEY: ["assignment"]})],
                            pass_fds=[theirs.fileno()])
    theirs.close()
    try:
        mine.settimeout(30)
        frames.send_frame(mine, {"id": 1, "op": "files/read", "args": {"path": str(f)}})
        result, text = answer(mine)
        assert result["redacted"] == {"assignment": 2} and SECRET not in text
        frames.send_frame(mine, {"id": 2, "op": "files/read", "args": {"path": str(f), REDACT_KEY: ["private-key"]}})
        result, text = answer(mine)
        assert result["redacted"] == {"private-key": 1, "assignment": 2} and "[REDACTED:private-key]" in text
    finally:
        mine.close()
        proc.wait(timeout=30)


def test_utf16_files_are_redacted_on_every_path(tmp_path: Path) -> None:
    f = tmp_path / "win.ini"
    text = f"[db]\npassword={SECRET}\nother=1\n"
    f.write_bytes(text.encode("utf-16"))  # with its BOM
    whole = op("files/read", path=str(f))
    assert whole["text"] == "[db]\npassword=[REDACTED:assignment]\nother=1\n"
    assert op("files/read", path=str(f), start_line=2, end_line=2)["text"] == "password=[REDACTED:assignment]\n"
    at = 2 + len("[db]\npass".encode("utf-16-le"))  # a window starting inside the secret's line
    r = op("files/read", path=str(f), offset=at, limit=200, include_metadata=True)
    assert r["text"] == "other=1\n" and SECRET not in r["text"]
    assert r["metadata"]["byteRange"]["start"] == 2 + len("[db]\npassword=".encode("utf-16-le")) + len(
        f"{SECRET}\n".encode("utf-16-le"))


def test_a_cursor_forged_to_point_inside_a_line_shows_none_of_it(tmp_path: Path) -> None:
    """An attacker edits the cursor to resume inside the secret's line (``ord=...``, which no
    detector would know for an assignment) or inside a key, in a plain and a gzip file: the
    rest of that line is withheld, the key's lines too."""
    import gzip

    from mcpd.core.grepargs import encode_cursor, parse_grep_args

    f, data, key = _config(tmp_path)
    g = tmp_path / "app.conf.gz"
    g.write_bytes(gzip.compress(data))
    inside_line = data.index(b"word = ") + 2
    inside_key = data.index(key) + key.index(b"\n") + 1
    for path in (f, g):
        for at in (inside_line, inside_key):
            args = parse_grep_args({"pattern": ".", "path": str(path)})
            r = op("files/grep", pattern=".", path=str(path), cursor=encode_cursor(args, str(path), at, 3))
            shown = "\n".join(m["text"] for m in r["matches"])
            assert SECRET not in shown, (path, at, shown)
            assert not any(x.decode() in shown for x in key.split(b"\n")[1:-2] if x), (path, at)
            assert r["matches"][0]["text"].startswith(("[WITHHELD", "[REDACTED:private-key]")), shown
