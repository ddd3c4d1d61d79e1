"""`mcpd dev` dies whole: however it ends (SIGKILL, SIGHUP, its terminal closed, SIGINT or SIGTERM
to it as a background job of a non-interactive shell), every process of its tree ends with it
within seconds (as root: the root helper, its fork server, the policy process, the front and the
workers; not root: the front it is and its workers), checked by pid and by the accounts they ran
as, and the same port and state folder take a new `mcpd dev` at once.

The root variant runs `mcpd dev` as root (the real root helper, real accounts); the unprivileged
variant runs it as an account made for the test when the suite runs as root (so any process of
that account left over is the tree's), else as the test's own account.
"""

from __future__ import annotations

import os
import pwd
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mcpd.common.config import POLICY_USER
from tests.support.devtree import (
    Dev,
    Proc,
    Tree,
    base,  # noqa: F401  (the fixture)
    start,
    stop,
)
from tests.support.net import free_port
from tests.support.osaccounts import AccountFactory


def _signal(sig: int) -> Callable[[Dev], None]:
    def send(dev: Dev) -> None:
        os.kill(dev.pid, sig)
    return send


def _close_terminal(dev: Dev) -> None:
    dev.out.close()  # the pseudo-terminal's master: the kernel hangs up its controlling terminal


#: ending → (how `mcpd dev` is started, how it is ended)
ENDINGS: dict[str, tuple[str, Callable[[Dev], None]]] = {
    "sigkill": ("direct", _signal(signal.SIGKILL)),
    "sighup": ("direct", _signal(signal.SIGHUP)),
    "terminal-closed": ("terminal", _close_terminal),
    "background-sigint": ("background", _signal(signal.SIGINT)),
    "background-sigterm": ("background", _signal(signal.SIGTERM)),
}


@pytest.fixture
def unprivileged(base: Path) -> Iterator[tuple[Path, tuple[int, int, str] | None]]:
    """(a state folder, the account to run `mcpd dev` as): as root a new account and a folder it
    owns; not root, the test's own account (``None``)."""
    if os.geteuid() != 0:
        yield base / "dev-state", None
        return
    factory = AccountFactory()
    try:
        acct = factory.user()
        yield Path(acct.home) / "dev-state", (acct.uid, acct.gid, acct.home)
    finally:
        factory.cleanup()


def _describe(procs: list[Proc]) -> str:
    return "; ".join(f"pid {p.pid} uid {p.uid} sid {p.sid}: {p.cmdline[:120]}" for p in procs)


def _dies_whole(state: Path, how: str, end: Callable[[Dev], None], account: tuple[int, int, str] | None,
                check_tree: Callable[[Dev, Tree], None]) -> int:
    """Start `mcpd dev`, read through it, end it with ``end``, check that its whole tree ends
    and that a new `mcpd dev` starts on the same port and folder; return the first one's exit code."""
    port = free_port()
    dev = start(state, port, how=how, account=account)
    tree: Tree | None = None
    try:
        res = dev.linuxctl("/etc/hosts")  # a worker now runs for the dev principal
        assert res.returncode == 0 and res.stdout == Path("/etc/hosts").read_bytes(), res.stderr
        if account is None and os.geteuid() == 0:  # and a privileged read through the root helper
            from mcpd.admin import devroot

            res = dev.linuxctl("--privileged", str(state / "root-only" / "secret.txt"))
            assert res.returncode == 0 and res.stdout == devroot.SAMPLE_TEXT.encode(), res.stderr
        tree = dev.tree()
        check_tree(dev, tree)

        end(dev)
        code = dev.wait()
        assert code is not None, f"`mcpd dev` ({how}) did not end; read: {''.join(dev.out.lines)}"
        left = tree.wait_gone()
        assert not left, f"left running after `mcpd dev` ended: {_describe(left)}"

        again = start(state, port, account=account)  # the port and the folder are free again
        try:
            res = again.linuxctl("/etc/hosts")
            assert res.returncode == 0 and res.stdout == Path("/etc/hosts").read_bytes(), res.stderr
        finally:
            assert stop(again, signal.SIGTERM) == (0, [])
        return code
    finally:
        if tree is not None:
            tree.kill()
        dev.close()


def _root_tree(dev: Dev, tree: Tree) -> None:
    """As root the tree holds the root helper and its fork server (root), the policy process
    (mcpd-policy), the front (mcpd) and the dev principal's worker (mcpd-dev)."""
    from mcpd.admin import devroot

    uid = {name: pwd.getpwnam(name).pw_uid for name in (devroot.SERVICE_USER, POLICY_USER, devroot.DEV_ACCOUNT)}
    roots = [p for p in tree.by_uid(0) if "mcpd.helper" in p.cmdline]
    assert len(roots) == 2, _describe(tree.procs)  # the helper and its fork server
    for name, n in uid.items():
        assert tree.by_uid(n), f"no {name} process in the tree: {_describe(tree.procs)}"


def _own_tree(dev: Dev, tree: Tree) -> None:
    """Not root: `mcpd dev` is the front, and the dev principal's worker is its child."""
    uid = dev.account if dev.account is not None else os.geteuid()
    assert {p.uid for p in tree.procs} == {uid}, _describe(tree.procs)
    assert [p for p in tree.procs if "mcpd.worker" in p.cmdline], _describe(tree.procs)


@pytest.mark.root
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_dev_as_root_dies_whole(base: Path, ending: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: only root runs the root helper")
    how, end = ENDINGS[ending]
    _dies_whole(base / "dev-state", how, end, None, _root_tree)


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_dev_unprivileged_dies_whole(unprivileged: tuple[Path, tuple[int, int, str] | None], ending: str) -> None:
    state, account = unprivileged
    how, end = ENDINGS[ending]
    _dies_whole(state, how, end, account, _own_tree)


@pytest.mark.root
def test_dev_as_root_a_second_signal_while_it_stops_ends_it_at_once(base: Path) -> None:
    """Ctrl-C starts the orderly stop; a SIGTERM while it runs ends `mcpd dev` at once (exit 143),
    and the kernel ends the rest of the tree."""
    if os.geteuid() != 0:
        pytest.skip("needs root: only root runs the root helper")

    def twice(dev: Dev) -> None:
        os.kill(dev.pid, signal.SIGINT)
        os.kill(dev.pid, signal.SIGTERM)  # the stop takes the front's graceful stop at least

    assert _dies_whole(base / "dev-state", "direct", twice, None, _root_tree) == 128 + signal.SIGTERM

