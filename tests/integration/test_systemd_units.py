"""The shipped systemd units, sysusers and tmpfiles files, checked by systemd's own tools.

`systemd-analyze verify` must print nothing for every unit (warnings count as failures, since
systemd ignores an unknown key with a warning and runs the service without that protection);
`systemd-analyze security --offline=true` scores the sandbox (the helper at most 1.7, with
every item still exposed justified by an `EXPOSED:` comment in the unit); `systemd-sysusers` and
`systemd-tmpfiles` are run for real against a temporary root folder and the resulting owners
and modes are checked (docs/REFERENCE.md §4.5, §5.1: grants and users files are root's, 0600; the policy
process's state and audit folders are mcpd-policy's, 0700, also over an older root-owned layout);
logrotate rotates the audit log as mcpd-policy.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from mcpd.common.config import EXIT_CONFIG
from mcpd.helper import forkserver
from tests.support.privsep_fixture import running_privsep
from tests.support.rootonly import root_prerequisite

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "systemd"
UNIT_FILES = ("mcpd.service", "mcpd-helper.service", "mcpd-helper.socket", "mcpd-jwks.service", "mcpd-jwks.timer")
SHIPPED_BINARY = "/usr/local/bin/mcpd"
HELPER_EXEC = "/usr/bin/python3 -I -m mcpd.helper --config /etc/mcpd/mcpd.yaml"
FRONT_MAX_EXPOSURE = 2.0
HELPER_MAX_EXPOSURE = 1.7  # root with four capabilities

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze is absent (apt-get install -y systemd)"
)


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Parse a unit file into ``{section: {key: [values in order]}}`` (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        if current is None or "=" not in line:
            raise ValueError(f"{path}: unexpected line {raw!r}")
        key, value = line.split("=", 1)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def staged_units(tmp_path: Path) -> Path:
    """Copy the units to ``tmp_path`` with the front's ExecStart pointing at an existing ``mcpd``
    binary (the helper's, /usr/bin/python3, exists wherever systemd-analyze does)."""
    binary = Path(sys.executable).parent / "mcpd"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"{binary} missing: install the package (pip install -e .)")
    for name in UNIT_FILES:
        text = (UNITS / name).read_text(encoding="utf-8")
        (tmp_path / name).write_text(text.replace(SHIPPED_BINARY, str(binary)), encoding="utf-8")
    return tmp_path


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    """Run systemd-analyze with stdout and stderr captured (bounded to 60 seconds)."""
    return subprocess.run(
        [ANALYZE or "systemd-analyze", *args], capture_output=True, text=True, timeout=60, check=False
    )


def exposed_items(unit: Path) -> dict[str, str]:
    """{check name: exposure} for every check `systemd-analyze security` counts against the unit."""
    proc = analyze("security", "--offline=true", "--no-pager", "--json=short", str(unit))
    assert proc.returncode == 0, proc.stdout[-500:] + proc.stderr[-500:]
    return {item["name"]: item["exposure"] for item in json.loads(proc.stdout) if item.get("exposure")}


def exposure(unit: Path) -> float:
    """The "Overall exposure level" (0.0 safest .. 10.0) systemd assigns to a service unit."""
    proc = analyze("security", "--offline=true", "--no-pager", str(unit))
    m = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", proc.stdout)
    if m is None:
        pytest.fail(f"no exposure level for {unit.name}: {proc.stdout[-500:]} {proc.stderr[-500:]}")
    return float(m.group(1))


@needs_analyze
@pytest.mark.parametrize("name", UNIT_FILES)
def test_unit_verifies_without_any_output(tmp_path: Path, name: str) -> None:
    """Every shipped unit passes `systemd-analyze verify` with no warning at all."""
    staged = staged_units(tmp_path)
    proc = analyze("verify", "--no-pager", str(staged / name))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "" and proc.stderr.strip() == "", proc.stdout + proc.stderr


