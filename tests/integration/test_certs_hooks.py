"""The ACME hook scripts in certs/ install a renewed pair with the right owner and mode and tell
the running daemon, which then serves it: run as certbot and acme.sh run them (their environment
variables), against the real daemon (root helper, front as the service user). A pair the front
would refuse (a key of another certificate, a key that is no key) is refused before anything is
replaced: the hook fails, the pair on disk stays, no reload runs."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.privsep_fixture import PrivsepDaemon
from tests.support.tls import d, file_fingerprint, new_pair, served, wait_served  # noqa: F401

pytestmark = pytest.mark.root

CERTS = Path(__file__).resolve().parents[2] / "certs"
MCPD = str(Path(sys.executable).parent / "mcpd")  # this checkout's command (install-pair.sh's MCPD_BIN)


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
    return {"MCPD_TLS_DIR": str(d.state_dir / "tls"), "MCPD_RELOAD": f"kill -HUP {d.front_pid}", "MCPD_BIN": MCPD}


def on_disk(d: PrivsepDaemon) -> dict[str, tuple[bytes, int, int, int]]:
    """Every file of the daemon's TLS folder: its bytes, owner, group and mode."""
    out = {}
    for path in sorted((d.state_dir / "tls").iterdir()):
        st = os.lstat(path)
        out[path.name] = (path.read_bytes(), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
    return out


def test_a_good_pair_keeps_the_one_it_replaces_as_prev(d: PrivsepDaemon, tmp_path: Path) -> None:
    before = on_disk(d)
    cert, key = new_pair(d)
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    proc = subprocess.run(["sh", str(CERTS / "install-pair.sh"), str(tmp_path / "c.pem"), str(tmp_path / "k.pem")],
                          env={"PATH": os.defpath, **hook_env(d)}, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    installed_as_the_front_needs(d, cert, key)
    after = on_disk(d)
    assert after["server.crt.prev"] == before["server.crt"] and after["server.key.prev"] == before["server.key"]
    wait_served(d, file_fingerprint(cert))


@pytest.mark.parametrize("bad", ["a key of another certificate", "a key that is no key"])
@pytest.mark.parametrize("hook", ["certbot-deploy-hook.sh", "acme-sh-reloadcmd.sh"])
def test_a_pair_the_front_would_refuse_is_not_installed_and_the_hook_fails(
        d: PrivsepDaemon, tmp_path: Path, hook: str, bad: str) -> None:
    cert, key = new_pair(d)
    key = new_pair(d)[1] if bad == "a key of another certificate" else b"-----BEGIN PRIVATE KEY-----\ngarbage\n"
    before, good = on_disk(d), served(d)
    reloaded = tmp_path / "reloaded"
    env = {**hook_env(d), "MCPD_RELOAD": f"touch {reloaded}"}
    if hook == "certbot-deploy-hook.sh":
        env["RENEWED_LINEAGE"] = str(certbot_lineage(tmp_path / "le", cert, key))
    else:
        (tmp_path / "fullchain.cer").write_bytes(cert)
        (tmp_path / "h.key").write_bytes(key)
        env.update(CERT_FULLCHAIN_PATH=str(tmp_path / "fullchain.cer"), CERT_KEY_PATH=str(tmp_path / "h.key"))
    proc = run(hook, env)
    assert proc.returncode != 0 and "refused, nothing installed" in proc.stderr, proc.stderr
    assert ("is not the key of the certificate" if bad == "a key of another certificate"
            else "holds no usable PEM private key") in proc.stderr
    assert on_disk(d) == before  # the pair in place, untouched; no temporary file left
    assert not reloaded.exists()  # no reload was asked for
    assert served(d) == good


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


def as_service(d: PrivsepDaemon, *argv: str) -> None:
    """Run ``argv`` as the daemon's service account (the front's): the account that would plant."""
    uid, gid = d.service.pw_uid, d.service.pw_gid
    subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *argv], check=True, timeout=30)


@pytest.mark.parametrize("how", ["the folder is group-writable", "the folder is the service account's",
                                 "a folder above it is the service account's"])
