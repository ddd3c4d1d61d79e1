"""Secret detectors (docs/REFERENCE.md §3 "Redaction"): every positive of the corpus in
``tests/data/redaction/`` is redacted as its kind, no near-miss is touched, private keys made at
test time vanish whole, line counts never change, and pathological input stays linear."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from mcpd.common.redaction import DETECTORS, RedactError, describe, from_args, parse_redact, with_redaction
from mcpd.core.redact import inside_at, literal_marks, redact, redact_text, starts_inside, still_inside

CORPUS = Path(__file__).resolve().parents[1] / "data" / "redaction"


def _hits() -> list[tuple[str, str]]:
    out = []
    for line in (CORPUS / "hits.tsv").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            kind, _, text = line.partition("\t")
            out.append((kind, text))
    return out


def _near_misses() -> list[str]:
    return [x for x in (CORPUS / "near-misses.txt").read_text(encoding="utf-8").splitlines() if not x.startswith("#")]


@pytest.mark.parametrize(("kind", "text"), _hits())
def test_each_corpus_secret_is_redacted_as_its_kind(kind: str, text: str) -> None:
    out, counts = redact_text(text, DETECTORS)
    assert counts == {kind: 1}, (text, out)
    assert f"[REDACTED:{kind}]" in out


@pytest.mark.parametrize(("kind", "text"), _hits())
def test_a_detector_alone_finds_its_kind(kind: str, text: str) -> None:
    out, counts = redact_text(text, (kind,))
    assert counts == {kind: 1} and f"[REDACTED:{kind}]" in out


def test_the_secret_itself_is_gone() -> None:
    cases = {"password=hunter2": "hunter2", "postgres://app:s3cr3t-Pa55@db:5432/x": "s3cr3t-Pa55",
             "key AKIAIOSFODNN7EXAMPLE here": "AKIAIOSFODNN7EXAMPLE", '"password": "p@ss w0rd",': "p@ss w0rd",
             "Authorization: Bearer 9f8e7d6c5b4a39281706f5e4d3c2b1a0": "9f8e7d6c5b4a3928"}
    for text, secret in cases.items():
        out, _ = redact_text(text, DETECTORS)
        assert secret not in out, out
    assert redact_text("password=hunter2", DETECTORS)[0] == "password=[REDACTED:assignment]"
    assert redact_text("postgres://app:pw@db/x", DETECTORS)[0] == "postgres://app:[REDACTED:url-password]@db/x"
    assert redact_text('"password": "x",', DETECTORS)[0] == '"password": "[REDACTED:assignment]",'


def test_no_near_miss_is_redacted() -> None:
    text = "\n".join(_near_misses()) + "\n"
    out, counts = redact_text(text, DETECTORS)
    assert counts == {} and out == text


def test_other_detectors_leave_a_kind_alone() -> None:
    out, counts = redact_text("password=hunter2 ghp_1234567890abcdefghijABCDEFGHIJ123456", ("token",))
    assert out == "password=hunter2 [REDACTED:token]" and counts == {"token": 1}


def test_one_secret_is_counted_once_whatever_detectors_overlap() -> None:
    out, counts = redact_text("password=ghp_1234567890abcdefghijABCDEFGHIJ123456\n"
                              "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n", DETECTORS)
    assert counts == {"token": 1, "cloud-key": 1}, out


def _keys() -> dict[str, bytes]:
    r = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    e = ec.generate_private_key(ec.SECP256R1())
    ed = ed25519.Ed25519PrivateKey.generate()
    pem, raw = serialization.Encoding.PEM, serialization.NoEncryption()
    fmt = serialization.PrivateFormat
    return {
        "pkcs8": r.private_bytes(pem, fmt.PKCS8, raw),
        "rsa": r.private_bytes(pem, fmt.TraditionalOpenSSL, raw),
        "ec": e.private_bytes(pem, fmt.TraditionalOpenSSL, raw),
        "encrypted": r.private_bytes(pem, fmt.PKCS8, serialization.BestAvailableEncryption(b"pw")),
        "openssh": ed.private_bytes(pem, fmt.OpenSSH, raw),
        "openssh-rsa": r.private_bytes(pem, fmt.OpenSSH, raw),
    }


@pytest.mark.parametrize("name", ["pkcs8", "rsa", "ec", "encrypted", "openssh", "openssh-rsa"])
def test_a_private_key_block_goes_whole_and_keeps_its_lines(name: str) -> None:
    key = _keys()[name]
    data = b"before\n" + key + b"after\n"
    out, counts = redact(data, DETECTORS)
    assert counts == {"private-key": 1}
    assert out.count(b"\n") == data.count(b"\n")
    lines = out.split(b"\n")
    assert lines[0] == b"before" and lines[1] == b"[REDACTED:private-key]" and lines[-2] == b"after"
    body = [x for x in key.split(b"\n")[1:-2] if len(x) > 8]
    assert body and not any(x in out for x in body)


def test_a_key_cut_by_the_end_of_the_text_goes_to_the_end() -> None:
    key = _keys()["pkcs8"]
    cut = key[: len(key) // 2]
    out, counts = redact(b"x\n" + cut, DETECTORS)
    assert out == b"x\n[REDACTED:private-key]" + b"\n" * cut.count(b"\n") and counts == {"private-key": 1}


def test_a_text_that_starts_inside_a_key_is_redacted_to_its_end_line() -> None:
    key = _keys()["rsa"]
    lines = key.split(b"\n")
    before, after = b"\n".join(lines[:5]) + b"\n", b"\n".join(lines[5:]) + b"tail\n"
    assert starts_inside(before) and not starts_inside(key) and not starts_inside(b"plain\n")
    out, counts = redact(after, DETECTORS, inside=True)
    assert counts == {"private-key": 1} and out.count(b"\n") == after.count(b"\n")
    assert out.startswith(b"[REDACTED:private-key]\n") and out.endswith(b"\ntail\n")
    assert not any(x in out for x in lines[5:-2] if x)
    middle = b"\n".join(lines[5:8]) + b"\n"  # a page that is all body: every line of it goes
    out, _ = redact(middle, DETECTORS, inside=True)
    assert out == b"[REDACTED:private-key]\n\n\n"


def test_inside_at_looks_back_in_the_file(tmp_path: Path) -> None:
    key = _keys()["ec"]
    f = tmp_path / "k.pem"
    f.write_bytes(b"head\n" + key + b"tail\n")
    import os

    fd = os.open(f, os.O_RDONLY)
    try:
        second = len(b"head\n") + key.index(b"\n") + 1
        assert inside_at(fd, second) and not inside_at(fd, 0) and not inside_at(fd, 5)
        assert not inside_at(fd, len(b"head\n") + len(key))
    finally:
        os.close(fd)


def test_the_text_keeps_every_newline_and_other_lines() -> None:
    text = "a\npassword=x\n\nb token=y\nc\n"
    out, counts = redact_text(text, DETECTORS)
    assert out == "a\npassword=[REDACTED:assignment]\n\nb token=[REDACTED:assignment]\nc\n"
    assert counts == {"assignment": 2}


def test_lone_surrogates_and_non_ascii_survive() -> None:
    text = "héllo \udcff password=clé\n"
    out, counts = redact_text(text, DETECTORS)
    assert out == "héllo \udcff password=[REDACTED:assignment]\n" and counts == {"assignment": 1}


def test_a_page_deep_inside_a_large_key_is_inside_it(tmp_path: Path) -> None:
    """A key body longer than the 64 KiB window is followed back to its BEGIN line; text that is
    no key body, or an END line, before the window says not inside."""
    import os

    body = b"".join(b"QUJD" * 16 + b"\n" for _ in range(3000))  # 195 KB of base64 lines
    cases = {b"-----BEGIN PGP PRIVATE KEY BLOCK-----\nVersion: x\n\n": True,
             b"-----BEGIN RSA PRIVATE KEY-----\n-----END RSA PRIVATE KEY-----\n": False,
             b"just some prose, no key\n": False, b"": False}
    for head, inside in cases.items():
        f = tmp_path / "big"
        f.write_bytes(b"intro line\n" + head + body + b"-----END PGP PRIVATE KEY BLOCK-----\nout\n")
        fd = os.open(f, os.O_RDONLY)
        try:
            assert inside_at(fd, len(b"intro line\n" + head) + len(body) - 65) is inside, head
        finally:
            os.close(fd)


def test_the_inside_state_goes_on_across_blocks_without_a_marker() -> None:
    assert still_inside(True, b"QUJD\n" * 10) and not still_inside(False, b"QUJD\n")
    assert not still_inside(True, b"-----END RSA PRIVATE KEY-----\nplain\n")
    assert still_inside(False, b"x\n-----BEGIN RSA PRIVATE KEY-----\nQUJD\n")


def test_a_files_own_marker_text_is_no_redaction() -> None:
    raw = b"a [REDACTED:token]\npassword=x [REDACTED:token]\nplain\n[REDACTED:assignment]\n"
    out, counts = redact(raw, DETECTORS)
    assert counts == {"assignment": 1}
    assert literal_marks(raw, out) == {0: {"token": 1}, 3: {"assignment": 1}}


@pytest.mark.parametrize("filler", [b"a=", b"password=", b"-----BEGIN PRIVATE KEY-----", b"eyJ", b"://a:",
                                    b"root:$6$", b"Bearer ", b"'", b"AKIA", b" login a password b",
                                    b"define('PASSWORD', 'x'", b"Private-Lines: 1\n", b"password: |\n ",
                                    b"LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0t\n", b"x={SSHA}", b"p=${A:-"])
def test_pathological_input_is_answered_whole(filler: bytes) -> None:
    """RE2 is linear: a 4 MiB line of one repeated fragment (what a backtracking engine chokes on)
    comes back with an exact answer, its length and lines kept where nothing matched."""
    data = filler * (4 * 1024 * 1024 // len(filler)) + b"\nend\n"
    out, counts = redact(data, DETECTORS)
    assert out.endswith(b"\nend\n") or counts.get("private-key")
    assert out.count(b"\n") == data.count(b"\n")
    if not counts:
        assert out == data


def test_redact_setting_parsing() -> None:
    assert parse_redact("secrets") == DETECTORS
    assert parse_redact(["token", "private-key"]) == ("private-key", "token")
    assert parse_redact(None) == () and parse_redact([]) == ()
    for bad in ("all", ["tokens"], 3, {"a": 1}, [None]):
        with pytest.raises(RedactError):
            parse_redact(bad)
    assert describe(DETECTORS) == "secrets (all detectors)" and describe(()) == "none"


def test_the_call_carries_its_detectors_and_never_a_clients() -> None:
    args = with_redaction("files/read", {"path": "/x", "_redact": []}, ("token",))
    assert args == {"path": "/x", "_redact": ["token"]} and from_args(args) == ("token",)
    assert with_redaction("files/read", {"path": "/x", "_redact": ["token"]}, ()) == {"path": "/x"}
    assert with_redaction("files/list", {"path": "/x"}, ("token",)) == {"path": "/x"}
    assert from_args({"_redact": "junk"}) == DETECTORS  # malformed: every detector (fail closed)
    assert from_args({"_redact": ["token", "bogus"]}) == DETECTORS


@pytest.mark.parametrize("name", ["pkcs8", "rsa", "ec", "openssh"])
def test_a_base64_encoded_key_as_kubeconfig_holds_it_is_a_private_key(name: str) -> None:
    import base64

    blob = base64.b64encode(_keys()[name])
    line = b"    client-key-data: " + blob + b"\n"
    out, counts = redact(line, DETECTORS)
    assert out == b"    client-key-data: [REDACTED:private-key]\n" and counts == {"private-key": 1}
    cert = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    assert redact(b"    certificate-authority-data: " + cert + b"\n", DETECTORS)[1] == {}