@needs_analyze
def test_verify_catches_a_misspelt_key(tmp_path: Path) -> None:
    """The verify check is not vacuous: an unknown key (a lost protection) produces output."""
    staged = staged_units(tmp_path)
    unit = staged / "mcpd.service"
    unit.write_text(
        unit.read_text(encoding="utf-8").replace("NoNewPrivileges=", "NoNewPrivilegez="),
        encoding="utf-8",
    )
    proc = analyze("verify", "--no-pager", str(unit))
    assert "NoNewPrivilegez" in proc.stdout + proc.stderr


@needs_analyze
def test_sandbox_exposure_front_at_most_2_helper_at_most_1_7(tmp_path: Path) -> None:
    """The front's exposure is ≤ 2.0 and the helper's ≤ 1.7; both scores are printed."""
    staged = staged_units(tmp_path)
    front = exposure(staged / "mcpd.service")
    helper = exposure(staged / "mcpd-helper.service")
    print(f"\nexposure mcpd.service={front:.1f} mcpd-helper.service={helper:.1f}")
    assert front <= FRONT_MAX_EXPOSURE
    assert helper <= HELPER_MAX_EXPOSURE


@needs_analyze
def test_every_exposed_helper_item_is_justified_in_the_unit(tmp_path: Path) -> None:
    """Each check still counted against the helper is named, verbatim, in an `EXPOSED:` comment."""
    unit = staged_units(tmp_path) / "mcpd-helper.service"
    exposed = exposed_items(unit)
    notes = [line for line in unit.read_text(encoding="utf-8").splitlines()
             if line.startswith("#") and "EXPOSED: " in line]
    for name, value in sorted(exposed.items()):
        print(f"{value}  {name}")
    missing = [name for name in exposed if not any(f"EXPOSED: {name}" in line for line in notes)]
    assert exposed and not missing, f"exposed without a justification in the unit: {missing}"


def test_config_broken_exit_status_prevents_restart() -> None:
    """Both services restart on failure except on EXIT_CONFIG (78), as mcpd.common.config promises."""
    for name in ("mcpd.service", "mcpd-helper.service"):
        service = parse_unit(UNITS / name)["Service"]
        assert service["Restart"] == ["on-failure"], name
        assert service["RestartPreventExitStatus"] == [str(EXIT_CONFIG)], name
        assert "--config /etc/mcpd/mcpd.yaml" in service["ExecStart"][0], name
    assert parse_unit(UNITS / "mcpd.service")["Service"]["ExecStart"][0].startswith(SHIPPED_BINARY + " ")


def test_helper_runs_its_own_entry_point_isolated() -> None:
    """The helper unit starts `python3 -I -m mcpd.helper`, not the `mcpd` CLI.
    Type=exec: the helper sends no readiness notification (the socket queues connections)."""
    service = parse_unit(UNITS / "mcpd-helper.service")["Service"]
    assert service["ExecStart"] == [HELPER_EXEC]
    assert service["Type"] == ["exec"] and "NotifyAccess" not in service


@pytest.mark.root
def test_reloading_the_helper_unit_makes_the_policy_process_reload() -> None:
    """`systemctl reload mcpd-helper` runs the unit's ExecReload= with $MAINPID, the root helper,
    which passes SIGHUP on to the policy process: run against a real helper, the grants are
    loaded again although the file did not change (a reload record, "no changes": only SIGHUP
    forces one). `systemctl reload mcpd` is the same command for the front (its TLS pair)."""
    command = parse_unit(UNITS / "mcpd-helper.service")["Service"]["ExecReload"]
    assert command == ["/bin/kill -HUP $MAINPID"] == parse_unit(UNITS / "mcpd.service")["Service"]["ExecReload"]
    with running_privsep() as d:
        def reloads() -> list[dict[str, object]]:
            return [r for r in d.audit() if r.get("event") == "reload" and r.get("load") == "reload" and r["part"] == 1]

        before = len(reloads())
        subprocess.run(shlex.split(command[0].replace("$MAINPID", str(d.helper_pid))), check=True, timeout=10)
        deadline = time.monotonic() + 20
        while len(reloads()) == before:
            assert time.monotonic() < deadline, d.log("helper.log")
            time.sleep(0.05)
        assert reloads()[-1]["reason"] == "no changes"
        assert d.helper is not None and d.helper.poll() is None  # reloaded, not stopped


