"""Root opens nothing of a process, and the privileged route judges the real object
(docs/PRIVSEP.md sections 5 and 6).

The attackers are real: code running as ``mcpd-policy`` on root's own channel (the real policy
process stopped, its channel copied with ``pidfd_getfd``, as in ``test_root_monitor.py``), and a
principal whose grants cover ``/`` and ``/proc``, calling through the real front over TLS. The
detours are real too: symlinks, bind mounts (``mount --bind``, each unmounted before the test
ends) and a second ``proc`` mount. Whatever the spelling, root refuses a process's ``/proc``
folder and the daemon's secrets, a privileged list or find shows neither, and the helper started
by hand keeps only its four capabilities.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mounts import mounted
from tests.support.privsep_fixture import LOG_TEXT, PrivsepDaemon, children, privsep_daemon, proc_status  # noqa: F401  (fixture)
from tests.support.root_channels import as_policy, policy_pid
from tests.support.root_objects import call, everywhere, refused  # noqa: F401  (fixture)

pytestmark = pytest.mark.root
PROCESS = "a process's own files are never served"
SECRET = "the daemon's own secrets are never served"
#: the daemon's secrets in the fixture's state folder (mcpd.yaml, users and grants files, the
#: TLS folder, the audit folder, the policy's state, the development token, an editor swap file)
SECRET_NAMES = {"mcpd.yaml", "users.yaml", "mcp-sudo.yaml", "tls", "audit", "helper", "dev-token", ".users.yaml.swp"}
KEEP = (1 << 2) | (1 << 5) | (1 << 6) | (1 << 7)  # CAP_DAC_READ_SEARCH, CAP_KILL, CAP_SETGID, CAP_SETUID


def daemon_pids(d: PrivsepDaemon) -> dict[str, int]:
    """The daemon's processes: front, root helper, policy process, fork server, one worker."""
    assert call(d, "files/read", path=str(d.log_file)).get("text") == LOG_TEXT  # alice has a worker
    (forks,) = children(d.helper_pid, 0)  # the policy process runs as mcpd-policy
    return {"front": d.front_pid, "helper": d.helper_pid, "policy": policy_pid(d), "fork server": forks,
            "worker": d.workers("alice")[0]}


def a_thread(pid: int) -> int:
    """A thread of ``pid`` other than its first when it has one."""
    tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    return tids[-1]


# -- item 3: root opens nothing of a process -------------------------------------------------------


def test_a_compromised_policy_gets_nothing_of_a_process_from_root(privsep_daemon: PrivsepDaemon,  # noqa: F811
                                                                   tmp_path: Path) -> None:
    """Code as ``mcpd-policy`` on root's channel asks root to open the front's memory,
    environment and maps (and the other daemon processes', a thread's, ``/proc/self``'s), by
    every spelling: directly, through a symlink, through a second ``proc`` mount and through a
    bind mount of the front's ``/proc`` folder. Root refuses all of them (its magic links, its
    descriptors and its root folder are refused by the kernel or the opener already, and still
    are); the kernel's own files
    (``/proc/meminfo``, ``/proc/sys/...``) stay servable."""
    d = privsep_daemon
    pids = daemon_pids(d)
    front, tid = d.front_pid, a_thread(d.front_pid)
    (tmp_path / "link").symlink_to(f"/proc/{front}")
    direct = [f"/proc/{pid}/{name}" for pid in pids.values() for name in ("mem", "environ", "maps")]
    direct += [f"/proc/{front}/task/{tid}/{name}" for name in ("mem", "environ", "maps")]
    followed = ["/proc/self/environ", "/proc/self/mem", "/proc/thread-self/maps", f"{tmp_path}/link/environ",
                "/proc/net/unix"]  # /proc/net is /proc/self/net
    handles = [f"/proc/{front}", f"/proc/{front}/fd", f"/proc/{front}/task", f"/proc/{front}/task/{tid}",
               f"/proc/{front}/status", f"/proc/{front}/net"]
    magic = [f"/proc/{front}/{name}" for name in ("root", "cwd", "exe", "fd/0", "fdinfo/0", "root/etc/hostname")]
    with mounted(tmp_path / "proc", "-t", "proc", "proc") as proc2, \
            mounted(tmp_path / "pid", "--bind", f"/proc/{front}") as bound, as_policy(d) as root:
        asks = [(p, follow, "file") for p in direct for follow in (False, True)]
        asks += [(p, True, "file") for p in followed] + [(p, False, "any") for p in handles]
        asks += [(f"{proc2}/{front}/environ", False, "file"), (f"{proc2}/{front}/mem", True, "file"),
                 (f"{bound}/environ", False, "file"), (f"{bound}/maps", True, "any"), (str(bound), False, "any")]
        for path, follow, want in asks:
            error = root.refused("open", path=path, follow=follow, want=want)
            assert error["code"] == "PERMISSION_DENIED" and error["details"]["reason"] == PROCESS, (path, error)
        for path, follow, want in [(p, follow, want) for p in magic for follow in (False, True) for want in ("file", "any")]:
            assert root.refused("open", path=path, follow=follow, want=want)["code"] == "PERMISSION_DENIED", path
        for path in ("/proc/meminfo", "/proc/sys/kernel/ostype", f"{proc2}/loadavg"):
            reply, fds = root.ask("open", path=path, follow=False, want="file")
            assert reply["ok"] is True and len(fds) == 1, (path, reply)
            try:
                assert os.read(fds[0], 4096)
            finally:
                os.close(fds[0])


