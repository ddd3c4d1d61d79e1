"""Shared by the TLS reload, certificate hook and status tests: a daemon with a module-scoped
fixture, new certificate pairs, installing them and reading the certificate a new handshake gets."""

from __future__ import annotations

import datetime
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mcpd.admin import certs
from mcpd.front.tls import fingerprint
from tests.support.osaccounts import AccountFactory
from tests.support.privsep_fixture import LOG_TEXT, PrivsepDaemon, start_privsep, stop_privsep

WAIT_SECONDS = 20.0
SESSIONS = 16


@dataclass
class Target:
    """What the raw session helpers need of a daemon: its URL, CA and a principal's token."""

    url: str
    cacert: str
    token: str

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.cacert)

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}


@pytest.fixture(scope="module")
def d() -> Iterator[PrivsepDaemon]:
    if os.geteuid() != 0:
        pytest.skip("needs root: starts the root helper and creates OS accounts")
    daemon = start_privsep(AccountFactory(), max_sessions_per_principal=SESSIONS * 2)
    try:
        yield daemon
    finally:
        stop_privsep(daemon)


def served(d: PrivsepDaemon, tls12: bool = False) -> str:
    """The fingerprint of the certificate a new handshake (TLS 1.3, or 1.2 with ``tls12``) gets now."""
    ctx = ssl.create_default_context(cafile=d.cacert)
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    port = int(d.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return fingerprint(der)


def file_fingerprint(pem: bytes) -> str:
    return fingerprint(x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER))


def new_pair(d: PrivsepDaemon) -> tuple[bytes, bytes]:
    """A fresh server certificate and key from the daemon's own CA (``mcpd certs`` reuses a CA in
    its folder)."""
    folder = Path(tempfile.mkdtemp(prefix="mcpd-tls-", dir="/tmp"))
    try:
        for name in ("ca.crt", "ca.key"):
            shutil.copy(d.state_dir / "tls" / name, folder / name)
        pki = certs.make_pki(folder, ["localhost", "127.0.0.1"])
        return pki.server_cert.read_bytes(), pki.server_key.read_bytes()
    finally:
        shutil.rmtree(folder)


def expired_pair(d: PrivsepDaemon) -> tuple[bytes, bytes]:
    """A certificate from the daemon's CA whose validity ended an hour ago, and its key."""
    ca_key = serialization.load_pem_private_key((d.state_dir / "tls" / "ca.key").read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate((d.state_dir / "tls" / "ca.crt").read_bytes())
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old")]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=10)).not_valid_after(now - datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def install(d: PrivsepDaemon, cert: bytes, key: bytes, key_mode: int = 0o640, key_group: int | None = None) -> None:
    """Replace ``server.crt`` then ``server.key`` (each written beside, then renamed over), as an
    ACME deploy hook does."""
    tls = d.state_dir / "tls"
    for name, data, mode, group in (("server.crt", cert, 0o644, d.service.pw_gid),
                                    ("server.key", key, key_mode, d.service.pw_gid if key_group is None else key_group)):
        tmp = tls / f".{name}.{secrets.token_hex(4)}"
        tmp.write_bytes(data)
        os.chown(tmp, 0, group)
        os.chmod(tmp, mode)
        os.replace(tmp, tls / name)


def hup(d: PrivsepDaemon) -> None:
    assert d.front is not None
    d.front.send_signal(signal.SIGHUP)


def wait_served(d: PrivsepDaemon, want: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while (got := served(d)) != want:
        assert d.front is not None and d.front.poll() is None, d.log("front.log")
        assert time.monotonic() < deadline, f"still serving {got}, not {want}"
        time.sleep(0.1)


def refusals(d: PrivsepDaemon) -> list[str]:
    return [ln for ln in d.log("front.log").splitlines() if "tls reload" in ln and "refused" in ln]


def read_call(d: PrivsepDaemon, rid: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
            "params": {"name": "files/read", "arguments": {"path": str(d.log_file), "privileged": True}}}


def assert_read(reply: Any) -> None:
    assert "result" in reply and not reply["result"].get("isError"), reply
    assert LOG_TEXT.splitlines()[0] in json.dumps(reply), reply


def peer_of(response: httpx.Response) -> str:
    """The fingerprint of the certificate on the connection ``response`` came on."""
    der = response.extensions["network_stream"].get_extra_info("ssl_object").getpeercert(binary_form=True)
    return fingerprint(der)
