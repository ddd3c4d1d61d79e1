"""Binary-safe and decompressed reads through the real daemon (docs/REFERENCE.md §3 ``encoding:
base64``, compressed files, the file resource's ``blob``; §6 ``linuxctl get files``).

Every call goes through a real ``mcpd serve`` over TLS and its workers (the ``daemon`` fixture),
the privileged ones through the real root helper, policy process and a grant (``privsep_daemon``).
"""

from __future__ import annotations

import asyncio
import base64
import bz2
import gzip
import hashlib
import lzma
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zstandard

from mcpd.client.api import Client
from mcpd.client.errors import ResourceFailed
from tests.conftest import Daemon
from tests.support.linuxctl import flags, linuxctl
from tests.support.privsep_calls import client as privsep_client
from tests.support.privsep_fixture import PrivsepDaemon, privsep_daemon  # noqa: F401  (fixture)

CALL_TIMEOUT = 60.0  # seconds: a bound against hanging the suite, never asserted on
MiB = 1024 * 1024
COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "gz": gzip.compress, "xz": lzma.compress, "bz2": bz2.compress,
    "zst": lambda data: zstandard.ZstdCompressor().compress(data),
}


def calls(d: Daemon, *args: dict[str, Any]) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        async with Client(d.url, d.token, d.cacert, timeout=CALL_TIMEOUT) as c:
            return [await c.call_tool("files/read", a, check=False) for a in args]
    return asyncio.run(go())


def error_of(result: dict[str, Any], code: str) -> dict[str, Any]:
    assert result.get("isError") is True, result
    error = result["structuredContent"]["error"]
    assert error["code"] == code, result
    return dict(error)


def base64_pages(results_of: Callable[[dict[str, Any]], dict[str, Any]], path: Path, limit: int) -> tuple[bytes, int]:
    """The file through base64 pages following ``next_offset``; and how many pages it took."""
    out, offset, pages = b"", 0, 0
    while True:
        result = results_of({"path": str(path), "encoding": "base64", "offset": offset, "limit": limit})
        assert not result.get("isError"), result
        content = result["content"]
        assert len(content) == 1 and content[0]["type"] == "text", result
        meta = result["structuredContent"]
        chunk = base64.b64decode(content[0]["text"], validate=True)
        assert meta["encoding"] == "base64" and meta["byteRange"] == {"start": offset, "end": offset + len(chunk)}
        out, pages = out + chunk, pages + 1
        if meta["eof"]:
            assert meta["next_offset"] is None
            return out, pages
        offset = meta["next_offset"]


def test_base64_pages_of_a_binary_file_give_it_back(daemon: Daemon, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB + 12345)
    p = tmp_path / "random.bin"
    p.write_bytes(data)
    got, pages = base64_pages(lambda a: calls(daemon, a)[0], p, MiB)
    assert got == data and pages == 4
    first, text = calls(daemon, {"path": str(p), "encoding": "base64"}, {"path": str(p)})
    assert base64.b64decode(first["content"][0]["text"]) == data[:10240]  # the default window
    assert first["structuredContent"]["next_offset"] == 10240 and first["structuredContent"]["size"] == len(data)
    assert error_of(text, "BINARY_FILE")["message"] == "cannot read binary file"  # text asked: still refused


def test_base64_past_the_answer_bound_is_file_too_large(daemon: Daemon, tmp_path: Path) -> None:
    p = tmp_path / "big.bin"
    p.write_bytes(os.urandom(9 * MiB))
    refused, = calls(daemon, {"path": str(p), "encoding": "base64", "limit": 9 * MiB})
    details = error_of(refused, "FILE_TOO_LARGE")["details"]
    assert "base64" in details["suggestion"] and details["limit"] == 10 * MiB