def test_a_grant_on_proc_and_root_reads_no_process_of_the_daemon(everywhere: PrivsepDaemon) -> None:
    """A principal whose grant covers ``/`` and ``/proc`` asks for the memory, environment and
    maps of every daemon process (the front's TLS key lives in its memory): each is refused,
    whichever spelling; ``/proc/meminfo`` is read."""
    d = everywhere
    for name, pid in daemon_pids(d).items():
        for path in (f"/proc/{pid}/mem", f"/proc/{pid}/environ", f"/proc/{pid}/maps",
                     f"/proc/{pid}/task/{a_thread(pid)}/environ"):
            assert refused(call(d, "files/read", path=path), PROCESS), (name, path)
    for path in ("/proc/self/environ", "/proc/thread-self/maps"):
        assert refused(call(d, "files/read", path=path), PROCESS), path
    assert "MemTotal" in call(d, "files/read", path="/proc/meminfo")["text"]


def test_a_privileged_list_or_find_of_proc_shows_no_process(everywhere: PrivsepDaemon) -> None:
    """``/proc`` listed or searched with a grant on it shows the kernel's files but no process
    folder (the daemon's processes among them), and a process's folder cannot be listed."""
    d = everywhere
    daemon_pids(d)
    listed = call(d, "files/list", path="/proc", limit=10000)
    names = {e["name"] for e in listed["entries"]}
    assert "meminfo" in names and "sys" in names, names
    assert not {n for n in names if n.isdigit() or n in ("self", "thread-self")}, names
    found = call(d, "files/find", root="/proc", max_depth=2, name="environ")
    assert found["matches"] == [], found["matches"][:5]
    for path in (f"/proc/{d.front_pid}", f"/proc/{d.front_pid}/task", "/proc/self"):
        assert refused(call(d, "files/list", path=path), PROCESS), path
        assert refused(call(d, "files/find", root=path), PROCESS), path


def test_the_helper_started_by_hand_keeps_only_its_four_capabilities(privsep_daemon: PrivsepDaemon) -> None:  # noqa: F811
    """Started by ``mcpd helper`` as root (not by systemd, whose unit drops the same set), the
    helper and its fork server hold CAP_DAC_READ_SEARCH, CAP_KILL, CAP_SETGID and CAP_SETUID in
    their bounding, permitted and effective sets and nothing inheritable or ambient; the daemon
    still serves a privileged read, a worker and a walker."""
    d = privsep_daemon
    assert call(d, "files/read", path=str(d.log_file)).get("text") == LOG_TEXT
    for pid in (d.helper_pid, *children(d.helper_pid, 0)):
        status = proc_status(pid)
        caps = {k: int(status[k], 16) for k in ("CapBnd", "CapPrm", "CapEff", "CapInh", "CapAmb")}
        assert caps == {"CapBnd": KEEP, "CapPrm": KEEP, "CapEff": KEEP, "CapInh": 0, "CapAmb": 0}, (pid, caps)
    assert [e["name"] for e in call(d, "files/list", path=str(d.app))["entries"]] == ["log.txt"]


# -- the daemon's secrets, by object ----------------------------------------------------------------


@pytest.fixture
def extra_secrets(privsep_daemon: PrivsepDaemon) -> Iterator[PrivsepDaemon]:  # noqa: F811
    """The fixture's state folder also holds a development token and a users-file swap file."""
    d = privsep_daemon
    made = [d.state_dir / "dev-token", d.state_dir / ".users.yaml.swp"]
    for path in made:
        path.write_text("secret\n")
        path.chmod(0o600)
    try:
        yield d
    finally:
        for path in made:
            path.unlink(missing_ok=True)