def test_front_runs_unprivileged_and_notifies_readiness() -> None:
    """The front is Type=notify as user mcpd, with no capability and no new privileges."""
    unit = parse_unit(UNITS / "mcpd.service")
    service = unit["Service"]
    assert service["Type"] == ["notify"] and service["NotifyAccess"] == ["main"]
    assert service["User"] == ["mcpd"] and service["Group"] == ["mcpd"]
    assert service["CapabilityBoundingSet"] == [""]
    assert service["AmbientCapabilities"] == [""]
    assert service["NoNewPrivileges"] == ["yes"]
    assert service["ProtectHome"] == ["yes"]
    assert "mcpd-helper.socket" in unit["Unit"]["Requires"][0].split()
    assert "mcpd-helper.socket" in unit["Unit"]["After"][0].split()


def test_jwks_fetch_runs_unprivileged_writing_only_its_key_folder() -> None:
    """mcpd-jwks.service is a oneshot `mcpd jwks fetch` as its own account, with no capability,
    writing only /var/lib/mcpd-jwks (made 0755 mcpd-jwks by tmpfiles too), reading mcpd.yaml as a
    credential (it is not in the mcpd group, which may read the TLS key), started by the timer at
    boot and every 15 minutes."""
    service = parse_unit(UNITS / "mcpd-jwks.service")["Service"]
    assert service["Type"] == ["oneshot"]
    assert service["User"] == ["mcpd-jwks"] and service["Group"] == ["mcpd-jwks"]
    assert "SupplementaryGroups" not in service and "DynamicUser" not in service
    assert service["ExecStart"] == ["/usr/local/bin/mcpd jwks fetch --config %d/mcpd.yaml"]
    assert service["LoadCredential"] == ["mcpd.yaml:/etc/mcpd/mcpd.yaml"]
    assert service["CapabilityBoundingSet"] == [""] and service["NoNewPrivileges"] == ["yes"]
    assert service["StateDirectory"] == ["mcpd-jwks"] and "ReadWritePaths" not in service
    assert service["ProtectSystem"] == ["strict"] and service["ProtectHome"] == ["yes"]
    assert ("d", "0755", "mcpd-jwks", "mcpd-jwks") in tmpfiles_lines()["/var/lib/mcpd-jwks"]
    timer = parse_unit(UNITS / "mcpd-jwks.timer")
    assert timer["Timer"]["OnBootSec"] and timer["Timer"]["OnUnitActiveSec"] == ["15min"]
    assert timer["Install"]["WantedBy"] == ["timers.target"]


@needs_analyze
def test_jwks_fetch_sandbox_exposure_at_most_2(tmp_path: Path) -> None:
    """The fetcher, which talks to the network, is sandboxed like the front (exposure ≤ 2.0)."""
    score = exposure(staged_units(tmp_path) / "mcpd-jwks.service")
    print(f"\nexposure mcpd-jwks.service={score:.1f}")
    assert score <= FRONT_MAX_EXPOSURE


def test_helper_capabilities_are_exactly_the_justified_set() -> None:
    """The helper keeps only setuid/setgid, read-search and kill (docs/PRIVSEP.md); no netlink, so
    no audit-write either (PAM skips its kernel audit record); no CAP_CHOWN and chown calls
    filtered, since tmpfiles, not root, makes the policy process's folders."""
    service = parse_unit(UNITS / "mcpd-helper.service")["Service"]
    assert "User" not in service  # root, by design
    caps = set(service["CapabilityBoundingSet"][0].split())
    assert caps == {"CAP_SETUID", "CAP_SETGID", "CAP_DAC_READ_SEARCH", "CAP_KILL"}
    assert caps == set(forkserver.KEEP)  # the set the helper itself keeps when started by hand
    denied = [v for v in service["SystemCallFilter"] if v.startswith("~")]
    assert any("@chown" in v.split() or "~@chown" in v.split() for v in denied), denied
    assert service["AmbientCapabilities"] == [""]
    assert service["NoNewPrivileges"] == ["yes"]
    assert service["RestrictAddressFamilies"] == ["AF_UNIX"]
    assert service["ProtectHome"] == ["read-only"]
    assert "PrivateTmp" not in service  # workers must see the host's /tmp


