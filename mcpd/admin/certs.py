"""Private CA and server certificates for the TLS listener (docs/REFERENCE.md §1.1), built with
``cryptography``.

``mcpd certs`` and the development mode call :func:`make_pki`. The CA key never leaves the
state folder (mode 0600); nothing here is ever committed to git.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mcpd.front.tls import fingerprint


@dataclass(frozen=True)
class PKI:
    """Paths (PEM files) of a private CA and the server certificate it signed."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_pki(directory: str | Path, hosts: list[str], days: int = 825) -> PKI:
    """Create (or reuse) a private CA and issue a server certificate for ``hosts``.

    Args:
        directory: folder for ``ca.crt``, ``ca.key``, ``server.crt``, ``server.key``; created
            with mode 0700 if missing.
        hosts: DNS names and IP addresses for the subject alternative names
            (e.g. ``["localhost", "127.0.0.1", "::1"]``).
        days: server certificate lifetime in days (825 is the CA/Browser Forum maximum).

    An existing CA in ``directory`` is reused, so clients keep trusting it; the server
    certificate is always re-issued. Keys are ECDSA P-256, written with mode 0600.
    """
    d = Path(directory)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_cert_p, ca_key_p = d / "ca.crt", d / "ca.key"
    now = datetime.datetime.now(datetime.UTC)
    if ca_cert_p.exists() and ca_key_p.exists():
        ca_key = serialization.load_pem_private_key(ca_key_p.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(ca_cert_p.read_bytes())
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mcpd private CA")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                    key_encipherment=False, data_encipherment=False, key_agreement=False,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        _write_private(ca_key_p, ca_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        ca_cert_p.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca_key_p}: expected an EC private key")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else "mcpd")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    server_key_p, server_cert_p = d / "server.key", d / "server.crt"
    _write_private(server_key_p, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    server_cert_p.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return PKI(ca_cert=ca_cert_p, ca_key=ca_key_p, server_cert=server_cert_p, server_key=server_key_p)


@dataclass(frozen=True)
class CertFacts:
    """What an operator pins and checks of a server certificate."""

    fingerprint: str  # SHA-256 of the certificate's DER, upper-case hex pairs joined by ":"
    spki_pin: str  # base64 of the SHA-256 of its SubjectPublicKeyInfo (curl --pinnedpubkey sha256//...)
    subject: str  # RFC 4514
    not_after: datetime.datetime


def describe(pem: bytes) -> CertFacts:
    """The :class:`CertFacts` of the first certificate in ``pem``.

    Raises:
        ValueError: ``pem`` holds no PEM certificate.
    """
    cert = x509.load_pem_x509_certificates(pem)[0]
    der = cert.public_bytes(serialization.Encoding.DER)
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return CertFacts(fingerprint(der),
                     base64.b64encode(hashlib.sha256(spki).digest()).decode(), cert.subject.rfc4514_string(),
                     cert.not_valid_after_utc)
