"""`mcpd jwks fetch` against a real HTTPS server on loopback: a JWK Set of public keys is written
atomically (0644, canonical form) into jwks_file; an unchanged set is not rewritten; a set with a
private or symmetric key, an oversize or malformed answer, an untrusted certificate, a redirect to
plain HTTP, a symlink at the destination or a folder others can write are refused, and the old
file stays as it was (docs/REFERENCE.md, the OAuth key sets)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from mcpd.common.jwkset import MAX_JWKS_BYTES, canonical
from tests.support.https_files import Served, https_server

MCPD = str(Path(sys.executable).parent / "mcpd")


def public_jwks() -> dict[str, Any]:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    okp_key = ed25519.Ed25519PrivateKey.generate()
    keys = [RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True) | {"kid": "r1", "alg": "RS256", "use": "sig"},
            ECAlgorithm.to_jwk(ec_key.public_key(), as_dict=True) | {"kid": "e1", "alg": "ES256"},
            OKPAlgorithm.to_jwk(okp_key.public_key(), as_dict=True) | {"kid": "o1"},
            # Keycloak also publishes an encryption key: public, so it is kept
            RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True) | {"kid": "enc1", "alg": "RSA-OAEP", "use": "enc"}]
    return {"keys": keys}


def private_jwks() -> dict[str, Any]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return {"keys": [RSAAlgorithm.to_jwk(key, as_dict=True) | {"kid": "leak"}]}


@pytest.fixture
def idp(tmp_path: Path) -> Iterator[Served]:
    with https_server(tmp_path / "idp-pki") as served:
        yield served


@pytest.fixture
def site(tmp_path: Path, idp: Served) -> Path:
    """A config with two issuers (corp fetched from the server, other without a jwks_uri)."""
    jwks_dir = tmp_path / "jwks"
    jwks_dir.mkdir(mode=0o755)
    cfg = tmp_path / "mcpd.yaml"
    cfg.write_text(
        "oauth:\n"
        "  resource: https://files.example.com:9091/mcp\n"
        "  issuers:\n"
        f"    - {{name: corp, issuer: '{idp.url}', jwks_uri: '{idp.url}/certs', jwks_file: {jwks_dir}/corp.json,\n"
        "       audiences: [https://files.example.com:9091/mcp], accounts: ['*']}\n"
        f"    - {{name: other, issuer: https://other.example, jwks_file: {jwks_dir}/other.json,\n"
        "       audiences: [x], accounts: ['*']}\n", encoding="utf-8")
    return cfg


def fetch(cfg: Path, *args: str, cafile: str | None) -> subprocess.CompletedProcess[str]:
    extra = ["--cafile", cafile] if cafile else []
    return subprocess.run([MCPD, "jwks", "fetch", "--config", str(cfg), "--timeout", "10", *extra, *args],
                          capture_output=True, text=True, timeout=60, check=False)


def serve(idp: Served, doc: Any, status: int = 200) -> None:
    idp.routes["/certs"] = (status, doc if isinstance(doc, bytes) else json.dumps(doc).encode())


def test_fetch_writes_public_set_atomically_0644(idp: Served, site: Path) -> None:
    doc = public_jwks()
    serve(idp, doc)
    proc = fetch(site, cafile=idp.cafile)
    assert proc.returncode == 0, proc.stderr
    target = site.parent / "jwks" / "corp.json"
    assert "corp: wrote" in proc.stdout and "(4 keys)" in proc.stdout
    assert json.loads(target.read_bytes()) == doc
    assert target.read_bytes() == canonical(doc["keys"])
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in target.parent.iterdir()] == ["corp.json"]  # no temp file left


def test_unchanged_set_is_not_rewritten(idp: Served, site: Path) -> None:
    serve(idp, public_jwks())
    assert fetch(site, cafile=idp.cafile).returncode == 0
    target = site.parent / "jwks" / "corp.json"
    before = target.stat()
    proc = fetch(site, cafile=idp.cafile)
    assert proc.returncode == 0, proc.stderr
    assert "corp: unchanged" in proc.stdout
    after = target.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    serve(idp, public_jwks())  # rotated keys: a new file
    assert "corp: wrote" in fetch(site, cafile=idp.cafile).stdout
    assert target.stat().st_ino != before.st_ino


def refused(idp: Served, site: Path, doc: Any, needle: str, status: int = 200) -> str:
    """Serve ``doc`` after a good set was written: the fetch fails (exit 1) naming ``needle`` and
    the good file stays byte for byte."""
    good = public_jwks()
    serve(idp, good)
    assert fetch(site, cafile=idp.cafile).returncode == 0
    target = site.parent / "jwks" / "corp.json"
    kept = target.read_bytes()
    serve(idp, doc, status)
    proc = fetch(site, cafile=idp.cafile)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert needle in proc.stderr and "kept" in proc.stderr, proc.stderr
    assert target.read_bytes() == kept
    assert [p.name for p in target.parent.iterdir()] == ["corp.json"]
    return proc.stderr


def test_private_key_is_refused(idp: Served, site: Path) -> None:
    stderr = refused(idp, site, private_jwks(), "private key members")
    assert '"d"' not in stderr and "leak" in stderr  # names the key, shows no key material


def test_private_member_on_ec_key_is_refused(idp: Served, site: Path) -> None:
    doc = public_jwks()
    doc["keys"][1]["d"] = "AAAA"
    refused(idp, site, doc, "private key members (d)")


def test_symmetric_key_is_refused(idp: Served, site: Path) -> None:
    doc = public_jwks()
    doc["keys"].append({"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"})
    refused(idp, site, doc, "symmetric (oct)")


def test_oversize_answer_is_refused(idp: Served, site: Path) -> None:
    doc = public_jwks()
    doc["padding"] = "x" * MAX_JWKS_BYTES
    refused(idp, site, doc, f"larger than {MAX_JWKS_BYTES} bytes")


@pytest.mark.parametrize(("doc", "needle"), [
    (b"<html>login</html>", "not JSON"),
    ({"keys": []}, "holds no key"),
    ({"nokeys": 1}, 'no "keys" list'),
    (b'{"keys": [], "keys": [{"kty": "RSA"}]}', "repeats a member name"),
    ({"keys": [{"kty": "RSA", "n": "AQAB"}]}, "not a usable RSA public key"),
    ({"keys": [{"kty": "none"}]}, "kty must be RSA, EC or OKP"),
])
def test_malformed_set_is_refused(idp: Served, site: Path, doc: Any, needle: str) -> None:
    refused(idp, site, doc, needle)


def test_error_status_is_refused(idp: Served, site: Path) -> None:
    refused(idp, site, public_jwks(), "HTTP 500", status=500)


def test_redirect_to_plain_http_is_refused(idp: Served, site: Path) -> None:
    refused(idp, site, b"http://127.0.0.1:9/certs", "not https", status=302)


def test_untrusted_certificate_is_refused(idp: Served, site: Path, tmp_path: Path) -> None:
    """Without the IdP's CA (the system store does not trust it) or with another CA: refused."""
    serve(idp, public_jwks())
    proc = fetch(site, cafile=None)
    assert proc.returncode == 1 and "TLS certificate not trusted" in proc.stderr, proc.stderr
    from mcpd.admin import certs

    other = certs.make_pki(tmp_path / "other-ca", ["127.0.0.1"])
    proc = fetch(site, cafile=str(other.ca_cert))
    assert proc.returncode == 1 and "TLS certificate not trusted" in proc.stderr, proc.stderr
    assert not (site.parent / "jwks" / "corp.json").exists()


