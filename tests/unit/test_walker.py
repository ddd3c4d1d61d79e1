"""mcpd.walker: the process that runs privileged files/list and files/find (docs/PRIVSEP.md).

Its request handling (:func:`mcpd.walker.main.run`: arguments checked here, the grant filter on
every entry, the fixed deny of the secrets), its one-request protocol on a real socketpair, and
what it may import. Its credentials inside the real daemon are checked in
``tests/integration/test_privsep_boundaries.py``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mcpd.common import frames
from mcpd.common.grantmatch import rules_to_wire
from mcpd.policy.grants import parse_policy
from mcpd.walker import main as walker

ALLOWED = {"mcpd", "mcpd.common", "mcpd.core", "mcpd.core.walk", "mcpd.core.grepwalk", "mcpd.core.grepargs",
           "mcpd.helper", "mcpd.common.grantmatch",
           "mcpd.helper.wire.pathmatch", "mcpd.walker", "mcpd.walker.main"}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    t = tmp_path / "t"
    (t / "pub" / "deep").mkdir(parents=True)
    (t / "pub" / "a.log").write_text("a\n")
    (t / "pub" / "deep" / "b.log").write_text("b\n")
    (t / "denied").mkdir()
    (t / "denied" / "c.log").write_text("c\n")
    (t / "users.yaml").write_text("x\n")
    return t


def request(tree: Path, op: str, args: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """A request frame as the helper sends it: alice may list and find ``tree`` minus ``denied``,
    and ``tree/users.yaml`` is one of the daemon's secrets."""
    rule = {"allowed": True, "paths": [str(tree)], "deny": [str(tree / "denied")]}
    text = yaml.safe_dump({"users": {"alice": {"privileged": {"tools": {"files/list": rule, "files/find": dict(rule)}}}}})
    frame = {"op": op, "args": args, "os_user": "alice", "groups": [], "follow": False, "grants": text,
             "secrets": [str(tree / "users.yaml")]}
    frame.update(kw)
    return walker_frame(frame)


def walker_frame(frame: dict[str, Any]) -> dict[str, Any]:
    """``frame`` with its ``grants`` text turned into the rules the policy process sends."""
    text = frame.pop("grants")
    user, groups = frame.get("os_user", "alice"), set(frame.get("groups", []))
    return {**frame, "rules": rules_to_wire(parse_policy(text), user, groups, frame.get("op", ""))}


def test_list_and_find_show_only_granted_entries_never_secrets(tree: Path) -> None:
    listed = walker.run(request(tree, "files/list", {"path": str(tree), "privileged": True}))
    assert listed["ok"] is True
    assert [e["name"] for e in listed["result"]["entries"]] == ["pub"]  # not denied/, not users.yaml
    found = walker.run(request(tree, "files/find", {"root": str(tree), "name": "*.log", "privileged": True}))
    assert [m["path"] for m in found["result"]["matches"]] == [str(tree / "pub/a.log"), str(tree / "pub/deep/b.log")]
    assert "users.yaml" not in json.dumps(found) and "c.log" not in json.dumps(found)


def test_entries_under_a_reauth_rule_show_to_a_fresh_login_only(tree: Path) -> None:
    """The walker judges ``reauth_after`` as the policy process judged the call: a fresh password
    login sees the entries, a static token (no ``login_time``) or a stale login none."""
    import time

    rule = {"allowed": True, "paths": [str(tree / "pub")], "reauth_after": "5m"}
    text = yaml.safe_dump({"users": {"alice": {"privileged": {"tools": {"files/list": rule}}}}})
    args = {"path": str(tree / "pub")}
    names = {when: [e["name"] for e in walker.run(request(tree, "files/list", args, grants=text, login_time=when))
                    ["result"]["entries"]] for when in (None, time.time() - 600, time.time() - 5)}
    assert list(names.values()) == [[], [], ["a.log", "deep"]]
    zero = yaml.safe_dump({"users": {"alice": {"privileged": {"tools": {"files/list": dict(rule, reauth_after=0)}}}}})
    first = walker.run(request(tree, "files/list", args, grants=zero, login_time=time.time(), login_used=False))
    assert len(first["result"]["entries"]) == 2  # the login's one call
    again = walker.run(request(tree, "files/list", args, grants=zero, login_time=time.time(), login_used=True))
    assert again["result"]["entries"] == []


def test_another_principal_gets_nothing(tree: Path) -> None:
    reply = walker.run(request(tree, "files/find", {"root": str(tree)}, os_user="bob"))
    assert reply["ok"] is True and reply["result"]["matches"] == []


@pytest.mark.parametrize("args", [
    {"path": "/", "limit": 0}, {"path": "/", "limit": "x"}, {"path": "/", "unknown": 1}, {"path": 5},
])
def test_bad_list_arguments_are_invalid_argument(tree: Path, args: dict[str, Any]) -> None:
    reply = walker.run(request(tree, "files/list", args))
    assert reply["ok"] is False and reply["error"]["code"] == "INVALID_ARGUMENT", reply


@pytest.mark.parametrize("args", [
    {"max_results": 0}, {"follow_symlinks": True, "privileged": True}, {"type": "nope"},
    {"time_budget_seconds": 0}, {"time_budget_seconds": 61}, {"name": ""}, {"max_depth": True},
])
def test_bad_find_arguments_are_invalid_argument(tree: Path, args: dict[str, Any]) -> None:
    reply = walker.run(request(tree, "files/find", {"root": str(tree), **args}))
    assert reply["ok"] is False and reply["error"]["code"] == "INVALID_ARGUMENT", reply


