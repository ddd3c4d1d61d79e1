"""`mcpd dev` (docs/REFERENCE.md §1.1 development listen address, §5.1 tokens)."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from mcpd.admin import devmode
from mcpd.common import config, identity
from tests.support.net import free_port

BIN = Path(sys.executable).parent


def test_dev_state_folder_is_private_and_complete(tmp_path: Path) -> None:
    state = devmode.prepare(tmp_path / "dev-state", 9191)
    folder = tmp_path / "dev-state"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in ("ca.key", "server.key", "users.yaml"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    cfg = config.load(state.config_path)
    assert (cfg.listen.host, cfg.listen.port) == ("127.0.0.1", 9191)
    assert cfg.helper_socket == ""
    for path in (cfg.users_file, cfg.grants_file, cfg.audit_log, cfg.tls.cert, cfg.tls.key):
        assert Path(path).parent == folder
    assert state.url == "https://127.0.0.1:9191"
    assert state.cacert == folder / "ca.crt" and state.cacert.is_absolute()
    principal = identity.verify(identity.load_users(cfg.users_file), state.token)
    assert principal is not None
    assert (principal.name, principal.os_user) == ("dev", devmode.current_account())


def test_dev_rerun_keeps_folder_ca_and_token_and_other_principals(tmp_path: Path) -> None:
    first = devmode.prepare(tmp_path / "s", 9191)
    ca_before = first.cacert.read_bytes()
    users = identity.load_users(tmp_path / "s" / "users.yaml")
    token_other, rec = identity.new_token()
    users["other"] = identity.UserRecord(name="other", os_user=devmode.current_account(), tokens=[rec])
    identity.save_users(tmp_path / "s" / "users.yaml", users)

    second = devmode.prepare(tmp_path / "s", 9292)
    assert second.cacert.read_bytes() == ca_before
    assert second.token == first.token  # exports in another shell keep working (--new-token replaces it)
    users = identity.load_users(tmp_path / "s" / "users.yaml")
    assert identity.verify(users, second.token) is not None
    assert identity.verify(users, token_other) is not None
    assert config.load(second.config_path).listen.port == 9292


def test_dev_prints_working_exports(tmp_path: Path) -> None:
    if os.geteuid() == 0:  # as root the front runs as `mcpd`, which must be able to enter the folder
        tmp_path = Path(tempfile.mkdtemp(prefix="mcpd-devtest-", dir="/tmp"))
        os.chmod(tmp_path, 0o755)
    try:
        _dev_prints_working_exports(tmp_path)
    finally:
        if os.geteuid() == 0:
            shutil.rmtree(tmp_path, ignore_errors=True)


def _dev_prints_working_exports(tmp_path: Path) -> None:
    from tests.support.devtree import start, stop

    port, metrics_port = free_port(), free_port()
    dev = start(tmp_path / "dev-state", port, "--metrics-port", str(metrics_port), state_arg=False)  # ./dev-state
    try:
        lines = dev.out.lines
        first = next(i for i, line in enumerate(lines) if line.startswith("export "))
        printed = lines[first:first + 4]
        assert printed[0] == f"export MCPD_URL=https://127.0.0.1:{port}\n"
        assert printed[1].startswith("export MCP_TOKEN=mcpd_")
        assert printed[2] == f"export MCPD_CACERT={tmp_path / 'dev-state' / 'ca.crt'}\n"
        assert "linuxctl get files /etc/hosts" in printed[3]

        res = dev.linuxctl("/etc/hosts")  # with the exports it printed
        assert res.returncode == 0, res.stderr
        assert res.stdout == Path("/etc/hosts").read_bytes()
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text  # --metrics-port
        assert 'mcpd_calls_total{' in metrics and 'tool="files/read"' in metrics
    finally:
        assert stop(dev) == (0, [])  # Ctrl-C (SIGINT) ends the foreground server cleanly, and all of it


def test_serve_exits_with_the_servers_code_on_broken_config(tmp_path: Path) -> None:
    bad = tmp_path / "mcpd.yaml"
    bad.write_text("listen: {port: 0}\nno_such_key: 1\n")
    res = subprocess.run([str(BIN / "mcpd"), "serve", "--config", str(bad)], capture_output=True, timeout=60)
    assert res.returncode == config.EXIT_CONFIG


@pytest.mark.root
def test_serve_as_root_refuses_to_start_and_says_what_to_do(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    state = devmode.prepare(tmp_path / "s", free_port())
    env = {k: v for k, v in os.environ.items() if k != "MCPD_ALLOW_ROOT_FRONT"}
    res = subprocess.run([str(BIN / "mcpd"), "serve", "--config", str(state.config_path)], capture_output=True,
                         text=True, timeout=60, env=env)
    assert res.returncode == config.EXIT_CONFIG, res.stderr
    assert "must not run as root" in res.stderr and "mcpd helper" in res.stderr and "runuser -u mcpd" in res.stderr
    with socket.socket() as s:  # it never listened
        assert s.connect_ex(("127.0.0.1", config.load(state.config_path).listen.port)) != 0


def test_certs_command_makes_a_ca_and_server_certificate(tmp_path: Path) -> None:
    from cryptography import x509

    res = subprocess.run([str(BIN / "mcpd"), "certs", "--dir", str(tmp_path / "tls"), "--host", "mcp.example",
                          "--host", "127.0.0.1"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    cert = x509.load_pem_x509_certificate((tmp_path / "tls" / "server.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["mcp.example"]
    assert stat.S_IMODE((tmp_path / "tls" / "ca.key").stat().st_mode) == 0o600
    assert f"ca_cert: {tmp_path / 'tls' / 'ca.crt'}" in res.stdout


def _dev_as_root(state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "mcpd"), "dev", "--port", str(free_port()), "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_dev_as_root_refuses_a_state_folder_another_account_can_change() -> None:
    """As root, `mcpd dev` writes keys, tokens and grants into its state folder, so it refuses a
    folder that another account owns or can write, a folder under one, or a symlink, and writes
    nothing there."""
    if os.geteuid() != 0:
        import pytest

        pytest.skip("needs root")
    nobody = 65534
    base = Path(tempfile.mkdtemp(prefix="mcpd-devstate-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        cases = {}
        owned = base / "owned-by-nobody"
        owned.mkdir()
        os.chown(owned, nobody, nobody)
        cases["owned"] = owned
        loose = base / "world-writable"
        loose.mkdir()
        os.chmod(loose, 0o777)
        cases["loose"] = loose
        parent = base / "their-folder"
        parent.mkdir()
        os.chown(parent, nobody, nobody)
        cases["under"] = parent / "dev-state"  # missing: nobody could swap it before root makes it
        target = base / "target"
        target.mkdir(mode=0o700)
        (base / "link").symlink_to(target)
        cases["symlink"] = base / "link"
        for name, state in cases.items():
            res = _dev_as_root(state)
            assert res.returncode == config.EXIT_CONFIG, (name, res.stdout, res.stderr)
            assert "mcpd dev:" in res.stderr and "MCP_TOKEN" not in res.stdout, (name, res.stderr)
        assert not any(owned.iterdir()) and not any(loose.iterdir()) and not any(parent.iterdir())
        assert not any(target.iterdir())
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.root
def test_dev_as_root_reads_its_config_with_the_strict_loader() -> None:
    """As root, `mcpd dev` adds the root keys to the mcpd.yaml it wrote, reading it with the one
    strict YAML loader: a duplicate key (here a second `listen` that would put the server on every
    address) is refused, not silently won by the last one."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the root setup creates accounts and gives the files to root")
    from mcpd.admin import devroot
    from mcpd.helper.wire.securefile import ConfigFileError

    base = Path(tempfile.mkdtemp(prefix="mcpd-devyaml-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        state = devmode.prepare(base / "s", free_port())
        with open(state.config_path, "a", encoding="utf-8") as f:
            f.write("listen: {host: 0.0.0.0, port: 9191}\n")
        with pytest.raises(ConfigFileError, match="duplicate key 'listen'"):
            devroot.setup_root_state(state)
        assert "helper_socket: run/helper.sock" not in state.config_path.read_text()  # not rewritten
    finally:
        shutil.rmtree(base, ignore_errors=True)
