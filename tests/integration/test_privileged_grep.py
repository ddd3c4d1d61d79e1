"""Privileged files/grep through the real privilege-separated daemon (docs/REFERENCE.md §4.1): a
walker plans the tree, the policy process judges each file against the grant, root opens it, the
caller's worker (its own account) searches it. It finds what the account cannot read; what the
grant does not cover is counted, never named nor searched; a symlink or a hard link the caller's
account plants in the tree leads nowhere; one audit record per call says what was opened."""

from __future__ import annotations

import asyncio
import gzip
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.privsep_fixture import SECRET_TEXT, PrivsepDaemon, privsep_daemon  # noqa: F401

pytestmark = pytest.mark.root

NEEDLE = "needle"


def grep(d: PrivsepDaemon, who: str = "alice", **args: Any) -> dict[str, Any]:
    from mcpd.client.api import Client

    async def go() -> Any:
        async with Client(d.url, d.tokens[who], d.cacert, timeout=60) as c:
            return await c.call_tool("files/grep", args, check=False)

    out = asyncio.run(go())
    return {**out["structuredContent"], "_text": out["content"][0]["text"]}


@pytest.fixture(scope="module")
def tree(privsep_daemon: PrivsepDaemon) -> Iterator[PrivsepDaemon]:  # noqa: F811
    """``app/g``, root-only: two files holding the needle (one gzip), one denied file and a denied
    folder holding it too, and ``drop/``, a folder of alice's own account where it planted a
    symlink to ``/etc/shadow`` and a hard link to ``secret`` (a root-only file outside the grant).
    alice may grep ``app`` but not ``g/denied.log`` nor ``g/private``."""
    d = privsep_daemon
    g = d.app / "g"
    (g / "private").mkdir(parents=True)
    (g / "notes.txt").write_text(f"a {NEEDLE} in a root-only file\n")
    (g / "rot.log.gz").write_bytes(gzip.compress(f"old\nrotated {NEEDLE}\n".encode()))
    (g / "denied.log").write_text(f"{NEEDLE} DENIED-CONTENT\n")
    (g / "private" / "key.txt").write_text(f"{NEEDLE} PRIVATE-CONTENT\n")
    for p in [g, *g.rglob("*")]:
        os.chmod(p, 0o700 if p.is_dir() else 0o600)
    drop, uid = g / "drop", d.accounts["alice"].uid
    drop.mkdir(mode=0o755)
    os.chown(drop, uid, uid)
    os.symlink("/etc/shadow", drop / "shadow.txt")
    os.lchown(drop / "shadow.txt", uid, uid)
    os.link(d.secret, drop / "hard.txt")
    os.mkfifo(g / "pipe.log", 0o600)  # a FIFO with no writer: opening it for reading would block
    rule = {"allowed": True, "paths": [str(d.app)], "deny": [str(g / "private"), str(g / "denied.log")]}
    d.write_grants({"users": {d.accounts["alice"].name: {"privileged": {"tools": {"files/grep": rule}}}}})
    deadline = time.monotonic() + 20
    while "error" in grep(d, pattern="x", path=str(d.log_file), privileged=True) and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        yield d
    finally:
        shutil.rmtree(g)
        d.write_grants(d.default_grants())


def test_it_finds_matches_in_root_only_files_the_account_cannot_read(tree: PrivsepDaemon) -> None:
    d, g = tree, tree.app / "g"
    out = grep(d, pattern=NEEDLE, path=str(g), privileged=True)
    assert [(m["path"], m["line"]) for m in out["matches"]] == [(str(g / "notes.txt"), 1), (str(g / "rot.log.gz"), 2)]
    assert out["files_searched"] == 2 and out["truncated"] is False
    assert {"path": str(g / "pipe.log"), "reason": "not_regular"} in out["skipped"]  # never opened
    ordinary = grep(d, pattern=NEEDLE, path=str(g))
    assert ordinary["error"]["code"] == "PERMISSION_DENIED"  # the kernel's answer: app is 0700 root
    alone = grep(d, pattern="line 2", path=str(d.log_file), privileged=True)
    assert [(m["line"], m["text"]) for m in alone["matches"]] == [(2, "app log line 2")]


def test_files_the_grant_does_not_cover_are_counted_never_named_nor_searched(tree: PrivsepDaemon) -> None:
    d, g = tree, tree.app / "g"
    out = grep(d, pattern=NEEDLE, path=str(g), privileged=True)
    assert out["files_skipped"]["not_granted"] == 1  # denied.log; the denied folder is not entered
    assert "not covered by your grant for files/grep" in out["_text"]
    dump = repr(out)
    assert "DENIED-CONTENT" not in dump and "PRIVATE-CONTENT" not in dump
    assert "denied.log" not in dump and "private" not in dump  # not even the names
    for denied in (g / "denied.log", g / "private", g / "private" / "key.txt"):
        alone = grep(d, pattern=NEEDLE, path=str(denied), privileged=True)
        assert alone["error"]["code"] == "PERMISSION_DENIED"
        assert alone["error"]["details"]["reason"] == "path is denied by the grant"


