"""Descriptors the policy process keeps for privileged reads, and the decisions it remembers: a kept
file is served only as it is now (unlinked, renamed, exchanged, mounted over, turned into a FIFO),
only to the principal it was opened for, only while the grant still covers it, and their number
stays bounded.

The policy process keeps the descriptors of privileged reads by path (mcpd/policy/opened.py) and
remembers the decisions of static tokens per loaded grants file (grants.decide). A local user who
can write in the granted folder, or an administrator changing grants or groups, changes things
between two reads of one session: every answer must be what a fresh decision and a fresh open
would give now."""

from __future__ import annotations

import asyncio
import ctypes
import os
import pwd
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcpd.common.config import POLICY_USER
from tests.support.privsep_calls import client, read, read_once, wait_for
from tests.support.privsep_fixture import (  # noqa: F401  (fixture)
    LOG_TEXT,
    SECRET_TEXT,
    PrivsepDaemon,
    children,
    privsep_daemon,
)
from tests.support.root_channels import _grab_fd

pytestmark = pytest.mark.root


def _policy_pid(d: PrivsepDaemon) -> int:
    uid = pwd.getpwnam(POLICY_USER).pw_uid
    (pid,) = children(d.helper_pid, uid)
    return pid


def _regrant(d: PrivsepDaemon, grants: dict[str, Any]) -> None:
    """Write the grants and wait (bounded) until the policy process has loaded them."""
    loaded = len([r for r in d.audit() if r.get("event") == "reload"])
    d.write_grants(grants)
    wait_for(lambda: len([r for r in d.audit() if r.get("event") == "reload"]) > loaded)


def _session(d: PrivsepDaemon, steps: list[tuple[Any, str, str]], principal: str = "alice") -> list[tuple[Any, str]]:
    """In one session, for each ``(change, tool, path)``: run ``change()``, then call ``tool`` on
    ``path`` privileged. Returns ``(text or structuredContent, error reason or code or "")`` each."""

    async def go() -> list[tuple[Any, str]]:
        out = []
        async with client(d, principal) as c:
            for change, tool, path in steps:
                change()
                if tool == "files/read":
                    text, err = await read(c, path, privileged=True)
                    out.append((text, err.get("details", {}).get("reason") or err.get("code", "")))
                else:
                    res = await c.call_tool(tool, {"path": str(path), "privileged": True}, check=False)
                    err = res["structuredContent"].get("error", {}) if res.get("isError") else {}
                    out.append((None if err else res["structuredContent"],
                                err.get("details", {}).get("reason") or err.get("code", "")))
        return out

    return asyncio.run(go())


def test_a_kept_file_unlinked_under_a_deleted_suffix_is_not_served_from_elsewhere(privsep_daemon: PrivsepDaemon) -> None:
    """The kernel names an unlinked file's descriptor ``PATH (deleted)``. A local user who can
    write in the granted folder names a file ``f (deleted)`` and has it read (its descriptor is
    kept under that path), renames it to ``f``, hard-links it to a place outside the grant and
    unlinks ``f``: the kept descriptor's link now reads exactly ``.../f (deleted)`` and its file
    has one hard link again, outside the grant. The next read of ``.../f (deleted)`` must answer
    what is at that path now (another file), never the bytes of the file now outside the grant."""
    d = privsep_daemon
    kept = d.app / "f (deleted)"
    outside = d.srv / "outside-grant"
    outside.mkdir()
    kept.write_text("granted text\n")

    def move_away() -> None:
        os.rename(kept, d.app / "f")
        os.link(d.app / "f", outside / "moved")
        os.unlink(d.app / "f")
        (outside / "moved").write_text(SECRET_TEXT)  # the same inode, now a secret outside the grant
        kept.write_text("the file at the path now\n")

    try:
        answers = _session(d, [(lambda: None, "files/read", str(kept)), (move_away, "files/read", str(kept))])
    finally:
        kept.unlink(missing_ok=True)
        shutil.rmtree(outside, ignore_errors=True)
    assert answers == [("granted text\n", ""), ("the file at the path now\n", "")]