def test_helper_unit_writes_only_the_policy_folders_made_by_tmpfiles() -> None:
    """The policy process's folders (/var/lib/mcpd-helper, /var/log/mcpd) are writable in the
    helper unit but not StateDirectory=/LogsDirectory= (systemd would make them root's and chown
    them back at every start): tmpfiles makes them mcpd-policy's. Nothing else is writable, the
    front's /var/lib/mcpd least of all (docs/REFERENCE.md §4.5a)."""
    service = parse_unit(UNITS / "mcpd-helper.service")["Service"]
    for key in ("StateDirectory", "LogsDirectory", "CacheDirectory", "RuntimeDirectory", "ConfigurationDirectory"):
        assert key not in service, key
    writable = {p.lstrip("-") for v in service.get("ReadWritePaths", []) for p in v.split()}
    assert writable == {"/var/lib/mcpd-helper", "/var/log/mcpd"}
    assert service["ProtectSystem"] == ["strict"]
    lines = tmpfiles_lines()
    for folder in writable:
        assert ("d", "0700", "mcpd-policy", "mcpd-policy") in lines[folder], folder
        assert ("Z", "-", "mcpd-policy", "mcpd-policy") in lines[folder], folder


def tmpfiles_lines() -> dict[str, list[tuple[str, str, str, str]]]:
    """The shipped tmpfiles.d file as ``{path: [(type, mode, user, group), ...]}``."""
    lines: dict[str, list[tuple[str, str, str, str]]] = {}
    for raw in (UNITS / "tmpfiles.d" / "mcpd.conf").read_text(encoding="utf-8").splitlines():
        if raw.strip() and not raw.startswith("#"):
            kind, path, mode, user, group, *_ = raw.split()
            lines.setdefault(path, []).append((kind, mode, user, group))
    return lines


def test_sysusers_declares_the_four_accounts_without_a_shell() -> None:
    """mcpd (the front), mcpd-policy (the policy process), mcpd-walk (walkers) and mcpd-jwks (the
    key set fetcher): system users
    with a group of their own (ID `-`) and no login shell."""
    rows = {}
    for raw in (UNITS / "sysusers.d" / "mcpd.conf").read_text(encoding="utf-8").splitlines():
        if raw.strip() and not raw.startswith("#"):
            kind, name, ident, rest = raw.split(None, 3)
            home, shell = rest.rsplit(None, 2)[-2:]
            rows[name] = (kind, ident, home, shell)
    assert rows == {"mcpd": ("u", "-", "/var/lib/mcpd", "/usr/sbin/nologin"),
                    "mcpd-policy": ("u", "-", "/", "/usr/sbin/nologin"),
                    "mcpd-walk": ("u", "-", "/", "/usr/sbin/nologin"),
                    "mcpd-jwks": ("u", "-", "/", "/usr/sbin/nologin")}


def logrotate_stanzas() -> dict[str, list[str]]:
    """The shipped logrotate file as ``{log path: [directive lines]}``."""
    stanzas: dict[str, list[str]] = {}
    current: list[str] | None = None
    for raw in (REPO / "etc" / "logrotate.d" / "mcpd").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("{"):
            current = stanzas.setdefault(line[:-1].strip(), [])
        elif line == "}":
            current = None
        elif current is not None:
            current.append(" ".join(line.split()))
    return stanzas


