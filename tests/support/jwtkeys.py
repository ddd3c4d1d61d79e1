"""Test signing keys for OAuth access tokens (docs/REFERENCE.md §5.4): an issuer of our own.

:class:`TestIssuer` holds RSA and EC key pairs made with ``cryptography``, writes their public
halves as a JWK Set file (mode 0644, as ``mcpd jwks fetch`` writes it) and mints tokens with
PyJWT, good ones and the forged kinds the attacker tests need (``alg: none``, HS256 keyed with the
RSA public key).
"""

from __future__ import annotations

import base64
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

ISSUER = "https://idp.test.example/realms/corp"
RESOURCE = "https://127.0.0.1/mcp"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


@dataclass
class TestIssuer:
    """Key pairs by ``kid`` (``rsa1`` RSA-2048, ``ec1`` P-256) and the JWK Set file they go in."""

    jwks_file: Path
    issuer: str = ISSUER
    audience: str = RESOURCE
    keys: dict[str, Any] = field(default_factory=dict)

    __test__ = False  # (not a test class)

    def __post_init__(self) -> None:
        if not self.keys:
            self.keys = {"rsa1": rsa.generate_private_key(public_exponent=65537, key_size=2048),
                         "ec1": ec.generate_private_key(ec.SECP256R1())}
        self.write()

    def add_rsa(self, kid: str) -> None:
        """Add (and publish) another RSA key."""
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.write()

    def jwks(self, kids: list[str] | None = None) -> dict[str, Any]:
        """The public JWK Set of ``kids`` (default all)."""
        out = []
        for kid in kids if kids is not None else list(self.keys):
            pub = self.keys[kid].public_key()
            jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(pub) if isinstance(pub, rsa.RSAPublicKey)
                             else jwt.algorithms.ECAlgorithm.to_jwk(pub))
            jwk.update(kid=kid, use="sig")
            out.append(jwk)
        return {"keys": out}

    def write(self, kids: list[str] | None = None, extra: list[dict[str, Any]] | None = None) -> None:
        """Write the JWK Set file atomically, 0644 (what the policy process reads)."""
        data = self.jwks(kids)
        data["keys"] += extra or []
        tmp = self.jwks_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.jwks_file)

    def claims(self, account: str, **extra: Any) -> dict[str, Any]:
        """Good claims for ``account`` (sub ``u-<account>``), valid for 10 minutes."""
        now = int(time.time())
        base = {"iss": self.issuer, "aud": self.audience, "sub": f"u-{account}", "preferred_username": account,
                "scope": "files:read", "exp": now + 600, "iat": now, "nbf": now - 5, "jti": f"j-{now}",
                "azp": "agent-client"}
        base.update(extra)
        return {k: v for k, v in base.items() if v is not None}

    def token(self, account: str, kid: str = "rsa1", headers: dict[str, Any] | None = None, **extra: Any) -> str:
        """A token signed with key ``kid`` (RS256 or ES256 by its type)."""
        key = self.keys[kid]
        alg = "RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256"
        return jwt.encode(self.claims(account, **extra), key, algorithm=alg,
                          headers={"kid": kid, "typ": "at+jwt", **(headers or {})})

    def unsigned(self, account: str, **extra: Any) -> str:
        """``alg: none``, no signature."""
        header = _b64(json.dumps({"alg": "none", "typ": "at+jwt", "kid": "rsa1"}).encode())
        return f"{header}.{_b64(json.dumps(self.claims(account, **extra)).encode())}."

    def hs256_with_public_key(self, account: str, **extra: Any) -> str:
        """HS256 keyed with the RSA key's public PEM (the RS/HS confusion attack)."""
        import hashlib
        import hmac

        pem = self.keys["rsa1"].public_key().public_bytes(serialization.Encoding.PEM,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo)
        header = _b64(json.dumps({"alg": "HS256", "typ": "at+jwt", "kid": "rsa1"}).encode())
        body = _b64(json.dumps(self.claims(account, **extra)).encode())
        sig = hmac.new(pem, f"{header}.{body}".encode(), hashlib.sha256).digest()
        return f"{header}.{body}.{_b64(sig)}"