def test_a_grant_removed_or_a_deny_added_between_two_reads_refuses_the_second(privsep_daemon: PrivsepDaemon) -> None:
    """A static token's decision is remembered per loaded grants file and the descriptor is
    kept: a reload that adds a deny, then one that removes the grant, refuses the very next call
    of the same session, for both tools."""
    d = privsep_daemon
    alice = d.accounts["alice"].name
    base = {"allowed": True, "paths": [str(d.app)]}
    _regrant(d, {"users": {alice: {"privileged": {"tools": {"files/read": base, "files/filetype": dict(base)}}}}})
    denied = dict(base, deny=[str(d.log_file)])
    steps = [(lambda: None, "files/read", str(d.log_file)), (lambda: None, "files/filetype", str(d.log_file)),
             (lambda: _regrant(d, {"users": {alice: {"privileged": {"tools": {
                 "files/read": denied, "files/filetype": dict(denied)}}}}}), "files/read", str(d.log_file)),
             (lambda: None, "files/filetype", str(d.log_file)),
             (lambda: _regrant(d, {"users": {alice: {"privileged": {"tools": {
                 "files/read": {"allowed": True, "paths": [str(d.srv / "elsewhere")]}}}}}}), "files/read", str(d.log_file))]
    try:
        answers = _session(d, steps)
    finally:
        _regrant(d, d.default_grants())
    assert answers[0] == (LOG_TEXT, "")
    assert answers[1][1] == "" and answers[1][0]["text"] is True
    assert answers[2:] == [(None, "path is denied by the grant"), (None, "path is denied by the grant"),
                           (None, "no grant covers this path")]


def test_another_principal_never_gets_a_descriptor_kept_for_alice(privsep_daemon: PrivsepDaemon) -> None:
    """alice's read keeps the descriptor; bob (no grant) asking for the same path, or for a
    secret through a path that cleans to one, is refused, and only alice's worker gets it."""
    d = privsep_daemon
    assert read_once(d, d.log_file, privileged=True) == (LOG_TEXT, {})
    for path in (str(d.log_file), f"{d.app}/./log.txt", f"{d.app}//log.txt"):
        text, err = read_once(d, path, privileged=True, principal="bob")
        assert text is None and err["details"]["reason"] == "no grant covers this path", path
    text, err = read_once(d, f"{d.app}/../secret", privileged=True)
    assert text is None and err["details"]["reason"] == "no grant covers this path"
    text, err = read_once(d, d.config_path.parent / "users.yaml", privileged=True)
    assert text is None and err["code"] == "PERMISSION_DENIED"
    assert SECRET_TEXT.strip() not in d.audit_text()


