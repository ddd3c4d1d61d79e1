"""Which certificate/key pairs the front takes (at start and on every reload): each file opened
once and checked on its descriptor, the key the leaf's, the leaf valid now; every refusal says
why without key material."""

from __future__ import annotations

import datetime
import os
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mcpd.admin import certs
from mcpd.front import tls


def issue(folder: Path, start: datetime.timedelta, end: datetime.timedelta,
          encrypt: bool = False) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "t")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now + start).not_valid_after(now + end).sign(key, hashes.SHA256()))
    folder.mkdir(exist_ok=True)
    c, k = folder / "c.pem", folder / "k.pem"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    algo = serialization.BestAvailableEncryption(b"pw") if encrypt else serialization.NoEncryption()
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, algo))
    os.chmod(k, 0o600)
    return c, k


@pytest.fixture()
def pki(tmp_path: Path) -> certs.PKI:
    return certs.make_pki(tmp_path / "tls", ["localhost"])


def refused(cert: Path, key: Path) -> str:
    with pytest.raises(tls.PairError) as info:
        tls.read_pair(str(cert), str(key))
    text = str(info.value)
    assert "PRIVATE KEY" not in text
    if key.is_file():
        assert key.read_bytes().decode(errors="replace")[40:80] not in text
    return text


def test_a_good_pair_loads_and_its_context_serves_it(pki: certs.PKI) -> None:
    pair = tls.read_pair(str(pki.server_cert), str(pki.server_key))
    assert pair.subject == "CN=localhost"
    assert pair.fingerprint == certs.describe(pki.server_cert.read_bytes()).fingerprint
    ctx = tls.context_for(pair)
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2


def test_a_key_followed_through_a_symlink_is_taken(pki: certs.PKI, tmp_path: Path) -> None:
    link = tmp_path / "privkey.pem"
    link.symlink_to(pki.server_key)
    tls.read_pair(str(pki.server_cert), str(link))


def test_the_key_of_another_certificate_is_refused(pki: certs.PKI, tmp_path: Path) -> None:
    other = certs.make_pki(tmp_path / "other", ["localhost"])
    assert "is not the key of the certificate" in refused(pki.server_cert, other.server_key)


def test_a_key_every_account_may_read_is_refused(pki: certs.PKI) -> None:
    os.chmod(pki.server_key, 0o644)
    assert "readable by every account" in refused(pki.server_cert, pki.server_key)


def test_a_certificate_every_account_may_write_is_refused(pki: certs.PKI) -> None:
    os.chmod(pki.server_cert, 0o666)
    assert "writable by every account" in refused(pki.server_cert, pki.server_key)


def test_a_missing_file_and_a_folder_are_refused(pki: certs.PKI, tmp_path: Path) -> None:
    assert "cannot open the key" in refused(pki.server_cert, tmp_path / "none")
    assert "not a regular file" in refused(tmp_path, pki.server_key)


def test_a_file_past_the_size_bound_is_refused(pki: certs.PKI) -> None:
    with open(pki.server_cert, "ab") as f:
        f.write(b"#" * tls.MAX_PEM_BYTES)
    assert "larger than" in refused(pki.server_cert, pki.server_key)


def test_an_expired_or_not_yet_valid_certificate_is_refused(tmp_path: Path) -> None:
    day = datetime.timedelta(days=1)
    c, k = issue(tmp_path / "old", -2 * day, -datetime.timedelta(seconds=1))
    assert "expired at" in refused(c, k)
    c, k = issue(tmp_path / "early", datetime.timedelta(hours=1), day)
    assert "is not valid before" in refused(c, k)
    c, k = issue(tmp_path / "skew", datetime.timedelta(minutes=2), day)  # within the clock skew allowed
    tls.read_pair(str(c), str(k))


def test_an_encrypted_key_and_garbage_are_refused(tmp_path: Path, pki: certs.PKI) -> None:
    c, k = issue(tmp_path / "enc", -datetime.timedelta(minutes=1), datetime.timedelta(days=1), encrypt=True)
    assert "is encrypted" in refused(c, k)
    pki.server_cert.write_text("nothing here\n")
    assert "holds no PEM certificate" in refused(pki.server_cert, pki.server_key)


def test_a_refused_reload_keeps_the_pair_in_use_and_records_why(pki: certs.PKI, tmp_path: Path) -> None:
    live = tls.LiveCertificate(str(pki.server_cert), str(pki.server_key), str(tmp_path))
    before, context = live.pair.fingerprint, live.context
    good_key = pki.server_key.read_bytes()
    other = certs.make_pki(tmp_path / "other", ["localhost"])
    pki.server_key.write_bytes(other.server_key.read_bytes())
    assert live.reload("test") is False
    assert live.pair.fingerprint == before and live.context is context and live.refused
    state = (tmp_path / tls.STATE_FILE).read_text()
    assert '"last_check_ok": false' in state and "is not the key" in state
    pki.server_key.write_bytes(good_key)
    assert live.reload("test") is True and live.refused is None and live.context is context


@pytest.mark.parametrize("mode", [0o660, 0o620, 0o670])
def test_a_key_its_group_may_write_is_refused(pki: certs.PKI, mode: int) -> None:
    """certs/README: no other account may write the key. A key its group (the front's, say) may
    write could be replaced by that group's accounts with a key of their own."""
    os.chmod(pki.server_key, mode)
    assert f"the key {pki.server_key} is writable by its group" in refused(pki.server_cert, pki.server_key)
    os.chmod(pki.server_key, 0o640)
    os.chmod(pki.server_cert, 0o664)
    assert "is writable by its group" in refused(pki.server_cert, pki.server_key)


@pytest.mark.root
def test_a_key_owned_by_another_account_is_refused(pki: certs.PKI) -> None:
    os.chown(pki.server_key, 65534, 0)  # nobody's: that account could rewrite it
    text = refused(pki.server_cert, pki.server_key)
    assert "is owned by uid 65534, neither root nor the account that reads it" in text
    tls.read_pair(str(pki.server_cert), str(pki.server_key), owners=[65534])  # (the service account's: taken)
    os.chown(pki.server_key, 0, 0)
    tls.read_pair(str(pki.server_cert), str(pki.server_key))


def test_a_reload_refuses_a_group_writable_key_and_keeps_the_pair(pki: certs.PKI, tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    live = tls.LiveCertificate(str(pki.server_cert), str(pki.server_key), str(tmp_path))
    before, context = live.pair.fingerprint, live.context
    os.chmod(pki.server_key, 0o660)
    with caplog.at_level("ERROR", logger="mcpd.front.tls"):
        assert live.reload("test") is False
    assert live.pair.fingerprint == before and live.context is context
    assert any("refused, the certificate in use" in r.getMessage() and "writable by its group" in r.getMessage()
               for r in caplog.records), caplog.records
    os.chmod(pki.server_key, 0o640)
    assert live.reload("test") is True
