"""Privilege separation end to end, through the real daemon over TLS (docs/REFERENCE.md §4, §5.1;
docs/PRIVSEP.md). Root only: the helper runs as root, the front as ``mcpd``, workers as accounts.

The fixture (:mod:`tests.support.privsep_fixture`) describes the principals and the tree.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import queue
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mcpd.client.api import ConnectError
from mcpd.common.config import POLICY_USER
from tests.support.privsep_calls import RACE_SECONDS, client, read, read_once, uid_pids, wait_for
from tests.support.privsep_fixture import (  # noqa: F401  (fixture)
    LOG_TEXT,
    SECRET_TEXT,
    PrivsepDaemon,
    children,
    privsep_daemon,
    proc_status,
)

pytestmark = pytest.mark.root
RACE_SESSIONS = 4
NO_GRANT = "no grant covers this path"


# ------------------------------------------------------------------ docs/REFERENCE.md §5.1: the kernel decides


def test_unprivileged_read_of_root_only_file_is_denied_by_the_kernel(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    text, err = read_once(d, d.log_file)
    assert text is None and err["code"] == "PERMISSION_DENIED"
    alice = d.accounts["alice"]
    workers = d.workers("alice")
    assert workers, "the worker must be a child of the helper running as the account"
    expected_groups = set(os.getgrouplist(alice.name, alice.gid))  # initgroups: the primary group too
    for pid in workers:
        st = proc_status(pid)
        assert st["Uid"].split() == [str(alice.uid)] * 4
        assert st["Gid"].split() == [str(alice.gid)] * 4
        assert {int(g) for g in st["Groups"].split()} == expected_groups
        assert int(st["CapEff"], 16) == 0 and int(st["CapPrm"], 16) == 0
    front = proc_status(d.front_pid)
    assert front["Uid"].split() == [str(d.service.pw_uid)] * 4
    assert front["Groups"] == "" and int(front["CapEff"], 16) == 0


def test_account_bound_to_root_gets_no_worker(privsep_daemon: PrivsepDaemon) -> None:
    text, err = read_once(privsep_daemon, "/etc/hostname", principal="rooty")
    assert text is None and err["code"] == "PERMISSION_DENIED"
    assert err["details"].get("reason") == "root account"


# ------------------------------------------------------------------ docs/REFERENCE.md §4.1, §4.5: grants and audit


def test_privileged_read_without_grant_is_denied_and_audited(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    text, err = read_once(d, d.log_file, privileged=True, principal="bob")
    assert text is None and err["code"] == "PERMISSION_DENIED"
    assert err["details"]["reason"] == NO_GRANT
    rec = [r for r in d.audit() if r["event"] == "reject" and r.get("user") == "bob"][-1]
    assert rec["reason"] == NO_GRANT and rec["decision"] == "reject"
    assert rec["requested_path"] == str(d.log_file) and rec["tool"] == "files/read"


def test_privileged_read_with_grant_returns_content_and_audits_accept(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    text, err = read_once(d, d.log_file, privileged=True)
    assert err == {} and text == LOG_TEXT
    rec = [r for r in d.audit() if r["event"] == "accept" and r.get("user") == "alice"][-1]
    assert rec["decision"] == "accept" and rec["tool"] == "files/read"
    assert re.fullmatch(r"[0-9a-f]{32}", rec["session"])
    assert rec["requested_path"] == rec["resolved_path"] == str(d.log_file)
    assert str(d.app) in rec["grant"] and rec["bytes"] == len(LOG_TEXT.encode())
    assert rec["os_user"] == d.accounts["alice"].name and rec["peer"].startswith("127.0.0.1:")
    log = d.audit_text()
    for token in d.tokens.values():
        assert token not in log
    assert LOG_TEXT.splitlines()[0] not in log


def test_grant_covers_components_and_judges_the_cleaned_path(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    for path in (f"{d.app}-evil/x", f"{d.app}/../secret"):
        text, err = read_once(d, path, privileged=True)
        assert text is None and err["code"] == "PERMISSION_DENIED", path
        assert err["details"]["reason"] == NO_GRANT
    rec = [r for r in d.audit() if r.get("requested_path") == f"{d.app}/../secret"][-1]
    assert rec["resolved_path"] == str(d.secret)


def test_symlink_and_hard_link_inside_the_grant_are_refused(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    link, hard, dirlink = d.app / "link", d.app / "hard", d.app / "up"
    os.symlink(d.secret, link)
    os.link(d.secret, hard)
    os.symlink(d.srv, dirlink)
    try:
        cases = {link: "symlink in path", hard: "file has several hard links", dirlink / "secret": "symlink in path"}
        for path, reason in cases.items():
            text, err = read_once(d, path, privileged=True)
            assert text is None and err["code"] == "PERMISSION_DENIED", path
            assert err["details"]["reason"] == reason, path
    finally:
        for p in (link, hard, dirlink):
            p.unlink()
    assert SECRET_TEXT.strip() not in d.audit_text()


def _swap(target: Path, secret: Path, stop: threading.Event, counter: list[int]) -> None:
    tmp_link, tmp_file = target.with_name(".swap-link"), target.with_name(".swap-file")
    while not stop.is_set():
        os.symlink(secret, tmp_link)
        os.rename(tmp_link, target)
        tmp_file.write_text("SAFE\n")
        os.rename(tmp_file, target)
        counter[0] += 1


def test_symlink_swap_race_leaks_zero_bytes_through_the_daemon(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    target = d.app / "swapped"
    target.write_text("SAFE\n")
    stop, swaps = threading.Event(), [0]
    swapper = threading.Thread(target=_swap, args=(target, d.secret, stop, swaps), daemon=True)
    outcomes: dict[str, int] = {}
    leaked: list[str] = []

    async def session(deadline: float) -> None:
        async with client(d) as c:
            while time.monotonic() < deadline:
                text, err = await read(c, target, privileged=True)
                key = "content" if text is not None else f"{err['code']}: {err['details'].get('reason', '')}"
                outcomes[key] = outcomes.get(key, 0) + 1
                if text is not None and text != "SAFE\n":
                    leaked.append(text)

    async def go() -> None:
        deadline = time.monotonic() + RACE_SECONDS
        await asyncio.gather(*(session(deadline) for _ in range(RACE_SESSIONS)))

    swapper.start()
    try:
        asyncio.run(go())
    finally:
        stop.set()
        swapper.join(timeout=10)
        for name in ("swapped", ".swap-link", ".swap-file"):
            (d.app / name).unlink(missing_ok=True)
    total = sum(outcomes.values())
    print(f"\n{total} privileged reads through the daemon in {RACE_SECONDS:g} s "
          f"({RACE_SESSIONS} sessions), {swaps[0]} swaps: {outcomes}")
    assert total > 0 and leaked == []
    assert set(outcomes) <= {"content", "PERMISSION_DENIED: symlink in path",
                             "PERMISSION_DENIED: path changed while opening"}
    assert SECRET_TEXT.strip() not in d.audit_text()


def test_a_file_read_again_after_it_changed_is_judged_as_it_is_now(privsep_daemon: PrivsepDaemon) -> None:
    """The policy process keeps the descriptor of a privileged read for the next read of the same
    path. Between reads of one session, the granted file is grown, replaced, hard-linked, and its
    folder swapped for a symlink to a secret: every answer is what a fresh open would give now."""
    d = privsep_daemon
    sub = d.app / "kept"
    sub.mkdir()
    target = sub / "app.log"
    target.write_text("one\n")
    evil = d.srv / "evil"  # outside the grant, with a file of the same name
    evil.mkdir()
    (evil / "app.log").write_text(SECRET_TEXT)

    async def go() -> list[tuple[str | None, str]]:
        got = []
        async with client(d) as c:
            async def step(change: Any) -> None:
                change()
                text, err = await read(c, target, privileged=True)
                got.append((text, err.get("details", {}).get("reason", "")))

            await step(lambda: None)
            await step(lambda: target.write_text("one\ntwo\n"))  # rewritten in place: the same file
            await step(lambda: ((sub / ".new").write_text("replaced\n"), os.rename(sub / ".new", target)))
            await step(lambda: os.link(target, d.app / "kept-hard"))
            await step(lambda: os.unlink(d.app / "kept-hard"))
            await step(lambda: os.rename(sub, d.app / "kept.old") or os.symlink(evil, sub))
            await step(lambda: os.unlink(sub) or os.rename(d.app / "kept.old", sub))
        return got

    try:
        answers = asyncio.run(go())
    finally:
        if sub.is_symlink():
            sub.unlink()
        if (d.app / "kept.old").exists():
            os.rename(d.app / "kept.old", sub)
        (d.app / "kept-hard").unlink(missing_ok=True)
        shutil.rmtree(sub, ignore_errors=True)
        shutil.rmtree(evil, ignore_errors=True)
    assert answers == [("one\n", ""), ("one\ntwo\n", ""), ("replaced\n", ""),
                       (None, "file has several hard links"), ("replaced\n", ""),
                       (None, "symlink in path"), ("replaced\n", "")]
    assert SECRET_TEXT.strip() not in d.audit_text()


# ------------------------------------------------------------------ docs/REFERENCE.md §3 non-regular files


def test_fifo_socket_and_device_under_grant_are_refused_at_once(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    fifo, sock_path, dev = d.app / "fifo", d.app / "sock", d.app / "zero"
    os.mkfifo(fifo)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(sock_path))
    os.mknod(dev, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    try:
        for path, kind in ((fifo, "fifo"), (sock_path, "socket"), (dev, "char device")):
            text, err = read_once(d, path, privileged=True)
            assert text is None and err["code"] == "NOT_A_REGULAR_FILE", path
            assert err["details"]["type"] == kind
        assert read_once(d, d.log_file, privileged=True) == (LOG_TEXT, {})
    finally:
        sock.close()
        for p in (fifo, sock_path, dev):
            p.unlink()


# ------------------------------------------------------------------ PRIVSEP §8: when a process dies


def _big_file(path: Path, lines: int) -> None:
    line = b"x" * 99 + b"\n"
    with open(path, "wb") as f:
        for _ in range(lines // 10000):
            f.write(line * 10000)
    os.chmod(path, 0o600)


def test_helper_killed_mid_request_answers_helper_unavailable_and_recovers(privsep_daemon: PrivsepDaemon) -> None:
    """The helper dies after it handed a granted read to the caller's worker: that call answers
    HELPER_UNAVAILABLE, the root side's workers end with it (no orphan outlives the helper that
    controls it), new work is refused until the helper is back, then everything works again."""
    d = privsep_daemon
    alice = d.accounts["alice"].uid
    hostname = Path("/etc/hostname").read_text()

    async def go() -> None:
        async with client(d) as c:
            assert await read(c, "/etc/hostname") == (hostname, {})
            workers = d.workers("alice")
            assert workers
            for pid in workers:  # the worker takes the descriptor only after the helper is gone
                os.kill(pid, signal.SIGSTOP)
            task = asyncio.create_task(read(c, d.log_file, privileged=True))
            await asyncio.sleep(0.5)
            d.kill_helper(signal.SIGKILL)
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
            text, err = await task
            assert text is None and err["code"] == "HELPER_UNAVAILABLE", err
            wait_for(lambda: not uid_pids(alice), 10.0)
            text, err = await read(c, "/etc/hostname")  # no worker can be started meanwhile
            assert text is None and err["code"] == "HELPER_UNAVAILABLE", err
            text, err = await read(c, d.log_file, privileged=True)
            assert err["code"] == "HELPER_UNAVAILABLE"
            await asyncio.to_thread(d.start_helper)
            assert await read(c, "/etc/hostname") == (hostname, {})
            text, err = await read(c, d.log_file, privileged=True)
            assert (text, err) == (LOG_TEXT, {}), (err, d.log("helper.log")[-3000:])

    try:
        asyncio.run(go())
    finally:
        if d.helper is None or d.helper.poll() is not None:
            d.start_helper()


def test_worker_killed_mid_request_fails_only_its_request(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    uid = d.accounts["alice"].uid
    hostname = Path("/etc/hostname").read_text()

    async def go() -> None:
        async with client(d) as c, client(d, "bob") as other:
            assert await read(c, "/etc/hostname") == (hostname, {})
            victims = uid_pids(uid)
            assert victims
            for pid in victims:
                os.kill(pid, signal.SIGSTOP)
            task = asyncio.create_task(read(c, "/etc/hostname"))
            await asyncio.sleep(1.0)  # sequencing only: let the front hand the request to a stopped worker
            assert await read(other, "/etc/hostname") == (hostname, {})  # another account is not delayed
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            text, err = await task
            assert text is None and err["code"] == "INTERNAL_ERROR"
            assert await read(c, "/etc/hostname") == (hostname, {})  # a replacement worker serves
            assert not set(victims) & set(uid_pids(uid))

    asyncio.run(go())


# ------------------------------------------------------------------ docs/REFERENCE.md §4.5: reloads


def _audit_count(d: PrivsepDaemon, event: str) -> int:
    return sum(1 for r in d.audit() if r["event"] == event and r.get("grants_file") == str(d.grants_path))


def test_sighup_with_broken_grants_keeps_last_good_and_audits(privsep_daemon: PrivsepDaemon) -> None:
    d = privsep_daemon
    try:
        for broken in ("users: [unclosed\n", "users:\n  x:\n    privileged: {tools: {files/read: {allowed: true}}}\n"):
            before = _audit_count(d, "reload_failed")
            d.write_grants(broken)
            wait_for(lambda: _audit_count(d, "reload_failed") > before)
            assert read_once(d, d.log_file, privileged=True) == (LOG_TEXT, {})
        before = _audit_count(d, "reload_failed")
        d.write_grants(d.default_grants())
        os.chmod(d.grants_path, 0o666)  # group/world-writable: refused like sudoers
        d.helper.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        wait_for(lambda: _audit_count(d, "reload_failed") > before)
        grants = d.default_grants()
        grants["users"][d.accounts["bob"].name] = grants["users"][d.accounts["alice"].name]
        before = _audit_count(d, "reload")
        d.write_grants(grants)
        wait_for(lambda: _audit_count(d, "reload") > before)
        assert read_once(d, d.log_file, privileged=True, principal="bob") == (LOG_TEXT, {})
    finally:
        before = _audit_count(d, "reload")
        d.write_grants(d.default_grants())
        wait_for(lambda: _audit_count(d, "reload") > before)
    text, err = read_once(d, d.log_file, privileged=True, principal="bob")
    assert err["details"]["reason"] == NO_GRANT


# ------------------------------------------------------------------ `mcpd dev` as root


def _dev_lines(proc: subprocess.Popen[str], out: queue.Queue[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        out.put(line)


def test_dev_mode_as_root_runs_helper_and_front_as_service_user(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: `mcpd dev` as root starts the root helper")
    from mcpd.admin import devroot
    from tests.support.privsep_fixture import free_port

    base = Path(tempfile.mkdtemp(prefix="mcpd-devroot-", dir="/tmp"))
    os.chmod(base, 0o755)
    state_dir, port, bin_dir = base / "dev-state", free_port(), Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k not in ("MCPD_URL", "MCP_TOKEN", "MCPD_CACERT")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    proc = subprocess.Popen([str(bin_dir / "mcpd"), "dev", "--port", str(port), "--state-dir", str(state_dir)],
                            cwd=base, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_dev_lines, args=(proc, lines), daemon=True)
    reader.start()
    kids: dict[int, dict[str, str]] = {}
    try:
        printed = [lines.get(timeout=60) for _ in range(7)]
        sample = state_dir / "root-only" / "secret.txt"
        assert "mcpd-dev" in printed[4]
        assert f"linuxctl get files {sample}" in printed[5] and "PERMISSION_DENIED" in printed[5]
        assert f"linuxctl get files --privileged {sample}" in printed[6]
        env.update(line.removeprefix("export ").strip().split("=", 1) for line in printed[:3])

        def linuxctl(*args: str) -> subprocess.CompletedProcess[bytes]:
            deadline = time.monotonic() + 60
            while True:  # the front may still be binding its port (exit 4)
                res = subprocess.run([str(bin_dir / "linuxctl"), "get", "files", *args], env=env,
                                     capture_output=True, timeout=60)
                if res.returncode != 4 or time.monotonic() > deadline or proc.poll() is not None:
                    return res
                time.sleep(0.2)

        denied = linuxctl(str(sample))
        assert denied.returncode == 1 and denied.stderr.startswith(b"PERMISSION_DENIED"), denied.stderr
        granted = linuxctl("--privileged", str(sample))
        assert granted.returncode == 0, granted.stderr
        assert granted.stdout == devroot.SAMPLE_TEXT.encode()

        service, dev = pwd.getpwnam("mcpd"), pwd.getpwnam(devroot.DEV_ACCOUNT)
        kids = {int(p): proc_status(int(p)) for p in children(proc.pid)}
        uids = sorted(int(st["Uid"].split()[0]) for st in kids.values())
        assert uids == sorted([0, service.pw_uid]), kids  # helper as root, front as mcpd
        helper_pid = next(p for p, st in kids.items() if st["Uid"].split()[0] == "0")
        assert [w for fs in children(helper_pid, 0) for w in children(fs, dev.pw_uid)], \
            "workers run as mcpd-dev (children of the helper's fork server)"
        modes = {name: os.stat(state_dir / name) for name in ("", "users.yaml", "mcp-sudo.yaml", "server.key",
                                                              "mcpd.yaml", "root-only", "ca.key")}
        assert (stat.S_IMODE(modes[""].st_mode), modes[""].st_gid) == (0o751, service.pw_gid)  # policy enters
        policy = pwd.getpwnam(POLICY_USER)
        assert [p for p in children(helper_pid, policy.pw_uid)], "the policy process runs as mcpd-policy"
        for own in ("helper", "audit"):
            st = os.stat(state_dir / own)
            assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (policy.pw_uid, 0o700), own
        for name in ("users.yaml", "mcp-sudo.yaml", "ca.key"):
            assert (stat.S_IMODE(modes[name].st_mode), modes[name].st_uid) == (0o600, 0), name
        for name in ("server.key", "mcpd.yaml"):
            assert (stat.S_IMODE(modes[name].st_mode), modes[name].st_gid) == (0o640, service.pw_gid), name
        assert stat.S_IMODE(modes["root-only"].st_mode) == 0o700
        assert Path("/etc/pam.d/mcpd").exists(), "dev mode as root installs the PAM service linuxctl login needs"

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=45) == 0
        for pid in kids:
            assert not os.path.exists(f"/proc/{pid}") or proc_status(pid)["State"].startswith("Z")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        for pid in kids:  # never leave a root helper behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reader.join(timeout=15)
        assert proc.stdout is not None
        proc.stdout.close()
        shutil.rmtree(base, ignore_errors=True)


def test_while_the_helper_is_down_a_verified_token_lasts_only_the_short_window() -> None:
    """Helper down: a token the helper verified is served for at most ``auth_cache_seconds``, and
    then only for calls that start no worker and make no privileged call (those answer
    HELPER_UNAVAILABLE). Once the window has passed, the open session is closed and a new stream
    is answered 503 (the token cannot be checked; it is not said to be bad)."""
    from tests.support.osaccounts import AccountFactory
    from tests.support.pam_login import status_of_sse
    from tests.support.privsep_fixture import start_privsep, stop_privsep

    window = 4.0
    factory = AccountFactory()
    d = start_privsep(factory, auth_cache_seconds=window)
    try:
        async def go() -> None:
            async with client(d) as c:
                assert (await read(c, "/etc/hostname"))[1] == {}
                d.kill_helper(signal.SIGKILL)
                down = time.monotonic()
                wait_for(lambda: not uid_pids(d.accounts["alice"].uid), 10.0)  # its workers end with it
                text, err = await read(c, "/etc/hostname")
                assert text is None and err["code"] == "HELPER_UNAVAILABLE", err
                text, err = await read(c, d.log_file, privileged=True)
                assert text is None and err["code"] == "HELPER_UNAVAILABLE", err
                async with client(d) as again:  # inside the window: the verified token still opens a stream
                    text, err = await read(again, "/etc/hostname")
                    assert err["code"] == "HELPER_UNAVAILABLE", err
                assert time.monotonic() - down < window
                await asyncio.sleep(window + 2.5)  # the session re-check runs every second
                with pytest.raises(ConnectError):  # the stream was closed
                    await read(c, "/etc/hostname")
            assert status_of_sse(d, d.tokens["alice"]) == 503

        asyncio.run(go())
    finally:
        stop_privsep(d)
        factory.cleanup()


def test_a_privileged_read_larger_than_the_socket_buffers_arrives_whole(privsep_daemon: PrivsepDaemon) -> None:
    """The caller's worker answers the front while the helper waits for its report: a reply of
    several MiB must not block either (it did past about 2 MiB, until the call timed out)."""
    d = privsep_daemon
    big = d.app / "four-mib.txt"
    line = b"0123456789abcdef" * 4 + b"\n"
    big.write_bytes(line * (4 * 1024 * 1024 // len(line)))
    os.chmod(big, 0o600)
    try:
        text, err = read_once(d, big, privileged=True, offset=0, limit=4 * 1024 * 1024)
        assert err == {} and text is not None and text.encode() == big.read_bytes(), err
    finally:
        big.unlink()


def test_a_worker_that_ended_on_its_own_is_forgotten_without_an_alert(privsep_daemon: PrivsepDaemon) -> None:
    """A worker killed from outside (the OOM killer, an operator): the helper records its end; the
    front, finding its socket closed, asks the helper to kill it, and the helper answers that it is
    gone without an ``alert`` (alerts are for what a compromised front would do, such as naming
    another principal's worker). The next call gets a new worker."""
    d = privsep_daemon
    uid = pwd.getpwnam(d.accounts["alice"].name).pw_uid

    def alerts() -> list[dict[str, Any]]:
        return [r for r in d.audit() if r.get("event") == "alert"]

    before = len(alerts())

    async def go() -> None:
        async with client(d) as c:
            assert (await read(c, "/etc/hostname"))[1] == {}
            ended = uid_pids(uid)
            assert ended  # alice's worker(s): she runs nothing else
            for pid in ended:
                os.kill(pid, signal.SIGKILL)
            wait_for(lambda: {r.get("pid") for r in d.audit() if r.get("event") == "exit"} >= set(ended))
            for _ in range(3):  # whichever worker a call takes: the dead ones are found and dropped
                text, err = await read(c, "/etc/hostname")
                assert err == {} or err["code"] == "INTERNAL_ERROR", err
            assert (await read(c, "/etc/hostname"))[1] == {}

    asyncio.run(go())
    time.sleep(1)  # (a kill request in flight)
    assert alerts()[before:] == []
