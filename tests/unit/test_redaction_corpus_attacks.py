"""The secret detectors against a corpus an attacker (or an ordinary server) would bring
(docs/REFERENCE.md §3 "Redaction"): real-looking secrets in the formats servers hold them, and
near-misses that are no secret.

A test that passes means the property holds. Every miss (a secret shown whole or in part) and
false positive (text that is no secret replaced) found when this corpus was written is fixed;
the near-misses after them pin what the fixes must not take with them.
"""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from mcpd.common.redaction import DETECTORS
from mcpd.core.redact import redact

PW = b"hunter2-Zq8x"  # the secret every positive hides (no detector keys on its shape)


POSITIVES = [
    # formats the detectors' table claims, and that hold
    pytest.param(b"password\t=\t" + PW + b"\n", id="tabs"),
    pytest.param(b"PASSWORD: " + PW + b"\r\n", id="crlf-yaml"),
    pytest.param(b"export PGPASSWORD='" + PW + b"'\n", id="shell-export"),
    pytest.param(b"  - password=" + PW + b"\n", id="yaml-list-item"),
    pytest.param(b"--password=" + PW + b"\n", id="long-option"),
    pytest.param(b"-----BEGIN RSA PRIVATE KEY-----\r\nMIIE" + PW + b"\r\n-----END RSA PRIVATE KEY-----\r\n",
                 id="pem-crlf"),
    pytest.param(b'key: "-----BEGIN PRIVATE KEY-----\\nMIIE' + PW + b'\\n-----END PRIVATE KEY-----\\n"\n',
                 id="pem-json-escaped"),
    pytest.param(b"-----BEGIN DSA PRIVATE KEY-----\nMIIE" + PW + b"\n", id="pem-without-end"),
    pytest.param(b"db.password=" + PW + b"\n", id="java-properties"),
    pytest.param(b"X-Api-Key: " + PW + b"\n", id="api-key-header"),
    # claimed formats the detectors missed when this corpus was written, all fixed
    pytest.param(b"'password' => '" + PW + b"',\n", id="php-array-arrow"),
    pytest.param(b"redis_url = redis://:" + PW + b"@cache:6379/0\n", id="url-empty-user"),
    pytest.param(b"url = postgres://app:p@" + PW + b"@db/app\n", id="url-password-with-at"),
    pytest.param(b"root:!$6$abcdefgh$ZXCVBNMasdfghjklqwertyuiop1234567890ZXCVBNMasdfghjklqwertyuiop12"
                 b":19000:0:99999:7:::\n", id="shadow-locked-account"),
    pytest.param(b"PASSWORD=abc;" + PW + b"\n", id="env-value-with-semicolon"),
    pytest.param(b'password="pa\\"' + PW + b'"\n', id="escaped-quote"),
    pytest.param(b"password: |\n  " + PW + b"\n", id="yaml-block-scalar"),
    pytest.param(b"password: >-\n  " + PW + b"\n", id="yaml-folded-scalar"),
    pytest.param(b'{"accessToken": "' + PW + b'"}\n', id="camelcase-token"),
    pytest.param(b"userPassword: {SSHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\n", id="ldif-hashed-password"),
    pytest.param(b"POSTGRES_PASSWORD=${POSTGRES_PASSWORD:-" + PW + b"}\n", id="reference-with-default"),
    # real-looking secrets that were outside the table (now in it)
    pytest.param(b"machine api.example.com login alice password " + PW + b"\n", id="netrc"),
    pytest.param(b"define('DB_PASSWORD', '" + PW + b"');\n", id="php-define"),
    pytest.param(b"Authorization: Basic YWxpY2U6aHVudGVyMi1acTh4\n", id="basic-auth"),
    pytest.param(b'{"auths": {"r.io": {"auth": "YWxpY2U6aHVudGVyMi1acTh4"}}}\n', id="docker-config-auth"),
    pytest.param(b"SECRET_KEY = 'django-insecure-" + PW + b"'\n", id="django-secret-key"),
    pytest.param(b"requirepass " + PW + b"\n", id="redis-requirepass"),
    pytest.param(b"PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: k\nPublic-Lines: 1\n"
                 b"AAAAC3NzaC1lZDI1NTE5AAAAIFpub\nPrivate-Lines: 1\nAAAAI" + PW + b"\nPrivate-MAC: 1a2b\n",
                 id="putty-ppk"),
    pytest.param(b"---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nP2/56w" + PW + b"\n"
                 b"---- END SSH2 ENCRYPTED PRIVATE KEY ----\n", id="ssh2-private-key"),
]


