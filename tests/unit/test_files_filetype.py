"""files/filetype: text/binary, MIME, encodings, line endings, links, FIFOs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mcpd.core.fileops.filetype import SAMPLE_BYTES, filetype, op_filetype
from mcpd.core.tools import files_filetype
from mcpd.helper.wire.errors import FILE_NOT_FOUND, INVALID_ARGUMENT, PERMISSION_DENIED, ToolError

#: Where the fileops helpers live, for a child that imports them by file name.
SUPPORT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
from tests.support.fileops import make_ctx, openers  # noqa: E402

PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489") + b"\0" * 64


def ft(path: Path, **kw: object) -> dict:
    return filetype(str(path), make_ctx(**kw))  # type: ignore[arg-type]


def test_filetype_text_utf8(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_text("héllo wörld\nsecond line\n", encoding="utf-8")
    r = ft(f)
    assert (r["type"], r["mime"], r["text"], r["encoding"], r["bom"]) == ("file", "text/plain", True, "utf-8", False)
    assert r["line_endings"] == "LF"
    assert r["size"] == f.stat().st_size


def test_filetype_binary_png(tmp_path: Path) -> None:
    f = tmp_path / "img.bin"
    f.write_bytes(PNG)
    r = ft(f)
    assert r["mime"] == "image/png"
    assert r["text"] is False and r["encoding"] is None and r["line_endings"] is None


def test_filetype_binary_nul_bytes(tmp_path: Path) -> None:
    f = tmp_path / "blob"
    f.write_bytes(b"abc\0def\n" * 100)
    assert ft(f)["text"] is False


def test_filetype_utf16_bom_is_text(tmp_path: Path) -> None:
    f = tmp_path / "u16.txt"
    f.write_bytes("line one\r\nline two\r\n".encode("utf-16"))  # BOM + native order
    r = ft(f)
    assert r["text"] is True and r["bom"] is True
    assert r["encoding"] in ("utf-16-le", "utf-16-be")
    assert r["line_endings"] == "CRLF"
    assert r["line_ending_counts"] == {"LF": 0, "CRLF": 2, "CR": 0}


def test_filetype_utf8_bom(tmp_path: Path) -> None:
    f = tmp_path / "bom.txt"
    f.write_bytes(b"\xef\xbb\xbfkey=value\n")
    r = ft(f)
    assert (r["encoding"], r["bom"], r["text"]) == ("utf-8", True, True)


def test_filetype_latin1_detected(tmp_path: Path) -> None:
    text = (
        "Bonjour à tous. Ceci est un fichier de configuration écrit en français.\n"
        "Les paramètres ci-dessous contrôlent le comportement du démon: la durée de rétention des\n"
        "journaux, le répertoire où sont stockées les données, et la façon dont les erreurs sont\n"
        "signalées. Ne modifiez pas ces valeurs sans avoir lu la documentation complète.\n"
    )
    f = tmp_path / "latin1.txt"
    f.write_bytes(text.encode("latin-1"))
    r = ft(f)
    assert r["text"] is True
    assert r["encoding"] not in (None, "utf-8")
    assert f.read_bytes().decode(r["encoding"]) == text


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"a\nb\nc\n", "LF"),
        (b"a\r\nb\r\n", "CRLF"),
        (b"a\rb\rc", "CR"),
        (b"a\r\nb\nc\r", "mixed"),
        (b"no terminator at all", "none"),
    ],
)
def test_filetype_line_endings(tmp_path: Path, data: bytes, expected: str) -> None:
    f = tmp_path / "e.txt"
    f.write_bytes(data)
    assert ft(f)["line_endings"] == expected


def test_filetype_crlf_cut_at_sample_edge_is_not_mixed(tmp_path: Path) -> None:
    line = b"x" * 98 + b"\r\n"
    data = line * (SAMPLE_BYTES // 100) + b"y" * (SAMPLE_BYTES % 100 - 1) + b"\r\n" + line * 10
    f = tmp_path / "edge.txt"
    f.write_bytes(data)
    r = ft(f)
    assert r["sampled_bytes"] == SAMPLE_BYTES
    assert r["line_endings"] == "CRLF"


def test_filetype_empty_file(tmp_path: Path) -> None:
    f = tmp_path / "empty"
    f.write_bytes(b"")
    r = ft(f)
    assert r["mime"] == "application/x-empty"
    assert r["text"] is True and r["line_endings"] == "none"


def test_filetype_symlink_is_inode_symlink(tmp_path: Path) -> None:
    (tmp_path / "real.txt").write_text("x\n")
    os.symlink("real.txt", tmp_path / "ln")
    r = ft(tmp_path / "ln")
    assert (r["type"], r["mime"], r["target"]) == ("symlink", "inode/symlink", "real.txt")
    dangling = tmp_path / "dangling"
    os.symlink("/nonexistent/target", dangling)
    assert ft(dangling)["mime"] == "inode/symlink"


def test_filetype_special_files_not_opened(tmp_path: Path) -> None:
    d = tmp_path / "dir"
    d.mkdir()
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "sock"))
    try:
        assert ft(d)["mime"] == "inode/directory"
        assert ft(tmp_path / "sock")["mime"] == "inode/socket"
        assert filetype("/dev/null", make_ctx())["mime"] == "inode/chardevice"
    finally:
        s.close()


def test_filetype_fifo_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    os.symlink("pipe", tmp_path / "pipelink")
    # in a child process: if the FIFO were opened for reading without a writer, it would hang
    # and the child would be killed by the timeout instead of printing
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from fileops import make_ctx; from mcpd.core.fileops.filetype import filetype;"
        "print(filetype(sys.argv[2], make_ctx())['mime'], filetype(sys.argv[3], make_ctx())['mime'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, SUPPORT_DIR, str(fifo), str(tmp_path / "pipelink")],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    assert out.split() == ["inode/fifo", "inode/symlink"]


def test_filetype_missing_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(ToolError) as exc:
        ft(tmp_path / "nope")
    assert exc.value.code == FILE_NOT_FOUND


def test_filetype_outside_grant_refused(tmp_path: Path) -> None:
    f = tmp_path / "x.txt"
    f.write_text("x\n")
    with pytest.raises(ToolError) as exc:
        ft(f, allow=lambda p: p != str(f))
    assert exc.value.code == PERMISSION_DENIED
    assert exc.value.details["reason"] == "no grant covers this path"
    assert ft(f, allow=lambda p: p == str(f))["mime"] == "text/plain"


def test_filetype_path_swapped_while_opening(tmp_path: Path) -> None:
    f = tmp_path / "victim.txt"
    f.write_text("harmless\n")
    other = tmp_path / "other.txt"
    other.write_text("something else\n")
    open_file, _ = openers()

    def swapping_open(path: str) -> int:
        os.replace(other, path)  # a real swap on disk between lstat and open
        return open_file(path)

    with pytest.raises(ToolError) as exc:
        ft(f, open_file=swapping_open)
    assert exc.value.code == PERMISSION_DENIED
    assert exc.value.details["reason"] == "path changed while opening"


def test_filetype_op_handler_and_format(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_bytes(b"a\r\nb\r\n")
    res = op_filetype(files_filetype.parse_args({"path": str(f)}), make_ctx())
    out = files_filetype.format_result(res)
    text = out["content"][0]["text"]
    assert text.startswith(f"{f}: text/plain")
    assert "line endings CRLF" in text
    assert out["structuredContent"] == res


@pytest.mark.parametrize(
    "args",
    [{}, {"path": "x"}, {"path": "/a\0"}, {"path": None}, {"path": "/x", "privileged": 1}, {"path": "/x", "n": 1}, "s"],
)
def test_filetype_invalid_arguments(args: object) -> None:
    with pytest.raises(ToolError) as exc:
        files_filetype.parse_args(args)
    assert exc.value.code == INVALID_ARGUMENT


def test_filetype_schema_closed() -> None:
    assert files_filetype.INPUT_SCHEMA["additionalProperties"] is False
    assert files_filetype.parse_args({"path": "/etc/hosts", "privileged": True}) == {
        "path": "/etc/hosts",
        "privileged": True,
    }


def test_filetype_registered_in_ops_run(tmp_path: Path) -> None:
    from mcpd.core import ops

    os.mkfifo(tmp_path / "p")
    reply = ops.run({"id": 9, "op": "files/filetype", "args": {"path": str(tmp_path / "p")}}, make_ctx())
    assert reply == {"id": 9, "ok": True, "result": {"path": str(tmp_path / "p"), "type": "fifo", "size": 0, "mime": "inode/fifo"}}
    bad = ops.run({"id": 10, "op": "files/filetype", "args": {"path": str(tmp_path / "missing")}}, make_ctx())
    assert bad["ok"] is False and bad["error"]["code"] == FILE_NOT_FOUND


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to nobody")
def test_filetype_in_search_only_directory_as_the_account() -> None:
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="mcpd-ft-"))
    try:
        os.chmod(base, 0o755)
        search_only = base / "home"
        search_only.mkdir(mode=0o711)
        os.chmod(search_only, 0o711)  # like a home directory: enter, but not read
        (search_only / "pub.txt").write_text("hello\n")
        os.symlink("pub.txt", search_only / "ln")
        (base / "closed").mkdir(mode=0o700)
        os.chmod(base / "closed", 0o700)
        (base / "closed" / "x.txt").write_text("x\n")
        code = (
            "import sys, json; sys.path.insert(0, sys.argv[1]);"
            "from fileops import make_ctx; from mcpd.core.fileops.filetype import filetype;"
            "from mcpd.helper.wire.errors import ToolError\n"
            "out = [filetype(sys.argv[2], make_ctx())['mime'], filetype(sys.argv[3], make_ctx())['mime']]\n"
            "try:\n filetype(sys.argv[4], make_ctx()); out.append('read')\n"
            "except ToolError as e:\n out.append(e.code)\n"
            "print(json.dumps(out))"
        )
        out = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c", code,
             SUPPORT_DIR, str(search_only / "pub.txt"), str(search_only / "ln"),
             str(base / "closed" / "x.txt")],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout
        assert json.loads(out) == ["text/plain", "inode/symlink", PERMISSION_DENIED]
    finally:
        shutil.rmtree(base)


def test_filetype_and_read_never_use_the_descriptors_shared_offset(tmp_path: Path) -> None:
    """A privileged read may be handed a descriptor another holder already read (the policy
    process keeps them): the sample and the text come from the file's start whatever the offset."""
    from mcpd.core import ops

    p = tmp_path / "t.txt"
    p.write_text("hello world\n" * 10)
    fd = os.open(p, os.O_RDONLY)
    try:
        os.lseek(fd, 0, os.SEEK_END)

        def shared(path: str) -> int:
            return os.dup(fd)  # the same open file description, its offset at the end

        assert ft(p, open_file=shared)["mime"] == "text/plain"
        reply = ops.run({"id": 1, "op": "files/read", "args": {"path": str(p)}}, make_ctx(open_file=shared))
        assert reply["ok"] and reply["result"]["text"] == "hello world\n" * 10
    finally:
        os.close(fd)