def test_a_destination_another_account_can_write_to_is_refused(d: PrivsepDaemon, tmp_path: Path, how: str) -> None:
    """The service account (the network-facing front's) could write in the TLS folder: it plants
    symlinks to a root file at the names root would write; the installer writes nothing there,
    follows no symlink, and fails."""
    tls = d.state_dir / "tls"
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's own\n")
    os.chmod(tmp_path, 0o755)
    os.chmod(victim, 0o600)
    cert, key = new_pair(d)
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    env = hook_env(d)
    reloaded = tmp_path / "reloaded"
    env["MCPD_RELOAD"] = f"touch {reloaded}"
    st = os.stat(tls)
    saved = on_disk(d)
    above = tmp_path / "svc"
    try:
        if how == "the folder is group-writable":
            os.chmod(tls, 0o770)
            target, says = tls, "is writable by its group or every account"
        elif how == "the folder is the service account's":
            os.chown(tls, d.service.pw_uid, d.service.pw_gid)
            target, says = tls, f"is owned by uid {d.service.pw_uid}, not root"
        else:
            above.mkdir()
            os.chown(above, d.service.pw_uid, d.service.pw_gid)
            target = above / "tls"
            target.mkdir(mode=0o750)
            shutil.copy2(tls / "server.crt", target / "server.crt")
            env["MCPD_TLS_DIR"] = str(target)
            says = f"{above} is owned by uid {d.service.pw_uid}, not root"
        if how != "a folder above it is the service account's":
            as_service(d, "ln", "-sfn", str(victim), str(target / "server.key.prev"))  # (it may unlink root's)
            as_service(d, "ln", "-sfn", str(victim), str(target / ".server.key.prev"))
        before = on_disk(d)
        proc = subprocess.run(
            ["sh", str(CERTS / "install-pair.sh"), str(tmp_path / "c.pem"), str(tmp_path / "k.pem")],
            env={"PATH": os.defpath, **env}, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 1, proc.stderr
        assert says in proc.stderr and "nothing installed" in proc.stderr
        assert victim.read_bytes() == b"root's own\n" and stat.S_IMODE(os.stat(victim).st_mode) == 0o600
        assert os.stat(victim).st_gid == 0
        assert on_disk(d) == before and not reloaded.exists()
        assert not [p for p in os.listdir(target) if p.startswith(".server.") and p != ".server.key.prev"]
    finally:
        for planted in ("server.key.prev", ".server.key.prev"):
            if (tls / planted).is_symlink():
                (tls / planted).unlink()
                if planted in saved:
                    data, uid, gid, mode = saved[planted]
                    (tls / planted).write_bytes(data)
                    os.chown(tls / planted, uid, gid)
                    os.chmod(tls / planted, mode)
        os.chown(tls, st.st_uid, st.st_gid)
        os.chmod(tls, stat.S_IMODE(st.st_mode))
        shutil.rmtree(above, ignore_errors=True)


def test_the_pair_it_replaces_is_kept_even_when_the_key_is_a_symlink(d: PrivsepDaemon, tmp_path: Path) -> None:
    """An operator pointed server.key at a file elsewhere: its .prev is that key's bytes, a file
    of its own (0640 root:mcpd), and the new key replaces the symlink, not the file it points to."""
    tls = d.state_dir / "tls"
    keys = d.state_dir / "keys"
    keys.mkdir(mode=0o750, exist_ok=True)
    os.chown(keys, 0, d.service.pw_gid)
    old_key = (tls / "server.key").read_bytes()
    elsewhere = keys / "server.key"
    elsewhere.write_bytes(old_key)
    os.chown(elsewhere, 0, d.service.pw_gid)
    os.chmod(elsewhere, 0o640)
    (tls / "server.key").unlink()
    (tls / "server.key").symlink_to(elsewhere)
    cert, key = new_pair(d)
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    proc = subprocess.run(["sh", str(CERTS / "install-pair.sh"), str(tmp_path / "c.pem"), str(tmp_path / "k.pem")],
                          env={"PATH": os.defpath, **hook_env(d)}, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    installed_as_the_front_needs(d, cert, key)
    prev = os.lstat(tls / "server.key.prev")
    assert stat.S_ISREG(prev.st_mode) and (prev.st_uid, prev.st_gid, stat.S_IMODE(prev.st_mode)) == \
        (0, d.service.pw_gid, 0o640)
    assert (tls / "server.key.prev").read_bytes() == old_key
    assert elsewhere.read_bytes() == old_key  # the file it pointed to, untouched
    wait_served(d, file_fingerprint(cert))


def test_a_killed_install_leaves_no_temporary_file(d: PrivsepDaemon, tmp_path: Path) -> None:
    """Stopped (SIGTERM to its process group) while the pair is being checked: its temporary
    files are removed, the pair in place is untouched."""
    cert, key = new_pair(d)
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    slow = tmp_path / "slow-mcpd"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    os.chmod(slow, 0o755)
    before = on_disk(d)
    proc = subprocess.Popen(["sh", str(CERTS / "install-pair.sh"), str(tmp_path / "c.pem"), str(tmp_path / "k.pem")],
                            env={"PATH": os.defpath, **hook_env(d), "MCPD_BIN": str(slow)}, start_new_session=True,
                            stderr=subprocess.DEVNULL)
    try:
        tls = d.state_dir / "tls"
        for _ in range(200):
            if len([p for p in os.listdir(tls) if p.startswith(".server.")]) == 2:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the installer made no temporary files")
        time.sleep(0.2)  # (in the check now)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(20) != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert on_disk(d) == before  # no temporary file left, nothing replaced