def test_privileged_find_never_follows_a_symlink_even_unflagged(tree: Path) -> None:
    """``follow_symlinks`` without ``privileged`` in the args still meets the grant filter's refusal."""
    reply = walker.run(request(tree, "files/find", {"root": str(tree), "follow_symlinks": True}))
    assert reply["ok"] is False and reply["error"]["code"] == "INVALID_ARGUMENT"


def test_a_symlink_on_the_path_is_refused_by_the_opener(tree: Path) -> None:
    os.symlink(tree / "pub", tree / "link")
    reply = walker.run(request(tree, "files/list", {"path": str(tree / "link")}))
    assert reply["error"]["code"] == "PERMISSION_DENIED" and reply["error"]["details"]["reason"] == "symlink in path"


def test_anything_unexpected_is_an_internal_error_reply(tree: Path) -> None:
    for frame in ({"op": "files/read", "args": {}}, {}, request(tree, "files/list", {"path": str(tree)}) | {"rules": [{"subject": "users.alice"}]}):
        reply = walker.run(frame)
        assert reply["ok"] is False and reply["error"]["code"] == "INTERNAL_ERROR", reply


def _spawn() -> tuple[socket.socket, subprocess.Popen[bytes]]:
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-I", "-m", "mcpd.walker", "--fd", str(theirs.fileno())],
                            pass_fds=[theirs.fileno()])
    theirs.close()
    return ours, proc


def test_one_request_one_reply_then_exit(tree: Path) -> None:
    chan, proc = _spawn()
    with chan:
        chan.settimeout(30)
        frames.send_frame(chan, request(tree, "files/list", {"path": str(tree / "pub")}))
        reply = frames.recv_frame(chan, 1 << 20)
        assert reply is not None and reply["ok"] is True
        assert sorted(e["name"] for e in reply["result"]["entries"]) == ["a.log", "deep"]
        assert chan.recv(1) == b""  # nothing more: it exits
    assert proc.wait(30) == 0


@pytest.mark.parametrize("junk", [b"", b"\x00\x00\x00\x05[1,2]", b"\xff\xff\xff\xff"])
def test_no_well_formed_request_exits_1_without_reply(junk: bytes) -> None:
    chan, proc = _spawn()
    with chan:
        chan.sendall(junk)
        chan.shutdown(socket.SHUT_WR)
        chan.settimeout(30)
        assert chan.recv(1) == b""
    assert proc.wait(30) == 1


def test_walker_imports_only_its_allowed_modules() -> None:
    """Common, the wire layer (its opener among it), core.walk, grep's walk and arguments and the
    grant matcher: no reading core, no regex engine, no root code, no PAM."""
    code = "import json, sys; import mcpd.walker.main; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60, check=True)
    mods = json.loads(out.stdout)
    ours = {m for m in mods if m == "mcpd" or m.startswith("mcpd.")}
    shared = {m for m in ours if m.startswith(("mcpd.common.", "mcpd.helper.wire"))}
    assert ours - ALLOWED <= shared, sorted(ours - ALLOWED)
    assert not {m.split(".")[0] for m in mods} & {"pam", "magic", "charset_normalizer", "click", "starlette", "yaml",
                                                        "re2", "zstandard"}


def test_a_confined_walker_lists_folders_but_opens_no_file(tree: Path) -> None:
    """After :func:`mcpd.walker.main.metadata_only` (Landlock), a process still lists and lstat()s,
    but reading, writing or creating a file, even one it owns, and running a program are refused."""
    probe = r"""
import json, os, subprocess, sys
from mcpd.walker.main import metadata_only
tree = sys.argv[1]
def attempt(fn):
    try:
        fn()
        return "done"
    except OSError as exc:
        return exc.__class__.__name__
before = attempt(lambda: open(os.path.join(tree, "pub", "a.log")).read())
confined = metadata_only()
print(json.dumps({"before": before, "confined": confined,
    "list": sorted(os.listdir(os.path.join(tree, "pub"))),
    "lstat": os.lstat(os.path.join(tree, "pub", "a.log")).st_size,
    "read": attempt(lambda: open(os.path.join(tree, "pub", "a.log")).read()),
    "write": attempt(lambda: open(os.path.join(tree, "pub", "a.log"), "a").write("x")),
    "create": attempt(lambda: open(os.path.join(tree, "new"), "x").close()),
    "exec": attempt(lambda: subprocess.run(["/bin/true"], check=False))}))
"""
    out = subprocess.run([sys.executable, "-I", "-c", probe, str(tree)], capture_output=True, text=True,
                         timeout=60, check=True)
    got = json.loads(out.stdout)
    if not got["confined"]:
        pytest.skip("this kernel has no Landlock (or refuses it): the walker relies on its uid and capability")
    assert got["before"] == "done" and got["list"] == ["a.log", "deep"] and got["lstat"] == 2
    assert {k: got[k] for k in ("read", "write", "create", "exec")} == {
        "read": "PermissionError", "write": "PermissionError", "create": "PermissionError", "exec": "PermissionError"}
    assert (tree / "pub" / "a.log").read_text() == "a\n" and not (tree / "new").exists()