def test_base64_lines_are_refused(daemon: Daemon, tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    p.write_text("a\n")
    refused, = calls(daemon, {"path": str(p), "encoding": "base64", "start_line": 1})
    assert error_of(refused, "INVALID_ARGUMENT")["details"]["argument"] == "start_line"


@pytest.mark.parametrize("kind", sorted(COMPRESSORS))
def test_rotated_logs_read_as_their_text(daemon: Daemon, tmp_path: Path, kind: str) -> None:
    text = "".join(f"{i:06d} GET /api/v1/items?id={i * 7919 % 100000} 200 r\u00e9ponse\n" for i in range(1, 40001))
    data = text.encode()
    p = tmp_path / f"access.log.3.{kind}"
    p.write_bytes(COMPRESSORS[kind](data))
    lines, window, meta, raw = calls(
        daemon, {"path": str(p), "start_line": 30000, "end_line": 30001},
        {"path": str(p), "offset": 2 * MiB, "limit": 100},
        {"path": str(p), "start_line": 1, "end_line": 1, "include_metadata": True},
        {"path": str(p), "decompress": False})
    assert lines["content"][0]["text"] == "".join(text.splitlines(keepends=True)[29999:30001])
    assert window["content"][0]["text"] == data[2 * MiB:2 * MiB + 100].decode()
    facts = meta["structuredContent"]
    assert facts["compression"] == kind and facts["compressedSize"] == p.stat().st_size
    assert facts["size"] == len(data) and facts["sha256"] == hashlib.sha256(data).hexdigest()
    assert facts["totalLines"] == 40000
    assert error_of(raw, "BINARY_FILE")["message"] == "cannot read binary file"
    stored, = calls(daemon, {"path": str(p), "decompress": False, "encoding": "base64", "limit": MiB})
    assert base64.b64decode(stored["content"][0]["text"]) == p.read_bytes()


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
    return sorted(set(kids))


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def test_a_gigabyte_of_zeros_gzipped_is_refused_without_memory_growth(daemon_factory: Callable[..., Daemon],
                                                                      tmp_path: Path) -> None:
    if shutil.which("gzip") is None:
        pytest.fail("gzip(1) is needed to make the bomb")
    d = daemon_factory(workers={"per_account": 1, "timeout_seconds": 60})
    bomb = tmp_path / "zeros.gz"
    subprocess.run(f"head -c 1G /dev/zero | gzip -1 > {bomb}", shell=True, check=True)
    assert bomb.stat().st_size < 8 * MiB
    warm, = calls(d, {"path": "/proc/self/status", "end_line": 1})  # spawns the one worker
    assert not warm.get("isError"), warm
    worker, = _children(d.pid)
    rss_before = _status_kb(worker, "VmRSS")
    deep, metadata, text = calls(d, {"path": str(bomb), "encoding": "base64", "offset": 900 * MiB, "limit": 10},
                                 {"path": str(bomb), "encoding": "base64", "include_metadata": True},
                                 {"path": str(bomb)})
    for refused in (deep, metadata):
        error = error_of(refused, "FILE_TOO_LARGE")
        assert error["details"]["reason"] == "compression_ratio" and error["details"]["compression"] == "gz"
        assert "decompression bomb" in error["message"]
    assert error_of(text, "BINARY_FILE")  # zeros are not text: refused on the first 8 KiB
    assert _children(d.pid) == [worker]
    growth = _status_kb(worker, "VmHWM") - rss_before
    print(f"\nworker VmHWM growth over the bomb: {growth} kB")
    assert growth < 20 * 1024, "the worker's memory grew with the decompressed text"


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_damaged_gzip_is_a_clear_error(daemon: Daemon, tmp_path: Path, damage: str) -> None:
    whole = gzip.compress(b"".join(b"line %d of the log\n" % i for i in range(200000)))
    data = whole[: len(whole) // 2] if damage == "truncated" else whole[:30] + b"\x00" * 500 + whole[530:]
    p = tmp_path / f"{damage}.log.gz"
    p.write_bytes(data)
    refused, = calls(daemon, {"path": str(p), "start_line": 150000, "end_line": 150000})
    error = error_of(refused, "ENCODING_ERROR")
    assert error["details"]["reason"] == "corrupt" and error["details"]["compression"] == "gz"
    assert "damaged or truncated" in error["message"] and "decompress: false" in error["details"]["suggestion"]


def test_resource_of_a_binary_file_is_a_blob(daemon: Daemon, tmp_path: Path) -> None:
    data = os.urandom(50_000) + b"\0"
    p = tmp_path / "image.bin"
    p.write_bytes(data)
    t = tmp_path / "notes.txt"
    t.write_text("plain text\n" * 3000)  # over one 10 KiB window: a blob is still the whole file

    async def go() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with Client(daemon.url, daemon.token, daemon.cacert, timeout=CALL_TIMEOUT) as c:
            return (await c.read_resource(f"file://{p}", include_metadata=True),
                    await c.read_resource(f"file://{t}"),
                    await c.read_resource(f"file://{t}?encoding=base64"))

    blob, text, asked = asyncio.run(go())
    assert "text" not in blob and base64.b64decode(blob["blob"], validate=True) == data
    assert blob["mimeType"] == "application/octet-stream"
    assert blob["_meta"]["sha256"] == hashlib.sha256(data).hexdigest() and blob["_meta"]["eof"] is True
    assert text["text"].startswith("plain text\n") and "blob" not in text
    assert base64.b64decode(asked["blob"]) == b"plain text\n" * 3000 and asked["mimeType"] == "text/plain"


def test_resource_of_a_binary_file_over_one_answer_is_file_too_large(daemon: Daemon, tmp_path: Path) -> None:
    p = tmp_path / "huge.bin"
    p.write_bytes(b"\0" * (8 * MiB))

    async def go() -> None:
        async with Client(daemon.url, daemon.token, daemon.cacert, timeout=CALL_TIMEOUT) as c:
            await c.read_resource(f"file://{p}")

    with pytest.raises(ResourceFailed) as info:
        asyncio.run(go())
    assert info.value.code == "FILE_TOO_LARGE"
    assert "encoding base64" in str(info.value.details.get("suggestion"))


# --- linuxctl get files ---------------------------------------------------------------------------


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def get_files(daemon: Any, path: Path, *extra: str) -> bytes:
    res = linuxctl(*flags(daemon), "get", "files", str(path), *extra)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_linuxctl_copies_a_binary_file_exactly(daemon: Daemon, tmp_path: Path) -> None:
    p = tmp_path / "true"
    shutil.copyfile("/usr/bin/true", p)
    expected = subprocess.run(["sha256sum", str(p)], capture_output=True, check=True).stdout.split()[0].decode()
    assert sha256_of(get_files(daemon, p)) == expected


def test_linuxctl_copies_a_latin1_file_exactly_without_encoding(daemon: Daemon, tmp_path: Path) -> None:
    data = ("caf\u00e9 cr\u00e8me br\u00fbl\u00e9e\n" * 5000).encode("latin-1")
    p = tmp_path / "menu.txt"
    p.write_bytes(data)
    assert get_files(daemon, p) == data


def test_linuxctl_switches_to_bytes_where_the_text_stops(daemon: Daemon, tmp_path: Path) -> None:
    data = ("\u00e9t\u00e9 " * 600_000).encode() + "na\u00efve\n".encode("latin-1") + b"tail"  # UTF-8 for 4 MiB
    p = tmp_path / "mixed.txt"
    p.write_bytes(data)
    assert get_files(daemon, p) == data


def test_linuxctl_copies_a_multi_page_binary_and_a_range(daemon: Daemon, tmp_path: Path) -> None:
    data = os.urandom(5 * MiB + 777)
    p = tmp_path / "blob.bin"
    p.write_bytes(data)
    assert sha256_of(get_files(daemon, p)) == sha256_of(data)
    assert get_files(daemon, p, "--offset", str(MiB + 3), "--limit", str(2 * MiB)) == data[MiB + 3:3 * MiB + 3]
    res = linuxctl(*flags(daemon), "get", "files", str(p), "--max-bytes", str(MiB))
    assert res.returncode == 1 and b"--max-bytes" in res.stderr and res.stdout == b""


def test_linuxctl_copies_a_compressed_file_as_its_own_bytes(daemon: Daemon, tmp_path: Path) -> None:
    p = tmp_path / "syslog.2.gz"
    p.write_bytes(gzip.compress(b"Dec  7 10:00:00 host kernel: hello\n" * 10000))
    assert get_files(daemon, p) == p.read_bytes()


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_linuxctl_decompress_prints_the_text_like_zcat(daemon: Daemon, tmp_path: Path, kind: str) -> None:
    text = b"".join(b"%08d Dec  7 host sshd[%d]: Accepted publickey\n" % (i, i % 9973) for i in range(200_000))
    assert len(text) > 8 * MiB  # two pages of decompressed text
    p = tmp_path / f"auth.log.2.{kind}"
    p.write_bytes(COMPRESSORS[kind](text))
    assert sha256_of(get_files(daemon, p, "--decompress")) == sha256_of(text)
    assert get_files(daemon, p, "--decompress", "--offset", "100", "--limit", "50") == text[100:150]
    res = linuxctl(*flags(daemon), "get", "files", str(p), "--decompress", "--max-bytes", str(MiB))
    assert res.returncode == 1 and b"--max-bytes" in res.stderr


def test_linuxctl_read_of_a_binary_resource_prints_its_bytes(daemon: Daemon, tmp_path: Path) -> None:
    data = bytes(range(256)) * 40
    p = tmp_path / "table.bin"
    p.write_bytes(data)
    res = linuxctl(*flags(daemon), "read", f"file://{p}")
    assert res.returncode == 0, res.stderr
    assert res.stdout == data


# --- the privileged route ----------------------------------------------------------------------------


@pytest.mark.root
def test_privileged_base64_and_decompressed_reads_under_a_grant(privsep_daemon: PrivsepDaemon) -> None:  # noqa: F811
    d = privsep_daemon
    data = os.urandom(2 * MiB + 99)
    blob = d.app / "core.bin"
    packed = d.app / "app.log.1.xz"
    text = b"".join(b"%06d privileged log line\n" % i for i in range(50000))
    outside = d.srv / "app-evil" / "x.bin"
    for path, content in ((blob, data), (packed, lzma.compress(text)), (outside, data)):
        path.write_bytes(content)
        os.chmod(path, 0o600)  # root's only: the account cannot read it itself

    async def go() -> tuple[bytes, list[dict[str, Any]]]:
        async with privsep_client(d) as c:
            async def one(args: dict[str, Any]) -> dict[str, Any]:
                return await c.call_tool("files/read", {**args, "privileged": True}, check=False)

            out, offset = b"", 0
            while True:
                page = await one({"path": str(blob), "encoding": "base64", "offset": offset, "limit": MiB})
                assert not page.get("isError"), page
                out += base64.b64decode(page["content"][0]["text"])
                if page["structuredContent"]["eof"]:
                    break
                offset = page["structuredContent"]["next_offset"]
            others = [await one({"path": str(packed), "start_line": 40000, "end_line": 40000}),
                      await one({"path": str(outside), "encoding": "base64"}),
                      await one({"path": str(blob)}),
                      await c.call_tool("files/read", {"path": str(blob), "encoding": "base64"}, check=False)]
            resource = await c.read_resource(f"file://{blob}?privileged=true", include_metadata=True)
            return out, [*others, {"resource": resource}]

    try:
        got, (line, refused, as_text, unprivileged, resource) = asyncio.run(go())
        assert got == data
        assert line["content"][0]["text"] == "039999 privileged log line\n"
        assert error_of(refused, "PERMISSION_DENIED")["details"]["reason"] == "no grant covers this path"
        assert error_of(as_text, "BINARY_FILE")["message"] == "cannot read binary file"
        assert error_of(unprivileged, "PERMISSION_DENIED")  # the kernel refuses the account itself
        item = resource["resource"]
        assert base64.b64decode(item["blob"]) == data and item["_meta"]["sha256"] == sha256_of(data)
    finally:
        for path in (blob, packed, outside):
            path.unlink(missing_ok=True)
