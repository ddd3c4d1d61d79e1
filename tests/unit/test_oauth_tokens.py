"""OAuth access tokens are verified as docs/REFERENCE.md §5.4 says, by the policy process's
verifier, against a JWK Set file of real keys and real OS accounts; the attacker's tokens
(forged, replayed elsewhere, naming root or another principal) are all refused."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from mcpd.common import config
from mcpd.common.identity import looks_like_jwt
from mcpd.helper.shadow import usable
from mcpd.policy.oauth import OAuthRefused, OAuthVerifier, load_jwks
from tests.support.jwtkeys import ISSUER, RESOURCE, TestIssuer
from tests.support.osaccounts import AccountFactory, os_accounts  # noqa: F401

pytestmark = pytest.mark.root


def _cfg(jwks: Path, **issuer: object) -> config.OAuth:
    data = {"oauth": {"resource": RESOURCE, "leeway_seconds": 30, "issuers": [
        {"name": "corp", "issuer": ISSUER, "jwks_file": str(jwks), "audiences": [RESOURCE, "api://mcpd"],
         "accounts": ["mcpdt*"], "groups_claim": "groups", **issuer}]}}
    return config.from_dict(data).oauth


@pytest.fixture
def idp(tmp_path: Path) -> TestIssuer:
    return TestIssuer(tmp_path / "corp.json")


def _verifier(idp: TestIssuer, **issuer: object) -> OAuthVerifier:
    return OAuthVerifier(_cfg(idp.jwks_file, **issuer), usable, {"mcpd", "mcpd-policy", "mcpd-walk"})


def test_a_good_token_names_a_namespaced_principal_and_its_account(idp: TestIssuer,
                                                                   os_accounts: AccountFactory) -> None:
    alice = os_accounts.user(password="pw-1")
    v = _verifier(idp)
    token = idp.token(alice.name, groups=["eng", "bad:group"], act={"sub": "agent-7", "act": {"sub": "bot"}})
    p = v.verify(token)
    assert (p.name, p.os_user, p.scopes) == (f"corp:u-{alice.name}", alice.name, ("files:read",))
    assert p.groups == ("corp:eng",)  # a group the principal syntax cannot hold is dropped
    claims = dict(p.claims)
    assert claims["iss"] == ISSUER and claims["sub"] == f"u-{alice.name}" and claims["client"] == "agent-client"
    assert claims["act"] == "agent-7 < bot" and claims["jti"].startswith("j-")
    assert p.expires > time.time() and len(p.token_id) == 12
    ec_token = idp.token(alice.name, kid="ec1", aud="api://mcpd", scope="files:read files:privileged")
    assert v.verify(ec_token).scopes == ("files:privileged", "files:read")
    assert v.verify(idp.token(alice.name, scope=None, scp=["files:read"])).scopes == ("files:read",)


@pytest.mark.parametrize("forge, reason", [
    (lambda idp, a: idp.unsigned(a), "algorithm not allowed"),
    (lambda idp, a: idp.hs256_with_public_key(a), "algorithm not allowed"),
    (lambda idp, a: idp.token(a, iss="https://evil.example"), "unknown issuer"),
    (lambda idp, a: idp.token(a, aud="https://other.example/mcp"), "wrong audience"),
    (lambda idp, a: idp.token(a, aud=None), "no aud claim"),
    (lambda idp, a: idp.token(a, exp=int(time.time()) - 120), "expired"),
    (lambda idp, a: idp.token(a, nbf=int(time.time()) + 300), "not yet valid"),
    (lambda idp, a: idp.token(a, exp=None), "no exp claim"),
    (lambda idp, a: idp.token(a, headers={"kid": "nope"}), "no key for this kid"),
    (lambda idp, a: idp.token(a, headers={"typ": "JOSE+evil"}), "typ"),
    (lambda idp, a: idp.token(a, sub="alice\nforged"), "principal claim"),
    (lambda idp, a: idp.token(a, sub="login:alice"), "principal claim"),
    (lambda idp, a: idp.token(a, sub="\x1b[31mred"), "principal claim"),
    (lambda idp, a: idp.token(a, preferred_username="root"), "account not allowed"),
    (lambda idp, a: idp.token(a, preferred_username=None), "account claim"),
    (lambda idp, a: idp.token(a)[:-4] + ("AAAA" if not idp.token(a).endswith("AAAA") else "BBBB"), "Invalid"),
])
def test_forged_and_misdirected_tokens_are_refused(idp: TestIssuer, os_accounts: AccountFactory, forge: object,
                                                   reason: str) -> None:
    alice = os_accounts.user(password="pw-1")
    with pytest.raises(OAuthRefused, match=reason):
        _verifier(idp).verify(forge(idp, alice.name))  # type: ignore[operator]


def test_root_system_and_daemon_accounts_are_never_a_tokens_account(idp: TestIssuer,
                                                                   os_accounts: AccountFactory) -> None:
    """Even an issuer allowed every account ("*") never maps a token to root, a system account
    (uid below 1000), the daemon's own, an unknown one, or one locked in /etc/shadow."""
    v = _verifier(idp, accounts=["*"])
    for name, why in [("root", "root account"), ("daemon", "system account"), ("nobody", "system account"),
                      ("mcpdt-nosuch", "unknown OS account")]:
        with pytest.raises(OAuthRefused, match=why):
            v.verify(idp.token(name))
    locked = os_accounts.user(password=None)
    with pytest.raises(OAuthRefused, match="locked"):
        v.verify(idp.token(locked.name))


