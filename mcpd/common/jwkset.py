"""A JWK Set (RFC 7517) of public signing keys, checked whole: what ``mcpd jwks fetch`` writes and
what a verifier of access tokens may trust.

:func:`parse_jwk_set` takes the bytes of a document and returns its keys, or refuses the whole
document: not JSON (or a JSON object with a repeated member name), no ``keys`` list, a key whose
``kty`` is not ``RSA``, ``EC`` or ``OKP`` (a symmetric ``oct`` key is a shared secret, never a
key set's business), a key carrying a private member (``d``, ``p``, ``q``, ``dp``, ``dq``,
``qi``, ``oth``, ``k``), or key material the cryptography library cannot load as a public key.
:func:`canonical` is the one form such a set is written in, so an unchanged set is recognised
byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm
from jwt.exceptions import InvalidKeyError

MAX_JWKS_BYTES = 1024 * 1024  # a real issuer's set is a few KiB
MAX_KEYS = 100
KEY_TYPES: dict[str, Callable[[dict[str, Any]], object]] = {
    "RSA": RSAAlgorithm.from_jwk, "EC": ECAlgorithm.from_jwk, "OKP": OKPAlgorithm.from_jwk}
PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "oth", "k")


class JWKSetError(ValueError):
    """The document is not a JWK Set of public keys; the message says why (no key material in it)."""


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    names = [k for k, _ in pairs]
    if len(set(names)) != len(names):
        raise JWKSetError("a JSON object repeats a member name")
    return dict(pairs)


def _refuse_constant(name: str) -> None:
    raise JWKSetError(f"not JSON: {name} is not a number")


def parse_jwk_set(data: bytes) -> list[dict[str, Any]]:
    """The keys of the JWK Set ``data`` (UTF-8 JSON), each checked as the module docstring says.

    Raises:
        JWKSetError: larger than :data:`MAX_JWKS_BYTES`, not a JWK Set, more than
            :data:`MAX_KEYS` keys, or a key that is not a usable public RSA/EC/OKP key.
    """
    if len(data) > MAX_JWKS_BYTES:
        raise JWKSetError(f"larger than {MAX_JWKS_BYTES} bytes")
    try:
        doc = json.loads(data.decode("utf-8"), object_pairs_hook=_no_repeats, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise exc if isinstance(exc, JWKSetError) else JWKSetError("not JSON") from None
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(keys, list):
        raise JWKSetError('not a JWK Set: no "keys" list')
    if not keys:
        raise JWKSetError("the JWK Set holds no key")
    if len(keys) > MAX_KEYS:
        raise JWKSetError(f"more than {MAX_KEYS} keys")
    for i, key in enumerate(keys):
        where = f"key {i + 1}"
        if not isinstance(key, dict):
            raise JWKSetError(f"{where}: not a JSON object")
        kid = key.get("kid")
        if kid is not None:
            if not isinstance(kid, str) or not kid:
                raise JWKSetError(f"{where}: kid must be a non-empty string")
            where = f"key {i + 1} (kid {kid!r})" if kid.isprintable() and len(kid) <= 80 else where
        kty = key.get("kty")
        if kty == "oct":
            raise JWKSetError(f"{where}: a symmetric (oct) key is a shared secret; a key set holds public keys only")
        if kty not in KEY_TYPES:
            raise JWKSetError(f"{where}: kty must be RSA, EC or OKP")
        private = [m for m in PRIVATE_MEMBERS if m in key]
        if private:
            raise JWKSetError(f"{where}: holds private key members ({', '.join(private)}); publish public keys only")
        try:
            KEY_TYPES[kty](key)
        except (InvalidKeyError, ValueError, TypeError, KeyError) as exc:
            raise JWKSetError(f"{where}: not a usable {kty} public key ({type(exc).__name__})") from None
    return keys


def canonical(keys: list[dict[str, Any]]) -> bytes:
    """The bytes written for ``keys``: ``{"keys": [...]}``, members sorted, one trailing newline."""
    return (json.dumps({"keys": keys}, sort_keys=True, indent=1, ensure_ascii=True) + "\n").encode("ascii")