def test_a_symlink_or_hard_link_the_account_planted_is_not_followed(tree: PrivsepDaemon) -> None:
    """``drop/shadow.txt`` (alice's symlink to /etc/shadow) and ``drop/hard.txt`` (a second link to
    a root-only file outside the grant) are skipped; nothing of either file is answered."""
    d, drop = tree, tree.app / "g" / "drop"
    out = grep(d, pattern="root", path=str(drop), privileged=True)
    assert out["matches"] == [] and out["files_searched"] == 0
    assert {"path": str(drop / "shadow.txt"), "reason": "symlink"} in out["skipped"]
    assert {"path": str(drop / "hard.txt"), "reason": "refused_at_open"} in out["skipped"]
    assert SECRET_TEXT.strip() not in repr(out) and "root:" not in repr(out)
    for planted in ("shadow.txt", "hard.txt"):
        alone = grep(d, pattern="root", path=str(drop / planted), privileged=True)
        assert alone["error"]["code"] == "PERMISSION_DENIED", alone


def test_one_audit_record_names_what_was_opened(tree: PrivsepDaemon) -> None:
    d, g = tree, tree.app / "g"
    before = len(d.audit())
    grep(d, pattern=NEEDLE, path=str(g), privileged=True)
    time.sleep(0.2)
    recs = [r for r in d.audit()[before:] if r.get("tool") == "files/grep"]
    assert len(recs) == 1, recs
    rec = recs[0]
    assert rec["decision"] == "accept" and rec["route"] == "privileged" and rec["requested_path"] == str(g)
    assert rec["files_opened"] == 2 and rec["not_granted"] == 1 and rec["bytes"] == 2
    assert "pattern_sha256" in rec and NEEDLE not in repr(rec)


def test_without_a_grant_it_is_refused_as_privileged_find_is(tree: PrivsepDaemon) -> None:
    d = tree
    before = len(d.audit())
    bob = grep(d, "bob", pattern=NEEDLE, path=str(d.app), privileged=True)
    assert bob["error"]["code"] == "PERMISSION_DENIED"
    assert bob["error"]["details"]["reason"] == "no grant covers this path"
    above = grep(d, pattern="root", path=str(d.srv), privileged=True)  # the grant is below it
    assert above["error"]["details"]["reason"] == "no grant covers this path"
    assert SECRET_TEXT.strip() not in repr(above)
    time.sleep(0.2)
    recs = [r for r in d.audit()[before:] if r.get("tool") == "files/grep"]
    assert [r["decision"] for r in recs] == ["reject", "reject"]


def test_limits_and_the_cursor_work_as_on_the_ordinary_route(tree: PrivsepDaemon) -> None:
    d, g = tree, tree.app / "g"
    first = grep(d, pattern=NEEDLE, path=str(g), privileged=True, max_matches=1)
    assert [m["path"] for m in first["matches"]] == [str(g / "notes.txt")]
    assert first["stopped"] == "max_matches" and first["next_cursor"]
    rest = grep(d, pattern=NEEDLE, path=str(g), privileged=True, max_matches=1, cursor=first["next_cursor"])
    assert [m["path"] for m in rest["matches"]] == [str(g / "rot.log.gz")]
    other = grep(d, pattern=NEEDLE, path=str(g), cursor=first["next_cursor"])  # bound to the privileged route
    assert other["error"]["code"] == "INVALID_ARGUMENT"
    tiny = grep(d, pattern=NEEDLE, path=str(g), privileged=True, max_file_bytes=8)
    assert tiny["files_skipped"].get("too_large") == 2 and tiny["matches"] == []  # the gzip too: 19 bytes of text
    follow = grep(d, pattern=NEEDLE, path=str(g), privileged=True, follow_symlinks=True)
    assert follow["error"]["code"] == "INVALID_ARGUMENT"


@pytest.fixture
def big(tree: PrivsepDaemon) -> Iterator[PrivsepDaemon]:
    """``app/big``: 30 root-only folders of 100 files, each holding the needle once."""
    big = tree.app / "big"
    for i in range(30):
        sub = big / f"d{i:02d}"
        sub.mkdir(parents=True, mode=0o700)
        for j in range(100):
            (sub / f"f{j:03d}.txt").write_text(f"line\n{NEEDLE} {i} {j}\n")
            os.chmod(sub / f"f{j:03d}.txt", 0o600)
    os.chmod(big, 0o700)
    try:
        yield tree
    finally:
        shutil.rmtree(big)


