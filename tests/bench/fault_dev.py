"""Fault figures of a real ``mcpd dev`` run as root: SIGKILL of the policy
process or of the root helper while sessions read in a loop, as the issue measured them.

Run as root: ``.venv/bin/python tests/bench/fault_dev.py policy|root [--unprivileged 4]
[--privileged 2] [--before 2] [--after 10]``. Starts ``mcpd dev`` in a fresh state folder under
``/tmp`` (its own helper watcher restarts the helper 1 s after it exits), has ``--unprivileged``
sessions read a public file and ``--privileged`` sessions the dev folder's root-only sample, one
call at a time each, for ``--before`` seconds, kills the process named, reads ``--after`` seconds
more, stops ``mcpd dev`` and prints one line: reads sent after the kill, how many failed, failures
among those sent 1 s and 3 s or more after it, ``RATE_LIMITED`` answers, seconds until the new
helper's socket was there and until the dev account's workers were as many as before, and the
answers by code. Bounded by ``--before + --after`` seconds of reading. Not a test: it decides
nothing (``tests/integration/test_helper_recovery.py`` asserts the rules).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import pwd
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mcpd.admin.devroot import DEV_ACCOUNT  # noqa: E402
from mcpd.client.api import Client, MCPClientError  # noqa: E402
from mcpd.common.config import POLICY_USER  # noqa: E402
from tests.support.devtree import start, stop  # noqa: E402
from tests.support.net import free_port  # noqa: E402
from tests.support.privsep_fixture import children, proc_status  # noqa: E402


def uid_count(uid: int) -> int:
    """Live (not zombie) processes of ``uid``: the dev account's workers."""
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                st = proc_status(int(entry))
                n += st["Uid"].split()[0] == str(uid) and not st["State"].startswith("Z")
            except (OSError, KeyError):
                pass
    return n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("victim", choices=("policy", "root"))
    parser.add_argument("--unprivileged", type=int, default=4)
    parser.add_argument("--privileged", type=int, default=2)
    parser.add_argument("--before", type=float, default=2.0)
    parser.add_argument("--after", type=float, default=10.0)
    opts = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root: mcpd dev starts the root helper only then", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="mcpd-fault-", dir="/tmp"))
    os.chmod(base, 0o755)
    public = base / "public.txt"
    public.write_text("public text\n")
    os.chmod(public, 0o644)
    dev = start(base / "dev-state", free_port())
    secret = base / "dev-state" / "root-only" / "secret.txt"
    url, token, ca = dev.env["MCPD_URL"], dev.env["MCP_TOKEN"], dev.env["MCPD_CACERT"]
    account = pwd.getpwnam(DEV_ACCOUNT).pw_uid
    reads: list[tuple[float, str]] = []

    def helper() -> int | None:
        for pid in children(dev.proc.pid):
            try:
                if os.stat(f"/proc/{pid}").st_uid == 0:
                    return pid
            except FileNotFoundError:  # ended meanwhile
                pass
        return None

    async def reader(path: Path, privileged: bool, until: float) -> None:
        async with Client(url, token, ca, timeout=30) as c:
            while time.monotonic() < until:
                sent = time.monotonic()
                try:
                    res = await c.call_tool("files/read", {"path": str(path), "privileged": privileged}, check=False)
                    code = res["structuredContent"]["error"]["code"] if res.get("isError") else "ok"
                except MCPClientError as exc:
                    code = type(exc).__name__
                reads.append((sent, code))

    async def run() -> tuple[float, float | None, float | None]:
        until = time.monotonic() + opts.before + opts.after
        tasks = [asyncio.create_task(reader(public, False, until)) for _ in range(opts.unprivileged)]
        tasks += [asyncio.create_task(reader(secret, True, until)) for _ in range(opts.privileged)]
        await asyncio.sleep(opts.before)
        before, old = uid_count(account), helper()
        assert old is not None
        victim = old if opts.victim == "root" else children(old, pwd.getpwnam(POLICY_USER).pw_uid)[0]
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        back = pool = None
        sock = base / "dev-state" / "run" / "helper.sock"
        while time.monotonic() < until:
            await asyncio.sleep(0.05)
            now = helper()
            if back is None and now is not None and now != old and sock.exists():
                back = round(time.monotonic() - killed, 2)
            if pool is None and back is not None and uid_count(account) >= before:
                pool = round(time.monotonic() - killed, 2)
        await asyncio.gather(*tasks)
        return killed, back, pool

    try:
        port = int(url.rsplit(":", 1)[1])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the front listens a moment after the start-up text
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        killed, back, pool = asyncio.run(run())
    finally:
        stop(dev)
        shutil.rmtree(base, ignore_errors=True)
    after = [r for r in reads if r[0] >= killed]
    failed = [r for r in after if r[1] != "ok"]
    print(f"SIGKILL of the {opts.victim}: {len(after)} reads after the kill, {len(failed)} failed, "
          f"{sum(r[0] >= killed + 1 for r in failed)} of {sum(r[0] >= killed + 1 for r in after)} sent >= 1 s after it, "
          f"{sum(r[0] >= killed + 3 for r in failed)} of {sum(r[0] >= killed + 3 for r in after)} >= 3 s; "
          f"{sum(r[1] == 'RATE_LIMITED' for r in reads)} RATE_LIMITED; helper back in {back} s, pool back in {pool} s; "
          f"codes {dict(collections.Counter(r[1] for r in after))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
