"""The distribution packages that ``scripts/package/build.sh`` makes (docs/PACKAGING.md), for real.

The ``.deb`` is installed on this machine with ``dpkg -i``, its daemon started by hand as its units
would start it (the ``ExecStart=`` lines and ``User=`` of the installed units: no systemd runs as
PID 1 here), a file read through it with the installed ``linuxctl``, then upgraded to a rebuilt
package (a higher release) with an edited ``/etc/mcpd/mcpd.yaml`` that must be kept, and purged.
The ``.rpm`` is inspected (``rpm -qp``: files, conffiles, requirements, scripts). The Ansible role
(``etc/ansible/roles/mcpd``) installs the same ``.deb`` with ``ansible-playbook -c local``: a first
run changes, a second changes nothing, a grants-only change reloads rather than restarts, and a
broken grants file is refused with the old one kept.

Root only, and only on a machine where mcpd is not installed (the test would replace it). The
teardown purges the package whatever happened, and removes the service accounts only when the
package made them (the suite's own daemons use the same accounts). Bounded: every command has a
timeout.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from mcpd.admin.cli import helper_socket
from mcpd.common import identity
from mcpd.common.config import POLICY_USER, WALK_USER
from tests.support.osaccounts import AccountFactory, remove_group, remove_user, require_root

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "scripts" / "package" / "build.sh"
ACCOUNTS = ("mcpd", POLICY_USER, WALK_USER, "mcpd-jwks")
UNITS = Path("/usr/lib/systemd/system")
PURGED = ("/opt/mcpd", "/etc/mcpd", "/var/lib/mcpd", "/var/lib/mcpd-helper", "/var/lib/mcpd-jwks", "/var/log/mcpd", "/var/log/mcpd-front",
          "/run/mcpd", "/usr/lib/systemd/system/mcpd.service", "/usr/lib/tmpfiles.d/mcpd.conf", "/usr/sbin/mcpd")
START_SECONDS = 30.0

pytestmark = [pytest.mark.root, pytest.mark.slow]


def run(*args: str | Path, timeout: float = 300, check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]
    if check:
        assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@dataclass(frozen=True)
class Packages:
    deb: Path
    rpm: Path
    deb_upgrade: Path
    seconds: float  # the two builds together (reported, never asserted)


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, f"{pattern} in {folder}: {found}"
    return found[0]


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Packages:
    """Both packages of this checkout (release 1), and the .deb again as release 2."""
    started = time.monotonic()
    first, second = tmp_path_factory.mktemp("pkg1"), tmp_path_factory.mktemp("pkg2")
    run("bash", BUILD, "--out", first, timeout=900)
    run("bash", BUILD, "--out", second, "--release", "2", "--format", "deb", timeout=900)
    return Packages(deb=_one(first, "mcpd_*-1_*.deb"), rpm=_one(first, "mcpd-*-1.*.rpm"),
                    deb_upgrade=_one(second, "mcpd_*-2_*.deb"), seconds=time.monotonic() - started)


def _installed() -> bool:
    proc = run("dpkg-query", "-W", "-f", "${db:Status-Status}", "mcpd", check=False)
    return proc.returncode == 0 and proc.stdout.strip() not in ("", "not-installed", "config-files")


def _exists_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture
def clean_machine() -> Iterator[AccountFactory]:
    """A machine without mcpd installed; afterwards: purged again, the service accounts removed if
    the package made them, and the test's own accounts removed."""
    require_root()
    if _installed() or os.path.lexists("/opt/mcpd") or os.path.lexists("/etc/mcpd"):
        pytest.skip("mcpd is installed on this machine (or /opt/mcpd, /etc/mcpd exist): the test would replace it")
    had = {name for name in ACCOUNTS if _exists_user(name)}
    factory = AccountFactory()
    try:
        yield factory
    finally:
        if _installed() or run("dpkg-query", "-W", "mcpd", check=False).returncode == 0:
            run("dpkg", "--purge", "mcpd", check=False, timeout=120)
        shutil.rmtree("/var/cache/mcpd-package", ignore_errors=True)  # the Ansible role's copy of the .deb
        for name in ACCOUNTS:
            if name not in had and _exists_user(name):
                remove_user(name)
                remove_group(name)
        factory.cleanup()


