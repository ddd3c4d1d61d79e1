"""The ACME hook scripts in certs/ install a renewed pair with the right owner and mode and tell
the running daemon, which then serves it: run as certbot and acme.sh run them (their environment
variables), against the real daemon (root helper, front as the service user)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.privsep_fixture import PrivsepDaemon
from tests.support.tls import d, file_fingerprint, new_pair, served, wait_served  # noqa: F401

pytestmark = pytest.mark.root

CERTS = Path(__file__).resolve().parents[2] / "certs"


def run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(CERTS / script)], env={"PATH": os.defpath, **env}, capture_output=True,
                          text=True, timeout=60, check=False)


def certbot_lineage(root: Path, cert: bytes, key: bytes, n: int = 1) -> Path:
    """A certbot-like lineage: live/h/{fullchain,privkey}.pem symlinks into archive/h/ (key 0600 root)."""
    archive, live = root / "archive" / "h", root / "live" / "h"
    archive.mkdir(parents=True, exist_ok=True)
    live.mkdir(parents=True, exist_ok=True)
    for name, data, mode in (("fullchain", cert, 0o644), ("privkey", key, 0o600)):
        target = archive / f"{name}{n}.pem"
        target.write_bytes(data)
        os.chmod(target, mode)
        link = live / f"{name}.pem"
        link.unlink(missing_ok=True)
        link.symlink_to(f"../../archive/h/{name}{n}.pem")
    return live


def installed_as_the_front_needs(d: PrivsepDaemon, cert: bytes, key: bytes) -> None:
    tls = d.state_dir / "tls"
    for name, data, mode in (("server.crt", cert, 0o644), ("server.key", key, 0o640)):
        st = os.lstat(tls / name)
        assert stat.S_ISREG(st.st_mode) and (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == \
            (0, d.service.pw_gid, mode), name
        assert (tls / name).read_bytes() == data
    assert not [p for p in os.listdir(tls) if p.startswith(".server.")]  # no temporary file left


def hook_env(d: PrivsepDaemon) -> dict[str, str]:
    return {"MCPD_TLS_DIR": str(d.state_dir / "tls"), "MCPD_RELOAD": f"kill -HUP {d.front_pid}"}


def test_certbot_deploy_hook_installs_the_renewal_and_the_front_serves_it(d: PrivsepDaemon, tmp_path: Path) -> None:
    cert, key = new_pair(d)
    live = certbot_lineage(tmp_path / "le", cert, key)
    proc = run("certbot-deploy-hook.sh", {**hook_env(d), "RENEWED_LINEAGE": str(live),
                                          "RENEWED_DOMAINS": "localhost 127.0.0.1"})
    assert proc.returncode == 0, proc.stderr
    installed_as_the_front_needs(d, cert, key)
    wait_served(d, file_fingerprint(cert))


def test_certbot_deploy_hook_leaves_other_lineages_alone(d: PrivsepDaemon, tmp_path: Path) -> None:
    before = (d.state_dir / "tls" / "server.crt").read_bytes()
    cert, key = new_pair(d)
    live = certbot_lineage(tmp_path / "le", cert, key)
    proc = run("certbot-deploy-hook.sh", {**hook_env(d), "RENEWED_LINEAGE": str(live),
                                          "RENEWED_DOMAINS": "other.example", "MCPD_DOMAIN": "localhost"})
    assert proc.returncode == 0, proc.stderr
    assert (d.state_dir / "tls" / "server.crt").read_bytes() == before


def test_certbot_deploy_hook_without_its_lineage_changes_nothing(d: PrivsepDaemon, tmp_path: Path) -> None:
    before = {n: (d.state_dir / "tls" / n).read_bytes() for n in ("server.crt", "server.key")}
    proc = run("certbot-deploy-hook.sh", hook_env(d))
    assert proc.returncode != 0 and "RENEWED_LINEAGE" in proc.stderr
    proc = run("certbot-deploy-hook.sh", {**hook_env(d), "RENEWED_LINEAGE": str(tmp_path / "missing")})
    assert proc.returncode != 0 and "nothing installed" in proc.stderr
    assert {n: (d.state_dir / "tls" / n).read_bytes() for n in before} == before


def test_acme_sh_reloadcmd_installs_the_renewal_and_the_front_serves_it(d: PrivsepDaemon, tmp_path: Path) -> None:
    cert, key = new_pair(d)
    home = tmp_path / ".acme.sh" / "localhost_ecc"
    home.mkdir(parents=True)
    (home / "fullchain.cer").write_bytes(cert)
    (home / "localhost.key").write_bytes(key)
    os.chmod(home / "localhost.key", 0o600)
    proc = run("acme-sh-reloadcmd.sh", {**hook_env(d), "CERT_FULLCHAIN_PATH": str(home / "fullchain.cer"),
                                        "CERT_KEY_PATH": str(home / "localhost.key"), "Le_Domain": "localhost"})
    assert proc.returncode == 0, proc.stderr
    installed_as_the_front_needs(d, cert, key)
    wait_served(d, file_fingerprint(cert))
    shutil.rmtree(tmp_path / ".acme.sh")
