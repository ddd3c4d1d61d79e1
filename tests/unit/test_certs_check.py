"""`mcpd certs check` judges a certificate and key as the front does before it uses them
(mcpd.front.tls.read_pair and OpenSSL), binding nothing: exit 0 for a pair the front takes, 1 with
the reason for one it would refuse; a missing file is named with the command that makes one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mcpd.admin import certs
from mcpd.admin.cli import main as mcpd_main


def check(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(mcpd_main, ["certs", "check", *args])
    return res.exit_code, res.output


@pytest.fixture
def pki(tmp_path: Path) -> certs.PKI:
    return certs.make_pki(tmp_path / "tls", ["host.example"])


def test_a_good_pair_passes_by_name_and_from_the_configuration(pki: certs.PKI, tmp_path: Path) -> None:
    code, out = check("--cert", str(pki.server_cert), "--key", str(pki.server_key))
    assert code == 0 and "the front would use this pair" in out and "subject: CN=host.example" in out, out
    conf = tmp_path / "mcpd.yaml"
    conf.write_text(yaml.safe_dump({"tls": {"cert": str(pki.server_cert), "key": str(pki.server_key)}}))
    code, out = check("--config", str(conf))
    assert code == 0, out


def test_a_pair_the_front_would_refuse_fails_with_its_reason(pki: certs.PKI, tmp_path: Path) -> None:
    other = certs.make_pki(tmp_path / "other", ["host.example"])
    code, out = check("--cert", str(pki.server_cert), "--key", str(other.server_key))
    assert code == 1 and "is not the key of the certificate" in out, out
    garbage = tmp_path / "garbage.key"
    garbage.write_text("-----BEGIN PRIVATE KEY-----\ngarbage\n")
    garbage.chmod(0o600)
    code, out = check("--cert", str(pki.server_cert), "--key", str(garbage))
    assert code == 1 and "holds no usable PEM private key" in out, out
    code, out = check("--cert", str(pki.server_key), "--key", str(pki.server_key))
    assert code == 1 and "holds no PEM certificate" in out, out
    os.chmod(pki.server_key, 0o644)
    code, out = check("--cert", str(pki.server_cert), "--key", str(pki.server_key))
    assert code == 1 and "readable by every account" in out, out


def test_a_missing_file_is_named_with_the_command_that_makes_one(pki: certs.PKI, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "server.crt"
    code, out = check("--cert", str(missing), "--key", str(pki.server_key))
    assert code == 1 and f"no file {missing}" in out and f"mcpd certs --dir {missing.parent} --host NAME" in out, out
    res = CliRunner().invoke(mcpd_main, ["certs", "fingerprint", str(missing)])
    assert res.exit_code == 1 and f"no file {missing}" in res.output and "mcpd certs --dir" in res.output, res.output
    assert "Errno" not in res.output


def test_only_one_of_cert_and_key_is_a_usage_error(pki: certs.PKI) -> None:
    code, out = check("--cert", str(pki.server_cert))
    assert code == 2 and "both --cert and --key" in out