def _exec_start(unit: str) -> tuple[list[str], str | None]:
    """The installed ``unit``'s ``ExecStart=`` command and ``User=``."""
    text = (UNITS / unit).read_text(encoding="utf-8")
    starts = re.findall(r"^ExecStart=(.+)$", text, re.M)
    users = re.findall(r"^User=(\S+)$", text, re.M)
    assert len(starts) == 1, starts
    return shlex.split(starts[0]), (users[0] if users else None)


def _installed_certbot_hook_installs_a_renewal(tmp_path: Path) -> None:
    """The packaged certbot hook, linked into certbot's deploy folder as certs/README.md says, finds
    its installer and installs a renewed lineage with mcpd's owner and modes."""
    live, hooks = tmp_path / "le" / "live" / "h", tmp_path / "le" / "renewal-hooks" / "deploy"
    live.mkdir(parents=True)
    hooks.mkdir(parents=True)
    shutil.copy2("/etc/mcpd/tls/server.crt", live / "fullchain.pem")
    shutil.copy2("/etc/mcpd/tls/server.key", live / "privkey.pem")
    (hooks / "mcpd.sh").symlink_to("/usr/lib/mcpd/certs/certbot-deploy-hook.sh")
    run(hooks / "mcpd.sh", env={"PATH": os.defpath, "RENEWED_LINEAGE": str(live), "MCPD_RELOAD": "true"})
    group = pwd.getpwnam("mcpd").pw_gid
    for name, mode in (("server.crt", 0o644), ("server.key", 0o640)):
        st = os.lstat(f"/etc/mcpd/tls/{name}")
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, group, mode), name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _wait(what: str, ready: object, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while not ready():  # type: ignore[operator]
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{what} did not start (exit {proc.poll()}):\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.05)


def _socket_ready(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _policy_started(audit: Path, before: int) -> bool:
    """The policy process has loaded its grants: a ``load: start`` record after the first ``before`` lines."""
    try:
        lines = audit.read_bytes().split(b"\n")[before:]
    except FileNotFoundError:
        return False
    return any(b'"load":"start"' in line.replace(b" ", b"") for line in lines)


def _port_ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _serve_and_read(logs: Path, port: int, path: str, token: str) -> str:
    """Start the installed helper (root) and front (its unit's User=) as the units do, read
    ``path`` through them with the installed linuxctl, stop both; return what was read."""
    helper_cmd, helper_user = _exec_start("mcpd-helper.service")
    front_cmd, front_user = _exec_start("mcpd.service")
    assert helper_user is None and helper_cmd[0] == "/opt/mcpd/bin/python3", helper_cmd
    assert front_user == "mcpd" and front_cmd[0] == "/opt/mcpd/bin/mcpd", front_cmd
    service = pwd.getpwnam(front_user)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    started: list[subprocess.Popen[bytes]] = []
    audit = Path("/var/log/mcpd/audit.jsonl")
    before = audit.read_bytes().count(b"\n") if audit.exists() else 0
    # mcpd-helper.socket's part: the listening socket, root:mcpd 0660, handed over as fd 3 (LISTEN_FDS)
    listener = helper_socket("/run/mcpd/helper.sock", service.pw_gid)
    hand_over = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.environ.update(LISTEN_PID=str(os.getpid()), "
                 "LISTEN_FDS='1'); os.execv(sys.argv[2], sys.argv[2:])")
    try:
        with open(logs / "helper.log", "ab") as log:
            helper = subprocess.Popen(["/opt/mcpd/bin/python3", "-I", "-c", hand_over, str(listener.fileno()),
                                       *helper_cmd], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                      cwd="/", env=env, pass_fds=(listener.fileno(),))
        listener.close()
        started.append(helper)
        _wait("the helper", lambda: _policy_started(audit, before), helper, logs / "helper.log")
        with open(logs / "front.log", "ab") as log:
            front = subprocess.Popen(front_cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     cwd="/", env={**env, "HOME": service.pw_dir}, user=service.pw_uid,
                                     group=service.pw_gid, extra_groups=[])
        started.append(front)
        _wait("the front", lambda: _port_ready(port), front, logs / "front.log")
        token_file = logs / "token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        got = run("/usr/bin/linuxctl", "--url", f"https://127.0.0.1:{port}", "--cacert", "/etc/mcpd/tls/ca.crt",
                  "--token-file", token_file, "--timeout", "20", "get", "files", path, timeout=60,
                  env={**env, "XDG_CONFIG_HOME": "/nonexistent"})
        return got.stdout
    finally:
        for proc in reversed(started):
            _stop(proc)