def test_the_time_budget_stops_it_and_the_cursor_goes_on_without_repeats(big: PrivsepDaemon) -> None:
    d, root = big, big.app / "big"
    first = grep(d, pattern=NEEDLE, path=str(root), privileged=True, time_budget_seconds=0.3, max_matches=1000)
    assert first["stopped"] == "time_budget" and first["next_cursor"], {k: first[k] for k in ("stopped",
                                                                                            "files_searched")}
    seen = [(m["path"], m["line"]) for m in first["matches"]]
    cursor = first["next_cursor"]
    for _ in range(200):
        page = grep(d, pattern=NEEDLE, path=str(root), privileged=True, time_budget_seconds=5, max_matches=1000,
                    cursor=cursor)
        seen += [(m["path"], m["line"]) for m in page["matches"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 3000  # every file once, in the walk's order
    assert seen == sorted(seen)


def test_a_worker_killed_mid_search_stops_the_call_its_walker_and_root_opens(big: PrivsepDaemon) -> None:
    """Cancelling a call ends its worker (docs/REFERENCE.md §2.3); here the worker is killed in
    the middle of a long privileged search: the call fails at once, its walker is gone, nothing
    more is opened for it (its audit record counts what was), and the next call is served."""
    d, root = big, big.app / "big"
    before = len(d.audit())
    replies: list[dict[str, Any]] = []
    caller = threading.Thread(target=lambda: replies.append(
        grep(d, pattern="nomatch", path=str(root), privileged=True, time_budget_seconds=30)))
    caller.start()
    deadline, killed = time.monotonic() + 20, 0
    while not killed and caller.is_alive() and time.monotonic() < deadline:
        if d.walkers():  # the search is under way: its worker holds a batch
            for pid in d.workers("alice"):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.01)
    caller.join(60)
    assert killed and replies and replies[0]["error"]["code"] in ("INTERNAL_ERROR", "HELPER_UNAVAILABLE"), replies
    time.sleep(1.0)  # the fork server reaps within its tick
    assert d.walkers() == []
    rec = [r for r in d.audit()[before:] if r.get("tool") == "files/grep"][-1]
    assert rec["decision"] == "accept" and rec["outcome"] == "INTERNAL_ERROR" and rec["files_opened"] < 3000
    again = grep(d, pattern=f"{NEEDLE} 0 0$", path=str(root), privileged=True)
    assert [m["path"] for m in again["matches"]] == [str(root / "d00" / "f000.txt")]


def test_a_file_swapped_for_a_symlink_while_searched_never_leaks_its_target(tree: PrivsepDaemon) -> None:
    """The account swaps ``drop/swap.txt`` between a plain file and a symlink to ``/etc/shadow``
    as fast as it can while privileged greps run: whichever the walker listed, root opens no
    symlink, and nothing of /etc/shadow is ever answered."""
    d, drop = tree, tree.app / "g" / "drop"
    uid = d.accounts["alice"].uid
    stop = threading.Event()

    def swap() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            tmp = drop / f".swap{n % 2}"
            if n % 2:
                os.symlink("/etc/shadow", tmp)
                os.lchown(tmp, uid, uid)
            else:
                tmp.write_text("a plain line\n")
                os.chown(tmp, uid, uid)
            os.replace(tmp, drop / "swap.txt")

    swapper = threading.Thread(target=swap)
    swapper.start()
    answers = []
    try:
        for _ in range(15):
            answers.append(grep(d, pattern="root|plain", path=str(drop), privileged=True))
    finally:
        stop.set()
        swapper.join(10)
        (drop / "swap.txt").unlink(missing_ok=True)
    assert all("error" not in a for a in answers), answers
    reasons = [s["reason"] for a in answers for s in a["skipped"] if s["path"].endswith("swap.txt")]
    print(f"swap.txt: searched {sum(a['files_matched'] for a in answers)} times, skipped for {sorted(set(reasons))}")
    texts = [m["text"] for a in answers for m in a["matches"]]
    assert set(texts) <= {"a plain line"}, texts  # the plain file's line, or nothing: never shadow's
    assert not any("root:" in repr(a) or SECRET_TEXT.strip() in repr(a) for a in answers)


def test_linuxctl_grep_privileged_prints_like_grep(tree: PrivsepDaemon) -> None:
    from tests.support.linuxctl import flags, linuxctl

    d, g = tree, tree.app / "g"
    out = linuxctl(*flags(d, d.tokens["alice"]), "grep", "-r", "--privileged", NEEDLE, str(g))
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().splitlines() == [f"{g}/notes.txt:1:a {NEEDLE} in a root-only file",
                                                f"{g}/rot.log.gz:2:rotated {NEEDLE}"]
    assert "1 not_granted" in out.stderr.decode() and "DENIED" not in out.stderr.decode()
    ordinary = linuxctl(*flags(d, d.tokens["alice"]), "grep", "-r", NEEDLE, str(g))
    assert ordinary.returncode == 2 and b"PERMISSION_DENIED" in ordinary.stderr