def test_rotation_a_new_kid_is_read_once_and_a_removed_key_is_refused(idp: TestIssuer,
                                                                      os_accounts: AccountFactory) -> None:
    alice = os_accounts.user(password="pw-1")
    v = _verifier(idp)
    assert v.verify(idp.token(alice.name)).os_user == alice.name
    idp.add_rsa("rsa2")  # the IdP rotated: the file has the new key, the verifier has not seen it
    assert v.verify(idp.token(alice.name, kid="rsa2")).os_user == alice.name
    idp.write(kids=["rsa2"])  # rsa1 removed from the set
    v.refresh()
    with pytest.raises(OAuthRefused, match="no key"):
        v.verify(idp.token(alice.name, kid="rsa1"))


def test_a_bad_jwks_file_keeps_the_last_good_set_and_refuses_unsafe_ones(idp: TestIssuer, tmp_path: Path,
                                                                         os_accounts: AccountFactory) -> None:
    alice = os_accounts.user(password="pw-1")
    v = _verifier(idp)
    idp.jwks_file.write_text("{not json", encoding="utf-8")
    v.refresh()
    assert v.verify(idp.token(alice.name)).os_user == alice.name  # last good set
    idp.write(extra=[{"kty": "oct", "k": "c2VjcmV0", "kid": "hs"}])
    assert set(load_jwks(str(idp.jwks_file))) == {"rsa1", "ec1"}  # a symmetric key is never used
    os.chmod(idp.jwks_file, 0o666)
    with pytest.raises(Exception, match="writable"):
        load_jwks(str(idp.jwks_file))
    link = tmp_path / "link.json"
    link.symlink_to(idp.jwks_file)
    with pytest.raises(Exception, match="cannot open"):
        load_jwks(str(link))


def test_kid_and_typ_rules(idp: TestIssuer, os_accounts: AccountFactory) -> None:
    """No ``kid``: only a set of exactly one key is used; no ``typ``: accepted; a key's own ``alg``
    or type must fit the token's ``alg`` (an EC key never verifies an RS256 token)."""
    import jwt

    alice = os_accounts.user(password="pw-1")
    claims = idp.claims(alice.name)
    no_kid = jwt.encode(claims, idp.keys["rsa1"], algorithm="RS256")
    with pytest.raises(OAuthRefused, match="not exactly one key"):
        _verifier(idp).verify(no_kid)
    idp.write(kids=["rsa1"])
    assert _verifier(idp).verify(no_kid).os_user == alice.name  # (and without typ)
    idp.write()
    wrong_key = jwt.encode(claims, idp.keys["rsa1"], algorithm="RS256", headers={"kid": "ec1"})
    with pytest.raises(OAuthRefused, match="does not fit"):
        _verifier(idp).verify(wrong_key)
    with pytest.raises(OAuthRefused, match="algorithm not allowed"):
        _verifier(idp, algorithms=["ES256"]).verify(idp.token(alice.name))


def test_token_shape() -> None:
    assert looks_like_jwt("eyJh.eyJi.c2ln") and not looks_like_jwt("mcpd_0a1b2c3d4e5f_" + "a" * 43)
    assert not looks_like_jwt("eyJh.eyJi." + "A" * 65536)  # 64 KiB: refused unread


def test_only_refusals_of_genuine_tokens_say_so(idp: TestIssuer, os_accounts: AccountFactory) -> None:
    """A forged token (anyone could send one) is refused without a record; a genuine token of the
    issuer refused for its claims is flagged for its ``reject`` record (who, and why)."""
    alice = os_accounts.user(password="pw-1")
    v = _verifier(idp)
    for forged in (idp.unsigned(alice.name), idp.hs256_with_public_key(alice.name),
                   idp.token(alice.name)[:-6] + "AAAAAA"):
        with pytest.raises(OAuthRefused) as refused:
            v.verify(forged)
        assert not refused.value.signed
    for genuine in (idp.token(alice.name, exp=int(time.time()) - 300), idp.token(alice.name, aud="other"),
                    idp.token("root")):
        with pytest.raises(OAuthRefused) as refused:
            v.verify(genuine)
        assert refused.value.signed


def test_a_jwks_file_is_trusted_from_root_or_mcpd_jwks_only(idp: TestIssuer, os_accounts: AccountFactory) -> None:
    """Whoever writes the key set mints tokens: only root and mcpd-jwks may own the file."""
    from mcpd.admin import devroot
    from mcpd.common.oauthconfig import JWKS_USER

    fetcher = devroot.ensure_system_account(JWKS_USER)
    os.chown(idp.jwks_file, fetcher.pw_uid, fetcher.pw_gid)
    assert set(load_jwks(str(idp.jwks_file))) == {"rsa1", "ec1"}
    mallory = os_accounts.user(password="pw-2")
    os.chown(idp.jwks_file, mallory.uid, mallory.gid)
    with pytest.raises(Exception, match="not owned by"):
        load_jwks(str(idp.jwks_file))
