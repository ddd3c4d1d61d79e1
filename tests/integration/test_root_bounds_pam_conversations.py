"""Root runs at most 12 PAM conversations at once, whichever accounts (docs/PRIVSEP.md section 7).

A compromised policy process may use root's ``pam`` as a password oracle. Root allows one
conversation per account at a time, so one account is guessed no faster than the host's PAM
failure delay (pam_unix: about 2 s) allows, and at most :data:`~mcpd.helper.monitor.PAM_AT_ONCE`
(12) conversations run at once in all: a 13th is refused ``busy`` at once. Without that bound the
policy's 24 channels, each served by a root thread of its own, guessed 24 accounts at once.

Observed, not timed: while the guesses run, the root helper's threads sleeping in PAM's failure
delay (in ``pselect6``, where libpam sleeps) are counted; the highest count seen is the oracle's
width. The accounts are real, with passwords, so each guess is a real pam_unix failure.
"""

from __future__ import annotations

import os
import platform
import select
import threading
from collections.abc import Iterator

import pytest

from mcpd.helper.monitor import PAM_AT_ONCE
from mcpd.helper.wire import frames
from tests.support.osaccounts import AccountFactory
from tests.support.privsep_fixture import PrivsepDaemon, privsep_daemon  # noqa: F401  (fixture)
from tests.support.root_channels import _ids, as_policy
from tests.support.rootonly import root_prerequisite

pytestmark = pytest.mark.root
N = 24  # every channel the policy process has
SYS_PSELECT6 = {"x86_64": 270, "aarch64": 72}.get(platform.machine())


@pytest.fixture
def accounts() -> Iterator[list[str]]:
    factory = AccountFactory()
    try:
        yield [factory.user(password="right-password-1").name for _ in range(N)]
    finally:
        factory.cleanup()


def _sleeping_in_pam(pid: int) -> int:
    """Threads of the root helper (its main thread aside) now in ``pselect6``: libpam's failure
    delay (the channel threads otherwise wait in ``recvmsg``)."""
    count = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall") as f:
                count += int(tid) != pid and f.read().split()[0] == str(SYS_PSELECT6)
        except (OSError, IndexError):
            pass
    return count


def test_root_runs_at_most_12_pam_conversations_at_once(privsep_daemon: PrivsepDaemon,  # noqa: F811
                                                        accounts: list[str]) -> None:
    """Code as ``mcpd-policy`` sends one wrong password for each of 24 accounts, one on each
    channel, at once: at most 12 conversations sleep in PAM's failure delay together, and the
    others are refused ``busy`` without a guess."""
    root_prerequisite(SYS_PSELECT6 is not None, "pselect6's number on this architecture is not known here")
    d = privsep_daemon
    widest, done = 0, threading.Event()

    def watch() -> None:
        nonlocal widest
        while not done.wait(0.02):
            widest = max(widest, _sleeping_in_pam(d.helper_pid))

    watcher = threading.Thread(target=watch)
    with as_policy(d, channels=N) as root:
        channels = [root, *root.others]
        watcher.start()
        try:
            for channel, user in zip(channels, accounts):
                frames.send_frame(channel.sock, {"type": "pam", "id": next(_ids), "user": user, "password": "guess"})
            replies = []
            for channel in channels:
                assert select.select([channel.sock], [], [], 60)[0], "root did not answer a pam request"
                replies.append(frames.recv_frame_fds(channel.sock, 1 << 20, 4)[0])
        finally:
            done.set()
            watcher.join(timeout=10)
    busy = [r for r in replies if r and r.get("ok") is False and r["error"]["details"]["reason"] == "busy"]
    ran = [r for r in replies if r and r.get("ok") is True and r.get("pass") is False]
    assert len(busy) + len(ran) == N, replies
    assert 0 < widest <= PAM_AT_ONCE and busy, \
        f"{widest} PAM conversations slept in their failure delay at once ({len(ran)} guesses, {len(busy)} busy)"