def test_symlink_at_destination_is_refused(idp: Served, site: Path, tmp_path: Path) -> None:
    """An attacker's symlink at jwks_file (to a file they want overwritten) is neither followed nor replaced."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n", encoding="utf-8")
    link = site.parent / "jwks" / "corp.json"
    link.symlink_to(victim)
    serve(idp, public_jwks())
    proc = fetch(site, cafile=idp.cafile)
    assert proc.returncode == 1 and "a symlink" in proc.stderr, proc.stderr
    assert link.is_symlink() and victim.read_text(encoding="utf-8") == "precious\n"


def test_folder_others_can_write_is_refused(idp: Served, site: Path) -> None:
    """A jwks folder another account could write (swap the file between check and use): refused."""
    folder = site.parent / "jwks"
    folder.chmod(0o777)
    serve(idp, public_jwks())
    proc = fetch(site, cafile=idp.cafile)
    assert proc.returncode == 1 and "unsafe or missing folder" in proc.stderr, proc.stderr
    assert list(folder.iterdir()) == []


def test_issuer_selection_and_usage_errors(idp: Served, site: Path) -> None:
    serve(idp, public_jwks())
    proc = fetch(site, "--issuer", "nosuch", cafile=idp.cafile)
    assert proc.returncode == 2 and "no issuer nosuch" in proc.stderr
    proc = fetch(site, "--issuer", "other", cafile=idp.cafile)  # written by config management
    assert proc.returncode == 2 and "no issuer with a jwks_uri" in proc.stderr
    proc = fetch(site, "--issuer", "corp", cafile=idp.cafile)
    assert proc.returncode == 0 and idp.requests == ["/certs"]
    broken = site.parent / "broken.yaml"
    broken.write_text("oauth: [\n", encoding="utf-8")
    assert fetch(broken, cafile=None).returncode == 78


def test_unreachable_issuer_keeps_the_old_file(site: Path, idp: Served) -> None:
    serve(idp, public_jwks())
    assert fetch(site, cafile=idp.cafile).returncode == 0
    target = site.parent / "jwks" / "corp.json"
    kept = target.read_bytes()
    text = site.read_text(encoding="utf-8").replace(idp.url + "/certs", "https://127.0.0.1:9/certs")
    site.write_text(text, encoding="utf-8")
    proc = fetch(site, cafile=idp.cafile)
    assert proc.returncode == 1 and "cannot reach it" in proc.stderr, proc.stderr
    assert target.read_bytes() == kept
    assert os.path.exists(target)


@pytest.mark.root
def test_root_by_hand_writes_the_service_accounts_folder_as_its_file(idp: Served, site: Path) -> None:
    """Run as root into mcpd-jwks's folder (as `mcpd jwks fetch` by hand on a host): the new file
    is mcpd-jwks's, as the timer's runs leave it, so the next run of the service can replace it."""
    if os.geteuid() != 0:
        pytest.skip("needs root: chowns to the mcpd-jwks account")
    from mcpd.admin import devroot
    from mcpd.common.oauthconfig import JWKS_USER

    account = devroot.ensure_system_account(JWKS_USER)
    folder = site.parent / "jwks"
    os.chown(folder, account.pw_uid, account.pw_gid)
    serve(idp, public_jwks())
    proc = fetch(site, cafile=idp.cafile)
    assert proc.returncode == 0, proc.stderr
    st = (folder / "corp.json").stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (account.pw_uid, 0o644)


def test_a_trickling_server_gets_one_deadline_for_the_whole_download(tmp_path: Path) -> None:
    """--timeout bounds the whole download: a server sending a byte a second (each read well
    within the timeout) is given up on at the deadline, not after its last byte."""
    import socket
    import ssl
    import threading
    import time

    from mcpd.admin import certs
    from mcpd.admin.jwks import FetchError, download

    pki = certs.make_pki(tmp_path / "pki", ["127.0.0.1"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(pki.server_cert), str(pki.server_key))
    listener = socket.create_server(("127.0.0.1", 0))
    port, stop = listener.getsockname()[1], threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        with ctx.wrap_socket(conn, server_side=True) as tls:
            tls.recv(65536)
            tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
            while not stop.wait(0.5):
                try:
                    tls.sendall(b" ")
                except OSError:
                    return

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        with pytest.raises(FetchError, match="within 2 s"):
            download(f"https://127.0.0.1:{port}/certs", str(pki.ca_cert), 2.0)
        assert time.monotonic() - started < 4
    finally:
        stop.set()
        thread.join(5)
        listener.close()
