"""The Host header rule of ``allowed_hosts`` (DNS-rebinding defence): parsing, ports, IPv6,
wildcards, and ``auto`` read from a real certificate."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcpd.admin import certs
from mcpd.front.hosts import HostRule, certificate_names, split_host


def test_split_host() -> None:
    assert split_host("Example.COM") == ("example.com", None)
    assert split_host("example.com:9091") == ("example.com", 9091)
    assert split_host("[::1]:9091") == ("::1", 9091)
    assert split_host("[::1]") == ("::1", None)
    for bad in ("", ":9091", "a:b", "a:0", "a:70000", "[::1", "[::1]x", "a:9091:1"):
        assert split_host(bad) is None, bad


def test_rule_names_ports_wildcards_ipv6() -> None:
    rule = HostRule(["files.example.com", "other.example:8443", "*.svc.example", "::1", "10.0.0.1"], "/nonexistent")
    assert rule.enabled
    for ok in ("files.example.com", "FILES.example.com:9091", "files.example.com.", "other.example:8443",
               "a.svc.example", "a.svc.example:1", "[::1]:9091", "[0:0::1]", "10.0.0.1:9091"):
        assert rule.allows(ok), ok
    for bad in (None, "", "evil.example", "files.example.com.evil", "other.example", "other.example:9091",
                "svc.example", "a.b.svc.example", ".svc.example", "evil-svc.example", "[::2]", "10.0.0.10",
                "files.example.com:bad"):
        assert not rule.allows(bad), bad
    assert HostRule([], "/nonexistent").allows("anything") and HostRule([], "/x").allows(None)


def test_auto_reads_the_certificates_names(tmp_path: Path) -> None:
    pki = certs.make_pki(tmp_path, ["files.example.com", "localhost", "127.0.0.1", "::1"])
    assert sorted(certificate_names(str(pki.server_cert))) == sorted(["files.example.com", "localhost",
                                                                      "127.0.0.1", "::1"])
    rule = HostRule(["auto", "extra.example"], str(pki.server_cert))
    assert rule.allows("localhost:9091") and rule.allows("127.0.0.1") and rule.allows("[::1]:1")
    assert rule.allows("extra.example") and not rule.allows("attacker.example")


def test_bad_entries_and_unreadable_certificate_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="malformed"):
        HostRule(["a:b"], "/nonexistent")
    with pytest.raises(ValueError, match="certificate"):
        HostRule(["auto"], str(tmp_path / "missing.crt"))
    (tmp_path / "junk.crt").write_text("not a certificate")
    with pytest.raises(ValueError, match="certificate"):
        HostRule(["auto"], str(tmp_path / "junk.crt"))