@pytest.mark.parametrize("text", POSITIVES)
def test_a_real_looking_secret_is_redacted(text: bytes) -> None:
    out, counts = redact(text, DETECTORS)
    assert counts and out.count(b"\n") == text.count(b"\n")
    for part in (PW, b"hunter2", b"Zq8x", b"YWxpY2U6aHVudGVy", b"W6ph5Mm5", b"ZXCVBNMasdf"):
        assert part not in out, out


NEAR_MISSES = [
    pytest.param(b"password_policy=strict\n", id="policy-setting"),
    pytest.param(b"PasswordAuthentication no\n", id="sshd-option"),
    pytest.param(b"password: ${{ secrets.DB }}\n", id="actions-reference"),
    pytest.param(b"-----BEGIN PUBLIC KEY-----\nMIIBIj\n-----END PUBLIC KEY-----\n", id="public-key"),
    pytest.param(b"git@github.com:org/repo.git\nssh://git@host:22/repo\n", id="scp-and-ssh-urls"),
    pytest.param(b"root:x:0:0:root:/root:/bin/bash\n", id="etc-passwd"),
    pytest.param(b"passwd:         files systemd\n", id="nsswitch-conf"),
    pytest.param(b"if password == expected:\n", id="code-comparison"),
    pytest.param(b"def login(user: str, password: str) -> bool:\n", id="code-annotation"),
    pytest.param(b"max_token: 4096\n", id="numeric-limit"),
    pytest.param(b"error: password: authentication failed for user alice\n", id="log-line"),
    pytest.param(b"grep -q -- '-----BEGIN RSA PRIVATE KEY-----' \"$f\" || exit 1\necho checked\nexit 0\n",
                 id="script-naming-the-begin-line"),
]


@pytest.mark.parametrize("text", NEAR_MISSES)
def test_a_near_miss_is_left_alone(text: bytes) -> None:
    out, counts = redact(text, DETECTORS)
    assert out == text and counts == {}


def _wrapped_key(width: int) -> tuple[bytes, bytes]:
    """A PEM private key base64-encoded again and wrapped at ``width`` columns (GNU ``base64``:
    76, ``openssl base64``: 64), and the PEM."""
    key = ec.generate_private_key(ec.SECP384R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                            serialization.NoEncryption())
    flat = base64.b64encode(pem)
    return b"".join(flat[i:i + width] + b"\n" for i in range(0, len(flat), width)), pem


@pytest.mark.parametrize("width", [76, 64])
def test_a_base64_wrapped_key_shows_none_of_its_lines(width: int) -> None:
    text, pem = _wrapped_key(width)
    out, counts = redact(text, DETECTORS)
    assert counts.get("private-key") == 1
    shown = b"".join(line for line in out.split(b"\n") if line and not line.startswith(b"[REDACTED"))
    decoded = base64.b64decode(shown[:len(shown) - len(shown) % 4]) if shown else b""
    assert not any(body in decoded for body in pem.split(b"\n")[2:-2]), "the PEM's body decodes from what is shown"
    assert not any(line in out for line in text.split(b"\n")[1:] if line), "lines of the encoded key are shown"


@pytest.mark.parametrize(("text", "kept"), [
    # a value cut at ";" or "," only where the next setting starts
    (b"Server=db;Password=" + PW + b";Database=app\n", b";Database=app"),
    (b"{user: bob, password: " + PW + b", host: db}\n", b", host: db}"),
    # a YAML block scalar ends where its indentation does
    (b"db:\n  password: |\n    " + PW + b"\n  host: db\n", b"  host: db\n"),
    # a base64-wrapped key ends at its short last line: the next base64-looking line stays
    (b"LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JSUV" + b"A" * 30 + b"\nQUFB\nSGVsbG8\n", b"SGVsbG8"),
    # a .netrc/redis word: the rest of the line's settings stay
    (b"machine h login alice password " + PW + b" account x\n", b" account x"),
])
def test_a_fix_takes_only_the_secret(text: bytes, kept: bytes) -> None:
    out, counts = redact(text, DETECTORS)
    assert PW not in out and b"QUFB" not in out and counts, out
    assert kept in out and out.count(b"\n") == text.count(b"\n"), out


@pytest.mark.parametrize("text", [
    b"password: correct horse battery staple\n",  # a passphrase of words at a line's start is one
    b"db: {password: correct horse battery staple}\n",  # so is one in a YAML flow mapping
    b"PIN_PASSWORD=123456\n",  # digits are a password when the name says password
])
def test_a_false_positive_fix_keeps_real_secrets(text: bytes) -> None:
    out, counts = redact(text, DETECTORS)
    assert counts.get("assignment") == 1 and out.count(b"[REDACTED:assignment]") == 1, out
