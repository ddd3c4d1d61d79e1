"""The policy process's login state (docs/REFERENCE.md §5.2, §5.3; mcpd/policy/login.py), as root in a real folder.

Token store: one root 0600 file per token, the per-account cap, revocation, the ``reauth_after:
0`` compare-and-set raced by threads, symlinks and foreign files refused. Lockout: counted before
PAM (refusals before PAM are enough to show it, so no password is needed here), one attempt in
flight per account, the address delay that grows but never locks, persistence in ``lockout.json``
across instances and ``unlock``. PAM itself is exercised in tests/integration/test_pam_login.py.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpd.common.audit.writer import AuditLog
from mcpd.common.config import Login as LoginConfig
from mcpd.common.folders import safe_folder as root_folder
from mcpd.helper.pam import pam_check
from mcpd.policy import login as login_module
from mcpd.policy.login import LOCKOUT_FILE, Login, Store, unlock
from tests.support.osaccounts import AccountFactory, os_accounts  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the state folder's owner is checked as root")

CFG = LoginConfig(answer_seconds=0.0, max_failures=3, lockout_seconds=60, free_failures=1, base_delay_seconds=0.5,
                  max_delay_seconds=2.0, in_flight_per_address=2)


def in_process_pam(cfg: LoginConfig) -> functools.partial[tuple[bool, int, str]]:
    """PAM run in this (root) test process, as root's helper runs it for the policy process."""
    return functools.partial(pam_check, cfg.pam_service)