def test_paths_that_clean_to_the_kept_one_read_the_same_file(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    forms = [str(d.log_file), f"{d.app}//log.txt", f"{d.app}/./log.txt", f"{d.app}/x/../log.txt", f"{d.log_file}/"]
    answers = _session(d, [(lambda: None, "files/read", p) for p in forms])
    assert answers == [(LOG_TEXT, "")] * len(forms)


def test_many_granted_paths_keep_the_policy_process_descriptors_bounded(privsep_daemon: PrivsepDaemon) -> None:
    """150 distinct granted files read in one session (the kept descriptors churn, least recently
    used first) while the first one is read again and again: the policy process holds at most a
    bounded number of descriptors, and every answer is the right file."""
    d = privsep_daemon
    churn = d.app / "churn"
    churn.mkdir()
    for i in range(150):
        (churn / f"f{i}").write_text(f"file {i}\n")
    pid = _policy_pid(d)
    before = len(os.listdir(f"/proc/{pid}/fd"))
    steps, expected = [], []
    for i in range(150):
        steps.append((lambda: None, "files/read", str(churn / f"f{i}")))
        expected.append((f"file {i}\n", ""))
        if i % 10 == 0:
            steps.append((lambda: None, "files/read", str(d.log_file)))
            expected.append((LOG_TEXT, ""))
    try:
        answers = _session(d, steps)
        held = len(os.listdir(f"/proc/{pid}/fd"))
    finally:
        shutil.rmtree(churn, ignore_errors=True)
    assert answers == expected
    assert held <= before + 64 + 8, (before, held)


def test_filetype_and_read_after_a_kept_regular_file_became_a_fifo(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    alice = d.accounts["alice"].name
    base = {"allowed": True, "paths": [str(d.app)]}
    _regrant(d, {"users": {alice: {"privileged": {"tools": {"files/read": base, "files/filetype": dict(base)}}}}})
    target = d.app / "became-fifo"
    target.write_text("regular\n")

    def to_fifo() -> None:
        target.unlink()
        os.mkfifo(target, 0o600)

    try:
        answers = _session(d, [(lambda: None, "files/read", str(target)), (lambda: None, "files/filetype", str(target)),
                               (to_fifo, "files/filetype", str(target)), (lambda: None, "files/read", str(target))])
    finally:
        target.unlink(missing_ok=True)
        _regrant(d, d.default_grants())
    assert answers[0] == ("regular\n", "")
    assert (answers[1][0]["type"], answers[1][0]["text"]) == ("file", True)
    assert (answers[2][0]["type"], answers[2][0]["mime"], answers[2][0].get("text")) == ("fifo", "inode/fifo", None)
    assert answers[3] == (None, "NOT_A_REGULAR_FILE")


def test_an_account_removed_from_a_group_loses_the_groups_grant_within_seconds(privsep_daemon: PrivsepDaemon) -> None:
    """A group grant, a read (decision remembered, descriptor kept), then the account leaves the
    group: within a few seconds the same session is refused. (Joining the group takes effect within
    the same few seconds: an earlier test's read may have left the account's old groups cached.)"""
    d = privsep_daemon
    alice = d.accounts["alice"].name
    group = f"mcpdg{os.urandom(3).hex()}"
    subprocess.run(["groupadd", group], check=True, timeout=30)
    subprocess.run(["gpasswd", "-a", alice, group], check=True, timeout=30, capture_output=True)
    try:
        _regrant(d, {"groups": {group: {"privileged": {"tools": {"files/read": {"allowed": True,
                                                                                  "paths": [str(d.app)]}}}}}})

        async def go() -> tuple[Any, list[Any]]:
            async with client(d) as c:
                for _ in range(40):  # the account's groups, as an earlier read saw them, are kept up to 5 s
                    first = await read(c, d.log_file, privileged=True)
                    if first[0] is not None:
                        break
                    await asyncio.sleep(0.25)
                subprocess.run(["gpasswd", "-d", alice, group], check=True, timeout=30, capture_output=True)
                later = []
                for _ in range(40):  # bounded: 40 reads, 0.25 s apart
                    later.append(await read(c, d.log_file, privileged=True))
                    if later[-1][0] is None:
                        break
                    await asyncio.sleep(0.25)
                return first, later

        first, later = asyncio.run(go())
    finally:
        subprocess.run(["groupdel", group], timeout=30, capture_output=True)
        _regrant(d, d.default_grants())
    assert first == (LOG_TEXT, {})
    assert later[-1][0] is None and later[-1][1]["details"]["reason"] == "no grant covers this path"
    assert len(later) <= 30  # GROUPS_SECONDS (5 s) at most, with room for a slow machine


def test_a_compromised_workers_flags_on_its_descriptor_do_not_reach_another_principals_read(
        privsep_daemon: PrivsepDaemon) -> None:
    """alice and bob are both granted the app folder. alice's worker, compromised (a bug in the
    reading core), sets ``O_DIRECT`` on the descriptor of its privileged read (a flag of the open
    file description, not of the descriptor). The test plays it on the very description alice's
    worker was handed (taken from the policy process, which kept it). bob's next read of the same
    path must not be affected by what alice's worker did: each principal's worker is its own."""
    import fcntl

    d = privsep_daemon
    rule = {"allowed": True, "paths": [str(d.app)]}
    _regrant(d, {"users": {d.accounts[p].name: {"privileged": {"tools": {"files/read": dict(rule)}}}
                           for p in ("alice", "bob")}})
    try:
        assert read_once(d, d.log_file, privileged=True) == (LOG_TEXT, {})
        fd = _grab_fd(_policy_pid(d), str(d.log_file))
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)  # what alice's worker can do
        finally:
            os.close(fd)
        assert read_once(d, d.log_file, privileged=True, principal="bob") == (LOG_TEXT, {})
    finally:
        _regrant(d, d.default_grants())


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> None:
    """``renameat2(a, b, RENAME_EXCHANGE)``: both names swap at once (the kernel's atomic swap)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(a))


def test_two_principals_reading_while_folders_and_files_are_exchanged_never_get_the_secret(
        privsep_daemon: PrivsepDaemon) -> None:
    """alice and bob, both granted the app folder, read the same kept path in their own sessions
    while a local user swaps (RENAME_EXCHANGE) the file's folder with one outside the grant whose
    ``f`` is a symlink to the secret, and the file with a sibling. Every answer is one of the two
    granted files or a refusal; the secret never. Bounded in reads and time."""
    from tests.support.privsep_calls import RACE_SECONDS

    d = privsep_daemon
    rule = {"allowed": True, "paths": [str(d.app)]}
    _regrant(d, {"users": {d.accounts[p].name: {"privileged": {"tools": {"files/read": dict(rule)}}}
                           for p in ("alice", "bob")}})
    sub, out = d.app / "xsub", d.srv / "xout"
    sub.mkdir()
    (out / "xsub").mkdir(parents=True)
    (sub / "f").write_text("granted A\n")
    (sub / "g").write_text("granted B\n")
    (out / "xsub" / "f").symlink_to(d.secret)
    stop, swaps = threading.Event(), [0]

    def swapper() -> None:
        while not stop.is_set() and swaps[0] < 200000:
            _exchange(sub, out / "xsub")
            _exchange(sub, out / "xsub")
            _exchange(sub / "f", sub / "g")
            swaps[0] += 1

    seconds = min(RACE_SECONDS, 20.0)

    async def reader(principal: str) -> list[tuple[str | None, str]]:
        got: list[tuple[str | None, str]] = []
        end = time.monotonic() + seconds
        async with client(d, principal) as c:
            while time.monotonic() < end and len(got) < 2000:
                text, err = await read(c, sub / "f", privileged=True)
                got.append((text, err.get("details", {}).get("reason") or err.get("code", "")))
        return got

    async def both() -> list[list[tuple[str | None, str]]]:
        return list(await asyncio.gather(reader("alice"), reader("bob")))

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    try:
        results = asyncio.run(both())
    finally:
        stop.set()
        thread.join(10)
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(sub, ignore_errors=True)
        _regrant(d, d.default_grants())
    answers = [a for r in results for a in r]
    assert swaps[0] > 0 and all(len(r) > 0 for r in results)
    assert {t for t, _ in answers if t is not None} <= {"granted A\n", "granted B\n"}
    assert {why for t, why in answers if t is None} <= {"symlink in path", "path changed while opening",
                                                        "FILE_NOT_FOUND", "file has several hard links"}
    assert any(t is not None for t, _ in answers)
    assert SECRET_TEXT.strip() not in d.audit_text()


def test_a_kept_file_near_path_max_is_read_and_dropped_like_any_other(privsep_daemon: PrivsepDaemon) -> None:
    """A granted file whose path is close to PATH_MAX (4096 bytes) is read twice (kept), then its
    deepest folder is renamed away and back: each answer is what is at the path now."""
    d = privsep_daemon
    folder = d.app / "deep"
    while len(os.fsencode(str(folder))) < 4096 - 250 - 10:
        folder = folder / ("d" * 200)
    folder.mkdir(parents=True)
    target = folder / "f"
    target.write_text("deep\n")
    assert len(os.fsencode(str(target))) > 3800
    moved = folder.with_name("e" * 200)
    steps = [(lambda: None, "files/read", str(target)), (lambda: None, "files/read", str(target)),
             (lambda: os.rename(folder, moved), "files/read", str(target)),
             (lambda: os.rename(moved, folder), "files/read", str(target))]
    try:
        answers = _session(d, steps)
    finally:
        shutil.rmtree(d.app / "deep", ignore_errors=True)
    assert answers == [("deep\n", ""), ("deep\n", ""), (None, "FILE_NOT_FOUND"), ("deep\n", "")]


@pytest.fixture
def mount_point(privsep_daemon: PrivsepDaemon) -> Iterator[Path]:  # noqa: F811
    """A folder in the granted tree for a tmpfs, lazily unmounted (and removed) afterwards."""
    where = privsep_daemon.app / f"mnt-{os.urandom(3).hex()}"
    where.mkdir()
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)
        shutil.rmtree(where, ignore_errors=True)


def test_a_file_system_mounted_over_a_kept_files_folder_is_read_as_it_is_now(
        privsep_daemon: PrivsepDaemon, mount_point: Path) -> None:
    """The administrator mounts a file system over the folder of a kept file: the path now names
    the file on the new file system, and that is what the next read must answer (a fresh open
    would), not the file now hidden under the mount."""
    d, target = privsep_daemon, mount_point / "f"
    target.write_text("under the mount\n")

    def mount() -> None:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount_point)],
                       check=True, timeout=30)
        target.write_text("on the new file system\n")

    answers = _session(d, [(lambda: None, "files/read", str(target)), (mount, "files/read", str(target))])
    assert answers == [("under the mount\n", ""), ("on the new file system\n", "")]


def test_a_file_system_where_a_file_was_read_can_still_be_unmounted(
        privsep_daemon: PrivsepDaemon, mount_point: Path) -> None:
    """A privileged read of a file on a mounted file system, then the administrator unmounts it:
    nothing of mcpd keeps it busy for more than a few seconds once the call is over (the policy
    process closes a kept descriptor not handed out for ``IDLE_SECONDS``; polled for at most
    that + 5 s)."""
    d, target = privsep_daemon, mount_point / "f"
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount_point)],
                   check=True, timeout=30)
    target.write_text("on a removable file system\n")
    assert read_once(d, target, privileged=True) == ("on a removable file system\n", {})
    from mcpd.policy.opened import IDLE_SECONDS

    end = time.monotonic() + IDLE_SECONDS + 5
    while (done := subprocess.run(["umount", str(mount_point)], capture_output=True, text=True,
                                  timeout=30)).returncode != 0 and time.monotonic() < end:
        time.sleep(0.5)
    assert done.returncode == 0, done.stderr