def _mcpd_processes() -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "/opt/mcpd/" in cmdline:
                found.append(f"{entry}: {cmdline}")
    return found


def test_deb_installs_serves_upgrades_keeping_an_edited_config_and_purges(
        packages: Packages, clean_machine: AccountFactory, tmp_path: Path) -> None:
    # Install: accounts and folders made, nothing started.
    out = run("dpkg", "-i", packages.deb, timeout=300).stdout
    assert "installed, not started" in out
    for command in ("mcpd certs --dir /etc/mcpd/tls --host NAME", "mcpd users add NAME --os-user ACCOUNT",
                    "systemctl enable --now mcpd-helper.socket mcpd.service"):  # the next steps, word for word
        assert f"\n  {command}" in out, out
    assert not list(Path("/opt/mcpd").rglob("ansible"))  # the role runs on the controller: not in the venv
    assert _mcpd_processes() == []
    for name in ACCOUNTS:
        assert _exists_user(name), name
    st = os.stat("/var/log/mcpd")
    assert (pwd.getpwuid(st.st_uid).pw_name, stat.S_IMODE(st.st_mode)) == (POLICY_USER, 0o700)
    st = os.stat("/etc/mcpd/mcpd.yaml")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o640)
    assert run("/opt/mcpd/bin/mcpd", "--version").stdout.strip() == "mcpd 0.1.0"
    assert "parsed OK" in run("/usr/sbin/mcpd", "grants", "check", "/etc/mcpd/mcp-sudo.yaml").stdout
    assert "no grants" in run("/usr/sbin/mcpd", "grants", "list", "--user", "root", "--group", "adm").stdout
    assert Path("/etc/mcpd/mcp-sudo.yaml.example").is_file()
    for unit in ("mcpd.service", "mcpd-helper.service", "mcpd-helper.socket", "mcpd-jwks.service",
                 "mcpd-jwks.timer"):  # the installed paths resolve
        verify = run("systemd-analyze", "verify", "--no-pager", UNITS / unit, check=False, timeout=60)
        assert (verify.returncode, verify.stdout.strip(), verify.stderr.strip()) == (0, "", ""), unit + verify.stderr
    conffiles = run("dpkg-query", "-W", "-f", "${Conffiles}", "mcpd").stdout
    for name in ("/etc/mcpd/mcpd.yaml", "/etc/mcpd/mcp-sudo.yaml", "/etc/pam.d/mcpd", "/etc/logrotate.d/mcpd"):
        assert name in conffiles

    # Configure as an operator would: TLS, listen on loopback (the edit the upgrade must keep), a
    # principal bound to a real account; then serve a file of that account.
    account = clean_machine.user()
    secret = Path(account.home) / "notes.txt"
    secret.write_text("read through the installed package\n")
    os.chown(secret, account.uid, account.gid)
    secret.chmod(0o600)
    run("/usr/sbin/mcpd", "certs", "--dir", "/etc/mcpd/tls", "--host", "127.0.0.1", "--host", "localhost")
    port = _free_port()
    conf = Path("/etc/mcpd/mcpd.yaml")
    shipped = conf.read_text(encoding="utf-8")
    edited = shipped.replace("  host: 0.0.0.0\n  port: 9091\n", f"  host: 127.0.0.1\n  port: {port}\n", 1)
    assert edited != shipped
    conf.write_text(edited, encoding="utf-8")
    token = run("/usr/sbin/mcpd", "users", "add", "reader", "--os-user", account.name).stdout.strip()
    assert token.startswith("mcpd_")
    assert _serve_and_read(tmp_path, port, str(secret), token) == "read through the installed package\n"
    _installed_certbot_hook_installs_a_renewal(tmp_path)
    assert Path("/var/log/mcpd/audit.jsonl").stat().st_size > 0  # the policy process wrote its audit log

    # Upgrade to a rebuilt package: the edited mcpd.yaml and the operator's files are kept, without
    # a question (dpkg would fail here, stdin closed, if it asked).
    run("dpkg", "-i", packages.deb_upgrade, timeout=300)
    assert run("dpkg-query", "-W", "-f", "${Version}", "mcpd").stdout == "0.1.0-2"
    assert conf.read_text(encoding="utf-8") == edited
    assert Path("/etc/mcpd/users.yaml").is_file() and Path("/etc/mcpd/tls/server.key").is_file()
    assert _mcpd_processes() == []
    assert run("/opt/mcpd/bin/mcpd", "--version").stdout.strip() == "mcpd 0.1.0"

    # Purge: files, configuration, state and logs gone; the accounts stay (documented).
    run("dpkg", "--purge", "mcpd", timeout=300)
    assert run("dpkg-query", "-W", "mcpd", check=False).returncode != 0
    assert [p for p in PURGED if os.path.lexists(p)] == []
    for name in ACCOUNTS:
        assert _exists_user(name), name
    print(f"\nbuilt both packages and the upgrade in {packages.seconds:.0f} s")