@pytest.fixture()
def folder(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    path = tmp_path / "helper"
    fd = root_folder(str(path))
    yield path, fd
    os.close(fd)


@pytest.fixture()
def audit(tmp_path: Path) -> Iterator[AuditLog]:
    with AuditLog(str(tmp_path / "audit" / "audit.jsonl"), syslog=False) as log:
        yield log


def records(log: AuditLog) -> list[dict[str, object]]:
    return [json.loads(line) for line in Path(log.path).read_text().splitlines()]


def test_one_root_0600_file_per_token_holding_no_secret(folder: tuple[Path, int]) -> None:
    path, fd = folder
    store = Store(fd)
    token, rec, evicted = store.issue("alice", 60, "127.0.0.1")
    assert evicted == 0 and store.verify(token) == rec
    st = os.stat(path / f"token.{rec.id}")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)
    assert token.split("_", 2)[2] not in (path / f"token.{rec.id}").read_text()
    assert store.verify(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    assert store.revoke(rec.id) and store.verify(token) is None and not store.revoke(rec.id)


def test_cap_evicts_the_oldest_tokens_of_that_account_only(folder: tuple[Path, int]) -> None:
    _, fd = folder
    store = Store(fd, cap=3)
    bob, _, _ = store.issue("bob", 60, "x")
    alice = [store.issue("alice", 60, "x")[0] for _ in range(5)]
    assert [store.verify(t) is not None for t in alice] == [False, False, True, True, True]
    assert store.verify(bob) is not None
    assert len(store.records()) == 4 and store.revoke_user("alice") == 3 and len(store.records()) == 1


def test_expired_tokens_fail_and_are_swept(folder: tuple[Path, int]) -> None:
    path, fd = folder
    store = Store(fd)
    token, rec, _ = store.issue("alice", -1, "x")
    assert store.verify(token) is None
    assert store.records() == [] and not (path / f"token.{rec.id}").exists()


def test_reauth_zero_compare_and_set_admits_exactly_one_of_twenty_threads(folder: tuple[Path, int]) -> None:
    _, fd = folder
    store = Store(fd)
    _, rec, _ = store.issue("alice", 60, "x")
    start = threading.Barrier(20)
    wins: list[bool] = []

    def go() -> None:
        start.wait()
        wins.append(store.claim(rec.id))

    threads = [threading.Thread(target=go) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(wins) == [False] * 19 + [True] and store.used(rec.id)


def test_symlinked_or_foreign_token_files_authenticate_nobody(folder: tuple[Path, int], tmp_path: Path) -> None:
    path, fd = folder
    store = Store(fd)
    token, rec, _ = store.issue("alice", 60, "x")
    record = path / f"token.{rec.id}"
    elsewhere = tmp_path / "elsewhere"
    os.replace(record, elsewhere)
    os.symlink(elsewhere, record)
    assert store.verify(token) is None
    os.unlink(record)
    os.replace(elsewhere, record)
    os.chown(record, 65534, 65534)
    assert store.verify(token) is None
    os.chown(record, 0, 0)
    os.chmod(record, 0o644)
    assert store.verify(token) is None
    os.chmod(record, 0o600)
    assert store.verify(token) == rec


def test_failures_lock_the_account_persist_and_unlock_clears(folder: tuple[Path, int], audit: AuditLog) -> None:
    """root is refused before PAM and counts: after max_failures it is locked, in lockout.json."""
    path, fd = folder
    login = Login(CFG, Store(fd), audit, lambda: set(), pam=in_process_pam(CFG))
    for i in range(CFG.max_failures + 1):
        assert login.login("root", "whatever", f"10.0.0.{i}") is None
    reasons = [r["reason"] for r in records(audit)]
    assert reasons[0] == "root may not log in; use grants" and reasons[-1] == "locked out after repeated failures"
    again = Login(CFG, Store(fd), audit, lambda: set(), pam=in_process_pam(CFG))  # a restarted helper reads the same file
    assert again._take_slot("root", "10.0.1.1", True)[0] == "locked out after repeated failures"
    st = os.stat(path / LOCKOUT_FILE)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)
    assert unlock(fd, "root") and not unlock(fd, "root")
    assert again._take_slot("root", "10.0.1.2", True)[0] is None


def test_unknown_names_count_on_the_address_only(folder: tuple[Path, int], audit: AuditLog) -> None:
    path, fd = folder
    login = Login(CFG, Store(fd), audit, lambda: set(), pam=in_process_pam(CFG))
    assert login.login("nosuchuser-x", "pw", "10.0.0.9") is None
    table = json.loads((path / LOCKOUT_FILE).read_text())
    assert list(table) == ["peer:10.0.0.9"] and records(audit)[-1]["reason"] == "unknown account"
    assert (login._accounts.total, login._peers.total) == (0, 0)  # its slot is given back


def test_one_attempt_in_flight_per_account_and_a_few_per_address(folder: tuple[Path, int], audit: AuditLog) -> None:
    _, fd = folder
    login = Login(dataclasses.replace(CFG, max_failures=50), Store(fd), audit, lambda: set(), pam=in_process_pam(CFG))
    assert login._take_slot("alice", "10.0.0.1", True)[0] is None
    assert login._take_slot("alice", "10.0.0.2", True)[0] == "another attempt for this account is in flight"
    assert login._take_slot("bob", "10.0.0.1", True)[0] is None
    assert login._take_slot("carol", "10.0.0.1", True)[0] == "too many attempts in flight from this address"
    login._release("alice", "10.0.0.1", False)
    assert login._take_slot("alice", "10.0.0.3", True)[0] is None


def test_an_address_is_slowed_with_a_growing_delay_but_never_locked(folder: tuple[Path, int], audit: AuditLog) -> None:
    path, fd = folder
    login = Login(dataclasses.replace(CFG, max_failures=1000), Store(fd), audit, lambda: set(), pam=in_process_pam(CFG))
    delays = []
    for i in range(10):
        why, delay = login._take_slot(f"user{i}", "192.0.2.1", False)
        login._release(f"user{i}", "192.0.2.1", False)
        assert why is None
        delays.append(delay)
    assert delays == [0, 0, 0, 0, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0]  # free: 4 * free_failures
    assert json.loads((path / LOCKOUT_FILE).read_text())["peer:192.0.2.1"][2] == 0  # never a lock


def test_pam_timeout_cancels_queued_calls_and_gives_back_the_slots(
        folder: tuple[Path, int], audit: AuditLog, tmp_path: Path, os_accounts: AccountFactory,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A PAM service that hangs (pam_exec sleeping 3 s), a pool of two, four enrolled accounts at
    once, the wait set to 0.5 s. All four fail at the wait, only the two in the pool ever reached
    PAM (the two queued calls were cancelled), and every slot is free again."""
    _, fd = folder
    ran = tmp_path / "ran"
    script = tmp_path / "hang.sh"
    script.write_text(f"#!/bin/sh\necho \"$PAM_USER\" >> {ran}\nsleep 3\n")
    script.chmod(0o700)
    service = f"mcpd-test-hang-{secrets.token_hex(3)}"
    pamd = Path("/etc/pam.d") / service
    pamd.write_text(f"auth required pam_exec.so quiet {script}\naccount required pam_permit.so\n")
    monkeypatch.setattr(login_module, "PAM_TIMEOUT_SECONDS", 0.5)
    monkeypatch.setattr(login_module, "PAM_WORKERS", 2)
    users = [os_accounts.user().name for _ in range(login_module.PAM_WORKERS + 2)]
    login = Login(dataclasses.replace(CFG, pam_service=service), Store(fd), audit, lambda: set(users),
                  pam=functools.partial(pam_check, service))
    try:
        threads = [threading.Thread(target=login.login, args=(u, "pw", f"10.1.0.{i}")) for i, u in enumerate(users)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert (login._accounts.total, login._peers.total) == (0, 0)
        assert [r["reason"] for r in records(audit)] == ["pam: PAM did not answer in time"] * len(users)
        time.sleep(3.5)  # the four hung calls end
        assert len(ran.read_text().split()) == login_module.PAM_WORKERS
    finally:
        login.close()
        pamd.unlink()


def test_state_folder_must_be_roots_own_without_symlinks(tmp_path: Path) -> None:
    """The folder that holds tokens and lockout: a symlink at any level, a folder others may write
    above it, or a folder not 0700 is refused, so the service user can never swap it."""
    real = tmp_path / "real"
    os.close(root_folder(str(real)))
    os.symlink(real, tmp_path / "link")
    with pytest.raises(OSError):
        root_folder(str(tmp_path / "link"))
    os.chmod(real, 0o750)
    with pytest.raises(OSError, match="0700"):
        root_folder(str(real))
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    os.chmod(open_parent, 0o777)
    with pytest.raises(OSError, match="not writable"):
        root_folder(str(open_parent / "helper"))


def test_a_login_token_is_live_by_id_until_revoked_or_expired(folder: tuple[Path, int]) -> None:
    """What ends a login's workers (the policy process's sweep) asks by token id."""
    _, fd = folder
    store = Store(fd)
    _, rec, _ = store.issue("alice", 3600, "127.0.0.1")
    _, old, _ = store.issue("alice", -1, "127.0.0.1")
    assert store.live(rec.id) == rec
    assert store.live(old.id) is None  # expired
    assert store.live("../token." + rec.id) is None and store.live("") is None  # never a path
    store.revoke(rec.id)
    assert store.live(rec.id) is None