def test_logrotate_works_in_each_log_folder_as_its_writer() -> None:
    """The audit log is rotated as mcpd-policy (its writer) and recreated 0600 mcpd-policy, the
    access log as mcpd; never copytruncate (records would be lost)."""
    stanzas = logrotate_stanzas()
    writers = {"/var/log/mcpd/audit.jsonl": "mcpd-policy", "/var/log/mcpd-front/access.jsonl": "mcpd"}
    assert set(stanzas) == set(writers)
    for log, user in writers.items():
        assert f"su {user} {user}" in stanzas[log], log
        assert f"create 0600 {user} {user}" in stanzas[log], log
        assert "copytruncate" not in stanzas[log], log


def test_helper_socket_is_root_and_mcpd_group_only() -> None:
    """The helper socket is /run/mcpd/helper.sock, 0660 root:mcpd (SO_PEERCRED checks follow)."""
    sock = parse_unit(UNITS / "mcpd-helper.socket")["Socket"]
    assert sock["ListenStream"] == ["/run/mcpd/helper.sock"]
    assert sock["SocketUser"] == ["root"] and sock["SocketGroup"] == ["mcpd"]
    assert sock["SocketMode"] == ["0660"]
    assert sock.get("Accept", ["no"]) == ["no"]


@pytest.fixture
def applied_root(tmp_path: Path) -> Path:
    """A temporary root folder with sysusers and tmpfiles applied over pre-existing loose files."""
    if os.geteuid() != 0:
        pytest.skip("needs root: systemd-tmpfiles must chown to the mcpd account")
    for tool in ("systemd-sysusers", "systemd-tmpfiles"):
        root_prerequisite(shutil.which(tool) is not None, f"{tool} is absent (apt-get install -y systemd)")
    root = tmp_path / "root"
    for sub, src in (("sysusers.d", "sysusers.d"), ("tmpfiles.d", "tmpfiles.d")):
        dest = root / "usr/lib" / sub
        dest.mkdir(parents=True)
        shutil.copy(UNITS / src / "mcpd.conf", dest / "mcpd.conf")
    (root / "etc/mcpd/tls").mkdir(parents=True)
    for rel in ("mcpd.yaml", "mcp-sudo.yaml", "users.yaml", "tls/server.key", "tls/server.crt"):
        f = root / "etc/mcpd" / rel
        f.write_text("x\n", encoding="utf-8")
        f.chmod(0o666)  # tmpfiles must tighten every one of them
    for rel in OLD_ROOT_LAYOUT:  # what an older mcpd left as root: tmpfiles hands it to mcpd-policy
        f = root / rel
        f.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        f.write_text("x\n", encoding="utf-8")
        f.chmod(0o600)
    for tool in ("systemd-sysusers", "systemd-tmpfiles"):
        args = [tool, f"--root={root}"]
        if tool == "systemd-tmpfiles":
            args.append("--create")
        proc = subprocess.run(
            [*args, "mcpd.conf"], capture_output=True, text=True, timeout=60, check=False
        )
        assert proc.returncode == 0, proc.stderr
    return root


OLD_ROOT_LAYOUT = ("var/log/mcpd/audit.jsonl", "var/log/mcpd/audit.jsonl.1", "var/lib/mcpd-helper/lockout.json",
                   "var/lib/mcpd-helper/token.0123456789ab")


def _account_ids(root: Path, name: str = "mcpd") -> tuple[int, int]:
    for line in (root / "etc/passwd").read_text(encoding="utf-8").splitlines():
        fields = line.split(":")
        if fields[0] == name:
            if fields[6] != "/usr/sbin/nologin":
                pytest.fail(f"{name} account has a login shell")
            return int(fields[2]), int(fields[3])
    pytest.fail(f"systemd-sysusers did not create the {name} account")


@pytest.mark.root
def test_tmpfiles_grants_and_users_files_root_only(applied_root: Path) -> None:
    """docs/REFERENCE.md §4.5/§5.1: mcp-sudo.yaml and users.yaml end up 0600 root:root, whatever they were."""
    for rel in ("mcp-sudo.yaml", "users.yaml"):
        st = (applied_root / "etc/mcpd" / rel).stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600), rel