def test_rpm_lists_the_files_conffiles_requirements_and_scripts(packages: Packages) -> None:
    if shutil.which("rpm") is None:
        pytest.fail("rpm is missing (scripts/bootstrap.sh installs it: apt-get install rpm)")
    files = run("rpm", "-qpl", packages.rpm).stdout.split("\n")
    for name in ("/opt/mcpd/bin/mcpd", "/opt/mcpd/bin/python3", "/opt/mcpd/pyvenv.cfg",
                 "/usr/lib/systemd/system/mcpd.service", "/usr/lib/systemd/system/mcpd-helper.service",
                 "/usr/lib/systemd/system/mcpd-helper.socket", "/usr/lib/systemd/system/mcpd-jwks.service",
                 "/usr/lib/systemd/system/mcpd-jwks.timer", "/usr/lib/sysusers.d/mcpd.conf",
                 "/usr/lib/tmpfiles.d/mcpd.conf", "/etc/pam.d/mcpd", "/etc/logrotate.d/mcpd",
                 "/etc/mcpd/mcpd.yaml", "/etc/mcpd/mcp-sudo.yaml", "/etc/mcpd/mcp-sudo.yaml.example",
                 "/usr/share/doc/mcpd/PRIVSEP.md",
                 "/usr/lib/mcpd/certs/certbot-deploy-hook.sh", "/usr/share/doc/mcpd/certs/README.md"):
        assert name in files, name
    assert not [f for f in files if "/tmp/" in f or f.startswith("/usr/local")]
    config = run("rpm", "-qpc", packages.rpm).stdout.split()
    assert {"/etc/mcpd/mcpd.yaml", "/etc/mcpd/mcp-sudo.yaml", "/etc/pam.d/mcpd"} <= set(config)
    requires = run("rpm", "-qpR", packages.rpm).stdout
    assert re.search(r"^python\(abi\) = 3\.\d+$", requires, re.M), requires
    scripts = run("rpm", "-qp", "--scripts", packages.rpm).stdout
    assert "systemd-sysusers /usr/lib/sysusers.d/mcpd.conf" in scripts
    assert "systemd-tmpfiles --create /usr/lib/tmpfiles.d/mcpd.conf" in scripts
    # Nothing is enabled or started by the package: only stop/disable on erase, try-restart on upgrade.
    commands = [line for line in scripts.splitlines() if not line.lstrip().startswith(("#", "echo "))]
    verbs = set(re.findall(r"systemctl ([a-z-]+)", "\n".join(commands)))
    assert verbs <= {"daemon-reload", "try-restart", "stop", "disable"}, verbs
    assert run("rpm", "-qp", "--qf", "%{VERSION}-%{RELEASE}", packages.rpm).stdout == "0.1.0-1"


ROLES = REPO / "etc" / "ansible" / "roles"
PLAYBOOK_BIN = Path(sys.executable).parent / "ansible-playbook"


def _grants(paths: list[str]) -> dict[str, object]:
    return {"users": {"reader": {"privileged": {"tools": {"files/read": {"allowed": True, "paths": paths}}}}}}


def _playbook(folder: Path, deb: Path, grants: dict[str, object], users: dict[str, object]) -> Path:
    play = [{"name": "mcpd", "hosts": "localhost", "gather_facts": True, "roles": [{"role": "mcpd", "vars": {
        "mcpd_package_file": str(deb),
        "mcpd_config": {"listen": {"host": "127.0.0.1", "port": 9391}, "tool_names": "portable"},
        "mcpd_users": users, "mcpd_grants": grants, "mcpd_tls_hosts": ["localhost", "127.0.0.1"]}}]}]
    path = folder / "play.yml"
    path.write_text(yaml.safe_dump(play), encoding="utf-8")
    return path


