"""`mcpd certs fingerprint` prints the certificate's SHA-256 fingerprint (as `openssl x509
-fingerprint -sha256` does) and its public-key pin (curl's `--pinnedpubkey sha256//...`)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import yaml
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from mcpd.admin import certs
from mcpd.admin.cli import main as mcpd_main


def test_fingerprint_and_pin_of_a_file_and_of_the_configured_certificate(tmp_path: Path) -> None:
    pki = certs.make_pki(tmp_path / "tls", ["host.example"])
    cert = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    want_fp = ":".join(f"{b:02X}" for b in cert.fingerprint(hashes.SHA256()))
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    want_pin = base64.b64encode(hashlib.sha256(spki).digest()).decode()
    res = CliRunner().invoke(mcpd_main, ["certs", "fingerprint", str(pki.server_cert)])
    assert res.exit_code == 0, res.output
    assert f"sha256 fingerprint: {want_fp}\n" in res.output
    assert f"public key pin: sha256//{want_pin}\n" in res.output
    assert "subject: CN=host.example\n" in res.output
    conf = tmp_path / "mcpd.yaml"
    conf.write_text(yaml.safe_dump({"tls": {"cert": str(pki.server_cert), "key": str(pki.server_key)}}))
    res = CliRunner().invoke(mcpd_main, ["certs", "fingerprint", "--config", str(conf)])
    assert res.exit_code == 0 and want_fp in res.output, res.output


def test_fingerprint_of_what_is_no_certificate_fails(tmp_path: Path) -> None:
    bad = tmp_path / "x.pem"
    bad.write_text("not\x1b[2J a cert\n")
    res = CliRunner().invoke(mcpd_main, ["certs", "fingerprint", str(bad)])
    assert res.exit_code == 1 and "\x1b" not in res.output


def test_certs_without_dir_or_host_is_a_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(mcpd_main, ["certs", "--dir", str(tmp_path / "t")])
    assert res.exit_code == 2 and "--host" in res.output
    assert not (tmp_path / "t").exists()