@pytest.mark.root
def test_tmpfiles_front_reads_config_and_key_only(applied_root: Path) -> None:
    """The front's group may read mcpd.yaml and the TLS key (0640 root:mcpd), nothing writable."""
    _, gid = _account_ids(applied_root)
    expected = {
        "etc/mcpd": (0, gid, 0o750),
        "etc/mcpd/mcpd.yaml": (0, gid, 0o640),
        "etc/mcpd/tls": (0, gid, 0o750),
        "etc/mcpd/tls/server.key": (0, gid, 0o640),
        "etc/mcpd/tls/server.crt": (0, gid, 0o644),
        "run/mcpd": (0, gid, 0o750),
    }
    for rel, want in expected.items():
        st = (applied_root / rel).stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == want, rel


@pytest.mark.root
def test_tmpfiles_policy_folders_are_mcpd_policy_s_state_folder_mcpd(applied_root: Path) -> None:
    """The audit log folder and /var/lib/mcpd-helper are the policy process's (0700 mcpd-policy,
    a system account of its own, distinct from the front's), and the files an older root-owned
    layout left in them become its own with their mode kept (0600); /var/lib/mcpd is the front's
    (0750 mcpd), and nothing of the policy lies inside the front's folder."""
    uid, gid = _account_ids(applied_root)
    puid, pgid = _account_ids(applied_root, "mcpd-policy")
    assert 0 not in (puid, pgid) and (puid, pgid) != (uid, gid)
    for rel in ("var/log/mcpd", "var/lib/mcpd-helper"):
        st = (applied_root / rel).stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (puid, pgid, 0o700), rel
    for rel in OLD_ROOT_LAYOUT:
        st = (applied_root / rel).stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (puid, pgid, 0o600), rel
    state = (applied_root / "var/lib/mcpd").stat()
    assert (state.st_uid, state.st_gid, stat.S_IMODE(state.st_mode)) == (uid, gid, 0o750)
    assert list((applied_root / "var/lib/mcpd").iterdir()) == []


@pytest.mark.root
def test_logrotate_rotates_the_audit_log_as_mcpd_policy(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A real forced rotation of the shipped audit-log stanza (path moved to a staging folder):
    the old records move to audit.jsonl.1 and the new audit.jsonl is 0600 mcpd-policy, so the
    policy process can go on appending."""
    if os.geteuid() != 0:
        pytest.skip("needs root: logrotate switches to mcpd-policy")
    root_prerequisite(shutil.which("logrotate") is not None, "logrotate is absent (apt-get install -y logrotate)")
    from mcpd.admin import devroot
    from mcpd.common.config import POLICY_USER

    devroot.ensure_system_account(POLICY_USER)
    policy = pwd.getpwnam(POLICY_USER)
    base = Path(tempfile.mkdtemp(prefix="mcpd-logrotate-", dir="/var/tmp"))  # mcpd-policy must reach it
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    base.chmod(0o755)
    logs = base / "mcpd"
    logs.mkdir(mode=0o700)
    os.chown(logs, policy.pw_uid, policy.pw_gid)
    audit = logs / "audit.jsonl"
    audit.write_text('{"seq": 1}\n', encoding="utf-8")
    os.chown(audit, policy.pw_uid, policy.pw_gid)
    audit.chmod(0o600)
    text = (REPO / "etc" / "logrotate.d" / "mcpd").read_text(encoding="utf-8")
    stanza = text[text.index("/var/log/mcpd/audit.jsonl {"):]
    stanza = stanza[: stanza.index("}") + 1].replace("/var/log/mcpd/audit.jsonl", str(audit))
    (tmp_path / "logrotate.conf").write_text(stanza + "\n", encoding="utf-8")
    proc = subprocess.run(["logrotate", "--force", "--state", str(tmp_path / "state"), str(tmp_path / "logrotate.conf")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (logs / "audit.jsonl.1").read_text(encoding="utf-8") == '{"seq": 1}\n'
    st = audit.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), st.st_size) == (policy.pw_uid, policy.pw_gid, 0o600, 0)