def _ansible(folder: Path, playbook: Path) -> tuple[int, str, dict[str, int]]:
    """One ``ansible-playbook -c local`` run: exit status, output, the PLAY RECAP counts."""
    (folder / "inventory").write_text("localhost ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n")
    env = {"PATH": f"{PLAYBOOK_BIN.parent}:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": str(folder),
           "ANSIBLE_ROLES_PATH": str(ROLES), "ANSIBLE_HOME": str(folder / "ansible"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCAL_TEMP": str(folder / "local-tmp"), "ANSIBLE_REMOTE_TEMP": str(folder / "remote-tmp"),
           "ANSIBLE_RETRY_FILES_ENABLED": "0"}
    proc = run(PLAYBOOK_BIN, "-i", folder / "inventory", playbook, check=False, timeout=600, env=env, cwd=folder)
    recap = re.search(r"^localhost\s+:\s+(.*)$", proc.stdout, re.M)
    assert recap, proc.stdout[-3000:] + proc.stderr[-3000:]
    counts = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", recap.group(1))}
    return proc.returncode, proc.stdout + proc.stderr, counts


def test_ansible_role_installs_then_changes_nothing_reloads_for_grants_and_refuses_broken_grants(
        packages: Packages, clean_machine: AccountFactory, tmp_path: Path) -> None:
    account = clean_machine.user()
    _token, record = identity.new_token()
    users = {"reader": {"os_user": account.name, "tokens": [dataclasses.asdict(record)]}}
    users["reader"]["tokens"][0].pop("expires")  # type: ignore[index]
    grants_path = Path("/etc/mcpd/mcp-sudo.yaml")

    # First run: the package installed, the three files written (each validated), mcpd.yaml's
    # handler notified.
    status, out, counts = _ansible(tmp_path, _playbook(tmp_path, packages.deb, _grants(["/var/log"]), users))
    assert status == 0 and counts["failed"] == 0 and counts["changed"] >= 4, out[-3000:]
    assert "RUNNING HANDLER [mcpd : Restart mcpd]" in out
    assert _installed()
    assert run("/usr/sbin/mcpd", "config", "check", "/etc/mcpd/mcpd.yaml").returncode == 0
    assert "port: 9391" in Path("/etc/mcpd/mcpd.yaml").read_text(encoding="utf-8")
    st = os.stat("/etc/mcpd/users.yaml")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)
    assert record.sha256 in Path("/etc/mcpd/users.yaml").read_text(encoding="utf-8")
    assert record.sha256 not in out  # no_log: the digests stay out of the output
    made = run("/usr/sbin/mcpd", "certs", "check")  # mcpd_tls_hosts: a pair the front takes, made once
    assert "the front would use this pair" in made.stdout and "CN=localhost" in made.stdout
    first_pair = Path("/etc/mcpd/tls/server.crt").read_bytes()

    # Second run, same variables: nothing changes, no handler runs.
    status, out, counts = _ansible(tmp_path, _playbook(tmp_path, packages.deb, _grants(["/var/log"]), users))
    assert status == 0 and counts["changed"] == 0, out[-3000:]
    assert "RUNNING HANDLER" not in out
    assert Path("/etc/mcpd/tls/server.crt").read_bytes() == first_pair  # never re-issued over a pair

    # Only the grants change: a reload, not a restart.
    status, out, counts = _ansible(tmp_path, _playbook(tmp_path, packages.deb, _grants(["/var/log", "/etc"]), users))
    assert status == 0 and counts["changed"] == 1, out[-3000:]
    assert "RUNNING HANDLER [mcpd : Reload mcpd grants and users]" in out
    assert "RUNNING HANDLER [mcpd : Restart mcpd]" not in out
    good = grants_path.read_bytes()

    # A broken grants file (paths must be a list of strings) is refused by mcpd grants check; the
    # old one stays.
    status, out, counts = _ansible(tmp_path, _playbook(tmp_path, packages.deb, _grants([7]), users))  # type: ignore[list-item]
    assert status != 0 and counts["failed"] == 1, out[-3000:]
    assert "failed to validate" in out
    assert grants_path.read_bytes() == good
