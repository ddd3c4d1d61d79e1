"""files/list: real directories, real special files, the grant filter."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpd.core.fileops.listing import list_path, op_list
from mcpd.core.tools import files_list
from mcpd.helper.wire.errors import FILE_NOT_FOUND, INVALID_ARGUMENT, PERMISSION_DENIED, ToolError

#: Where the fileops helpers live, for a child that imports them by file name.
SUPPORT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
from tests.support.fileops import make_ctx  # noqa: E402

ROOT = os.geteuid() == 0


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "d"
    d.mkdir()
    (d / "b.txt").write_bytes(b"hello\n")
    (d / ".hidden").write_bytes(b"x")
    (d / "A-upper").write_bytes(b"")
    (d / "sub").mkdir()
    os.mkfifo(d / "fifo")
    os.symlink("b.txt", d / "link")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(d / "sock"))
    try:
        yield d
    finally:
        sock.close()


def by_name(result: dict) -> dict[str, dict]:
    return {e["name"]: e for e in result["entries"]}


def test_list_sorted_by_name_hidden_included(tree: Path) -> None:
    names = [e["name"] for e in list_path(str(tree), make_ctx())["entries"]]
    assert names == [".hidden", "A-upper", "b.txt", "fifo", "link", "sock", "sub"]


def test_list_every_entry_type(tree: Path) -> None:
    entries = by_name(list_path(str(tree), make_ctx()))
    assert {n: e["type"] for n, e in entries.items()} == {
        ".hidden": "file",
        "A-upper": "file",
        "b.txt": "file",
        "fifo": "fifo",
        "link": "symlink",
        "sock": "socket",
        "sub": "dir",
    }
    assert entries["link"]["target"] == "b.txt"
    assert "target" not in entries["b.txt"]


def test_list_char_device_and_dev_dir() -> None:
    one = list_path("/dev/null", make_ctx())
    assert one["kind"] == "entry"
    assert one["entries"][0]["type"] == "char"
    assert one["entries"][0]["permissions"].startswith("c")
    assert by_name(list_path("/dev", make_ctx()))["null"]["type"] == "char"


def test_list_entry_metadata(tree: Path) -> None:
    f = tree / "b.txt"
    os.chmod(f, 0o640)
    os.utime(f, (0, 1_700_000_000))
    e = by_name(list_path(str(tree), make_ctx()))["b.txt"]
    st = f.stat()
    import grp
    import pwd

    assert e["size"] == 6
    assert e["mode"] == "0640"
    assert e["permissions"] == "-rw-r-----"
    assert e["owner"] == pwd.getpwuid(st.st_uid).pw_name
    assert e["group"] == grp.getgrgid(st.st_gid).gr_name
    assert e["mtime"] == "2023-11-14T22:13:20Z"


@pytest.mark.skipif(not ROOT, reason="chown to an unnamed uid needs root")
def test_list_owner_numeric_when_no_name(tree: Path) -> None:
    os.chown(tree / "b.txt", 54321, 54321, follow_symlinks=False)
    e = by_name(list_path(str(tree), make_ctx()))["b.txt"]
    assert (e["owner"], e["group"]) == ("54321", "54321")


def test_list_symlink_not_followed(tree: Path) -> None:
    os.symlink(str(tree / "sub"), tree / "dirlink")
    (tree / "sub" / "inner").write_bytes(b"")
    res = list_path(str(tree / "dirlink"), make_ctx())
    # the unprivileged opener may follow the final link like ls(1) does; either way the link
    # itself is never shown as something else than a link when described alone
    if res["kind"] == "entry":
        assert res["entries"][0]["type"] == "symlink"
        assert res["entries"][0]["target"] == str(tree / "sub")
    else:
        assert [e["name"] for e in res["entries"]] == ["inner"]
    single = list_path(str(tree / "link"), make_ctx())
    assert single["kind"] == "entry"
    assert single["entries"][0]["type"] == "symlink"


def test_list_limit_note(tmp_path: Path) -> None:
    for i in range(25):
        (tmp_path / f"f{i:02d}").write_bytes(b"")
    res = list_path(str(tmp_path), make_ctx(), limit=10)
    assert [e["name"] for e in res["entries"]] == [f"f{i:02d}" for i in range(10)]
    assert res["truncated"] is True and res["total"] == 25
    assert "15 were left out" in res["note"]
    text = files_list.format_result(res)["content"][0]["text"]
    assert "15 were left out" in text
    full = list_path(str(tmp_path), make_ctx(), limit=25)
    assert full["truncated"] is False and full["note"] is None


def test_list_missing_path_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(ToolError) as exc:
        list_path(str(tmp_path / "nope"), make_ctx())
    assert exc.value.code == FILE_NOT_FOUND


def test_list_allow_filter_hides_names_outside_grant(tree: Path) -> None:
    (tree / "secret-plans").write_bytes(b"x")
    granted = {str(tree / n) for n in ("b.txt", "sub", "link")}
    res = list_path(str(tree), make_ctx(allow=lambda p: p in granted))
    assert [e["name"] for e in res["entries"]] == ["b.txt", "link", "sub"]
    assert res["total"] == 3
    dumped = json.dumps(files_list.format_result(res))
    for hidden in ("secret-plans", ".hidden", "fifo", "sock", "A-upper"):
        assert hidden not in dumped


def test_list_single_entry_outside_grant_refused(tree: Path) -> None:
    with pytest.raises(ToolError) as exc:
        list_path(str(tree / "b.txt"), make_ctx(allow=lambda p: False))
    assert exc.value.code == PERMISSION_DENIED
    assert exc.value.details["reason"] == "no grant covers this path"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="mcpd-list-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d)


@pytest.mark.skipif(not ROOT, reason="needs root to switch to nobody")
def test_list_permission_denied_for_the_account(shared_dir: Path) -> None:
    closed = shared_dir / "closed"
    closed.mkdir(mode=0o700)
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1]);"
        "from fileops import make_ctx; from mcpd.core.fileops.listing import list_path;"
        "from mcpd.helper.wire.errors import ToolError\n"
        "try:\n list_path(sys.argv[2], make_ctx()); print('listed')\n"
        "except ToolError as e:\n print(json.dumps(e.to_dict()))\n"
    )
    out = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c", code,
         SUPPORT_DIR, str(closed)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    assert json.loads(out)["code"] == PERMISSION_DENIED


def test_list_op_handler_uses_parsed_args(tree: Path) -> None:
    args = files_list.parse_args({"path": str(tree), "limit": 2})
    res = op_list(args, make_ctx())
    assert len(res["entries"]) == 2 and res["truncated"]


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"path": "relative/x"},
        {"path": "/a\0b"},
        {"path": 7},
        {"path": "/tmp", "limit": 0},
        {"path": "/tmp", "limit": 10001},
        {"path": "/tmp", "limit": True},
        {"path": "/tmp", "limit": "5"},
        {"path": "/tmp", "privileged": "yes"},
        {"path": "/tmp", "extra": 1},
        [],
    ],
)
def test_list_invalid_arguments(args: object) -> None:
    with pytest.raises(ToolError) as exc:
        files_list.parse_args(args)
    assert exc.value.code == INVALID_ARGUMENT


def test_list_parse_args_defaults() -> None:
    assert files_list.parse_args({"path": "/var/log"}) == {"path": "/var/log", "limit": 1000, "privileged": False}
    schema = files_list.INPUT_SCHEMA
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {"path", "limit", "privileged"}


def test_list_format_result_text_and_structured(tree: Path) -> None:
    res = list_path(str(tree), make_ctx())
    out = files_list.format_result(res)
    text = out["content"][0]["text"]
    assert out["structuredContent"] == res
    assert re.search(r"^lrwxrwxrwx .* link -> b\.txt$", text, re.M)
    assert re.search(r"^prw", text, re.M)


def test_list_registered_in_ops_run(tree: Path) -> None:
    from mcpd.core import ops

    reply = ops.run({"id": 3, "op": "files/list", "args": {"path": str(tree), "limit": 1}}, make_ctx())
    assert reply["ok"] is True and reply["id"] == 3
    assert [e["name"] for e in reply["result"]["entries"]] == [".hidden"]
    bad = ops.run({"id": 4, "op": "files/list", "args": {"path": "rel"}}, make_ctx())
    assert bad["ok"] is False and bad["error"]["code"] == INVALID_ARGUMENT
