"""A real install (issue 14): the wheel, built from this tree, installs into a fresh venv, and its
``mcpd install-systemd --root TMP`` stages units that ``systemd-analyze verify`` accepts with no
output, with every shipped file where the units expect it; as root, the staged sysusers and
tmpfiles files are then applied to the staging root, as ``install-systemd`` does on ``/``, and
give the policy process its account and folders. Bounded: each step has a timeout."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mcpd.policy.grants import load_policy

REPO = Path(__file__).resolve().parents[2]
BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "LICENSE", "README.md", "mcpd", "systemd", "etc", "docs", "certs")
ANALYZE = shutil.which("systemd-analyze")


def run(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{args}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    return proc


@pytest.mark.slow
@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is absent (apt-get install -y systemd)")
def test_wheel_installs_into_a_fresh_venv_and_stages_units_systemd_accepts(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    run(sys.executable, "-m", "build", "--wheel", "--outdir", tmp_path / "dist", src)
    wheel = next((tmp_path / "dist").glob("mcpd-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("mcpd/py.typed", "mcpd/share/systemd/mcpd.service", "mcpd/share/systemd/sysusers.d/mcpd.conf",
                    "mcpd/share/etc/pam.d/mcpd", "mcpd/share/etc/mcpd/mcpd.yaml", "mcpd/share/docs/PRIVSEP.md",
                    "mcpd/share/certs/install-pair.sh", "mcpd/share/certs/certbot-deploy-hook.sh"):
        assert shipped in names, shipped
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not [n for n in names if "/ansible/" in n]  # the role runs on the controller, not from a wheel

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "pip", "install", "-q", "--disable-pip-version-check", wheel, timeout=600)
    assert run(venv / "bin" / "mcpd", "--version").stdout.startswith("mcpd ")
    root = tmp_path / "root"
    out = run(venv / "bin" / "mcpd", "install-systemd", "--root", root).stdout
    assert "systemctl" not in out  # a staging root: nothing was run

    units = root / "etc" / "systemd" / "system"
    for name in ("mcpd.service", "mcpd-helper.service", "mcpd-helper.socket", "mcpd-jwks.service", "mcpd-jwks.timer"):
        proc = subprocess.run([ANALYZE or "systemd-analyze", "verify", "--no-pager", str(units / name)],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0 and proc.stdout.strip() == "" and proc.stderr.strip() == "", \
            name + proc.stdout + proc.stderr
    assert f"ExecStart={venv}/bin/mcpd serve " in (units / "mcpd.service").read_text()
    assert f"ExecStart={venv}/bin/mcpd jwks fetch " in (units / "mcpd-jwks.service").read_text()
    helper = (units / "mcpd-helper.service").read_text()
    assert re.search(rf"^ExecStart={re.escape(str(venv))}/bin/python[0-9.]* -I -m mcpd\.helper ", helper, re.M), helper
    for staged in ("etc/sysusers.d/mcpd.conf", "etc/tmpfiles.d/mcpd.conf", "etc/pam.d/mcpd", "etc/logrotate.d/mcpd",
                   "etc/mcpd/mcpd.yaml", "etc/mcpd/mcp-sudo.yaml", "etc/mcpd/users.yaml.example",
                   "etc/mcpd/mcp-sudo.yaml.example", "usr/local/share/doc/mcpd/PRIVSEP.md"):
        assert (root / staged).is_file(), staged
    assert (root / "etc/mcpd/mcp-sudo.yaml").stat().st_mode & 0o777 == 0o600
    granted = load_policy(str(root / "etc/mcpd/mcp-sudo.yaml"), owner_uid=os.geteuid())
    assert (granted.users, granted.groups) == ({}, {})  # a new host grants no privileged read
    for hook in ("install-pair.sh", "certbot-deploy-hook.sh", "acme-sh-reloadcmd.sh"):  # ACME clients run them
        assert (root / "usr/local/lib/mcpd/certs" / hook).stat().st_mode & 0o777 == 0o755, hook
    if os.geteuid() == 0 and shutil.which("systemd-sysusers") and shutil.which("systemd-tmpfiles"):
        apply_staged_accounts_and_folders(root)

    (root / "etc/mcpd/mcpd.yaml").write_text("# the operator's own\n")
    out = run(venv / "bin" / "mcpd", "install-systemd", "--root", root).stdout
    assert f"kept: {root / 'etc/mcpd/mcpd.yaml'}" in out
    assert (root / "etc/mcpd/mcpd.yaml").read_text() == "# the operator's own\n"


def apply_staged_accounts_and_folders(root: Path) -> None:
    """Apply the staged sysusers and tmpfiles files to the staging root (the commands
    ``install-systemd`` runs on ``/``, in its order) over an older root-owned audit log: the
    accounts exist, and the policy process's two folders and that log are ``mcpd-policy``'s."""
    from mcpd.admin.install import ACTIVATE

    (root / "var/log/mcpd").mkdir(mode=0o700, parents=True)
    (root / "var/log/mcpd/audit.jsonl").write_text("{}\n")
    (root / "var/log/mcpd/audit.jsonl").chmod(0o600)  # as the root helper wrote it (UMask=0077)
    for command in ACTIVATE[:2]:
        run(command[0], f"--root={root}", *command[1:-1], Path(command[-1]).name)
    accounts = {line.split(":")[0]: line.split(":") for line in (root / "etc/passwd").read_text().splitlines()}
    assert {"mcpd", "mcpd-policy", "mcpd-walk", "mcpd-jwks"} <= set(accounts)
    uid, gid = int(accounts["mcpd-policy"][2]), int(accounts["mcpd-policy"][3])
    for rel in ("var/lib/mcpd-helper", "var/log/mcpd", "var/log/mcpd/audit.jsonl"):
        st = (root / rel).stat()
        assert (st.st_uid, st.st_gid) == (uid, gid), rel
        assert stat.S_IMODE(st.st_mode) & 0o077 == 0, rel