def test_root_refuses_the_secrets_by_object_through_bind_mounts_and_symlinks(extra_secrets: PrivsepDaemon,
                                                                              tmp_path: Path) -> None:
    """Code as ``mcpd-policy`` asks root for the daemon's secrets through a bind mount of the
    state folder, of the TLS folder and of ``users.yaml`` alone, and through a symlink: all
    refused; a file beside them that is no secret still opens through the same bind mount."""
    d = extra_secrets
    call(d, "files/read", path=str(d.log_file))  # the audit log exists
    (tmp_path / "link").symlink_to(d.state_dir)
    (tmp_path / "one").touch()
    names = ["users.yaml", "mcpd.yaml", "mcp-sudo.yaml", "tls/server.key", "tls/ca.key", "audit/audit.jsonl",
             "dev-token", ".users.yaml.swp"]
    with mounted(tmp_path / "bound", "--bind", str(d.state_dir)) as bound, \
            mounted(tmp_path / "keys", "--bind", str(d.state_dir / "tls")) as keys, \
            mounted(tmp_path / "one", "--bind", str(d.state_dir / "users.yaml")) as one, as_policy(d) as root:
        asks = [(f"{bound}/{n}", follow) for n in names for follow in (False, True)]
        asks += [(f"{tmp_path}/link/{n}", True) for n in names]
        asks += [(f"{keys}/server.key", False), (f"{keys}/ca.key", True), (str(one), False), (str(one), True)]
        for path, follow in asks:
            error = root.refused("open", path=path, follow=follow, want="file")
            assert error["code"] == "PERMISSION_DENIED" and error["details"]["reason"] == "daemon secret", (path, error)
        reply, fds = root.ask("open", path=f"{bound}/front.log", follow=False, want="file")
        assert reply["ok"] is True and len(fds) == 1
        os.close(fds[0])


def test_a_folder_named_like_a_secret_folder_is_no_secret(everywhere: PrivsepDaemon) -> None:
    """A secret folder ``D`` covers ``D`` and what is in it, not ``D-old`` beside it: root and the
    policy process judge alike, so a grant covering ``D-old/x`` reads it (root once refused it by
    the string prefix while ``mcpd grants test`` said it would open)."""
    d = everywhere
    for name in ("audit", "tls", "helper"):
        assert (d.state_dir / name).is_dir(), name
    made = [d.state_dir / f"{name}-old" for name in ("audit", "tls", "helper")]
    try:
        for folder in made:
            folder.mkdir()
            (folder / "x.txt").write_text(f"not a secret: {folder.name}\n")
        for folder in made:
            assert call(d, "files/read", path=str(folder / "x.txt")) == {"text": f"not a secret: {folder.name}\n"}
        (d.state_dir / "audit" / "x.txt").write_text("inside the audit folder\n")
        assert refused(call(d, "files/read", path=str(d.state_dir / "audit" / "x.txt")))
    finally:
        (d.state_dir / "audit" / "x.txt").unlink(missing_ok=True)
        for folder in made:
            (folder / "x.txt").unlink(missing_ok=True)
            folder.rmdir()


# -- item 4: privileged list and find judge the real object ----------------------------------------


def _secret_seen(names: set[str], paths: list[str], base: str) -> set[str]:
    """The secret names among ``names``, and the matches at or under a secret of the state folder."""
    under = {p for p in paths if posixpath.relpath(p, base).split("/")[0] in SECRET_NAMES}
    return (names & SECRET_NAMES) | under | {p for p in paths if posixpath.basename(p) in {"access.jsonl"}}


@contextlib.contextmanager
def detour(kind: str, target: Path, at: Path) -> Iterator[Path]:
    """``at`` leads to ``target`` for the block: a symlink, or a bind mount."""
    if kind == "bind mount":
        with mounted(at, "--bind", str(target)):
            yield at
        at.rmdir()
        return
    at.symlink_to(target)
    try:
        yield at
    finally:
        at.unlink()


@pytest.mark.parametrize("kind", ["symlink", "bind mount"])
def test_list_and_find_through_a_detour_show_no_secret(everywhere: PrivsepDaemon, extra_secrets: PrivsepDaemon,
                                                        kind: str) -> None:
    """With a grant on ``/``, a privileged list or find started at a symlink to the state folder,
    or at a bind mount of it, shows what is no secret there (``front.log``, ``run``) and none of
    the secrets (``users.yaml``, ``mcpd.yaml``, the grants file, the keys' folder, the audit
    folder, the policy's state, ``dev-token``, the swap file, the access log); one started at a
    detour to the policy's state folder, the keys' or the audit folder is refused, like a direct
    listing."""
    d = everywhere
    with detour(kind, d.state_dir, d.srv / "state") as base, detour(kind, d.state_dir / "helper", d.srv / "pol") as pol:
        listed = call(d, "files/list", path=str(base))
        names = {e["name"] for e in listed["entries"]}
        assert {"front.log", "run", "access"} <= names, names
        found = call(d, "files/find", root=str(base))
        paths = [m["path"] for m in found["matches"]]
        assert f"{base}/front.log" in paths and f"{base}/run/helper.sock" in paths, paths
        assert _secret_seen(names, paths, str(base)) == set(), (names, paths)
        assert refused(call(d, "files/list", path=f"{base}/access/access.jsonl"))
        assert refused(call(d, "files/list", path=f"{base}/users.yaml"))
        for start in (pol, base / "tls", base / "audit", base / "helper"):
            assert refused(call(d, "files/list", path=str(start)), SECRET), start
            assert refused(call(d, "files/find", root=str(start)), SECRET), start
