"""OAuth access tokens, verified in the policy process (docs/REFERENCE.md §5.4): JWKS files and the token check.

:class:`OAuthVerifier` turns a JWT access token into a :class:`~mcpd.common.identity.Principal`
or refuses it (:class:`OAuthRefused`, its reason for the audit record only). In order: the shape
(:func:`~mcpd.common.identity.looks_like_jwt`), the header (``typ`` ``at+jwt`` or ``JWT``,
``alg`` in the issuer's allow-list, which never holds ``none`` or ``HS*``), the issuer by exact
``iss``, the key by ``kid`` in that issuer's JWK Set (an unknown ``kid`` re-reads the file once,
at most once a second, then refuses), the signature with PyJWT, ``exp`` (required), ``nbf`` and
``iat`` with ``leeway_seconds``, ``aud`` among the issuer's ``audiences`` (required). Then the
identity: principal ``<issuer name>:<principal_claim>`` (:data:`CLAIM_VALUE_RE`: never a
``:``, a control character or a space), the OS account of ``account_claim`` when it matches the
issuer's ``accounts`` globs and is an ordinary account (:func:`ordinary_account`) root says is
usable (``/etc/shadow``: not locked, not expired).

Each JWK Set file is held by the one reload holder, read without root's help (a public file, mode
0644) and trusted only when it is a regular file, no symlink, owned by root or by
:data:`JWKS_USER`, not group- or world-writable; a bad file is logged and the last good set kept.
Keys with private members (``d``), symmetric keys (``oct``) and keys for another use than ``sig``
are dropped. No network is used here.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import pwd
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jwt

from mcpd.common.identity import NAME_RE, Principal, looks_like_jwt
from mcpd.common.oauthconfig import JWKS_USER, OAuth, OAuthIssuer
from mcpd.common.printable import printable
from mcpd.common.reload import Reloading
from mcpd.helper.wire.securefile import ConfigFileError, read_secure_file

log = logging.getLogger(__name__)

#: what a principal claim's value may be: it becomes the principal ``<issuer>:<value>``
CLAIM_VALUE_RE = re.compile(r"[A-Za-z0-9_.@+=-]{1,128}")
#: the uids of ordinary accounts: below are root and the system's accounts, above the dynamic ones and nobody
ORDINARY_UIDS = range(1000, 60000)
_TYPES = ("at+jwt", "application/at+jwt", "jwt")
_KTY_ALGS = {"RSA": ("RS", "PS"), "EC": ("ES",), "OKP": ("EdDSA",)}
RELOAD_EVERY = 1.0  # seconds: an unknown kid re-reads its issuer's file at most this often


class OAuthRefused(Exception):
    """The token is not accepted; the message is the reason, for the audit record only.
    ``signed``: its issuer's signature was verified (a genuine token, refused for its claims),
    else anyone could have sent it (such refusals are not recorded, as unknown static tokens are not)."""

    def __init__(self, reason: str, signed: bool = False) -> None:
        super().__init__(reason)
        self.signed = signed


def _jwks_owners() -> set[int]:
    owners = {0}
    try:
        owners.add(pwd.getpwnam(JWKS_USER).pw_uid)
    except KeyError:
        pass
    return owners


def load_jwks(path: str, owners: set[int] | None = None) -> dict[str, jwt.PyJWK]:
    """The usable public signing keys of the JWK Set file ``path``, by ``kid`` (``""``: a key
    without one).

    Raises:
        ConfigFileError: unsafe file (see the module docstring), not JSON, not a JWK Set, or no
            usable key in it.
    """
    found: list[list[str]] = []
    text = ""
    for owner in sorted(owners if owners is not None else _jwks_owners()):
        try:
            text = read_secure_file(path, owner_uid=owner)
            break
        except ConfigFileError as exc:
            found.append(exc.errors)
    else:  # the reason of the attempt whose owner fitted, when one did (else: not owned by any)
        raise ConfigFileError(next((e for e in found if not any("not owned by" in m for m in e)), found[0]))
    try:
        data = json.loads(text)
    except ValueError:
        raise ConfigFileError([f"{path}: not JSON"]) from None
    if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
        raise ConfigFileError([f"{path}: not a JWK Set (an object with a 'keys' list)"])
    keys: dict[str, jwt.PyJWK] = {}
    for i, jwk in enumerate(data["keys"]):
        if not isinstance(jwk, dict) or jwk.get("kty") not in _KTY_ALGS or "d" in jwk or jwk.get("use", "sig") != "sig":
            continue  # symmetric, private, encryption-only or unknown keys are never used
        try:
            keys[str(jwk.get("kid", ""))] = jwt.PyJWK(jwk)
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError) as exc:
            log.warning("%s: key %d skipped: %s", path, i, printable(str(exc))[:200])
    if not keys:
        raise ConfigFileError([f"{path}: no usable public signing key"])
    return keys


@dataclass
class _Issuer:
    cfg: OAuthIssuer
    keys: Reloading[dict[str, jwt.PyJWK]]
    last_reload: float = 0.0


def ordinary_account(name: str, reserved: set[str]) -> str | None:
    """Why OS account ``name`` may not be a token's account (None when it may): unknown, root,
    a system account (uid below 1000), one of the dynamic or ``nobody`` range (60000 and above),
    or one of the daemon's own accounts (``reserved``)."""
    try:
        pw = pwd.getpwnam(name)
    except (KeyError, ValueError):
        return "unknown OS account"
    if pw.pw_uid == 0 or pw.pw_gid == 0:
        return "root account"
    if name in reserved:
        return "daemon account"
    if pw.pw_uid not in ORDINARY_UIDS:
        return "system account"
    return None


class OAuthVerifier:
    """Verify access tokens against the configured issuers (see the module docstring); thread-safe.

    Args:
        cfg: the ``oauth`` block.
        usable: ``account -> bool``, whether ``/etc/shadow`` lets the account in (root's answer).
        reserved: the daemon's own account names, never a token's account.
        now: the clock (UNIX seconds), for tests.
    """

    def __init__(self, cfg: OAuth, usable: Callable[[str], bool], reserved: set[str],
                 now: Callable[[], float] = time.time) -> None:
        self.cfg, self._usable, self._reserved, self._now = cfg, usable, reserved, now
        self._lock = threading.Lock()
        self._issuers = {i.issuer: _Issuer(i, Reloading(i.jwks_file, load_jwks, empty={})) for i in cfg.issuers}

    def refresh(self) -> None:
        """Re-read the JWK Set files that changed (the policy process's tick)."""
        for iss in self._issuers.values():
            iss.keys.refresh()

    def _key(self, iss: _Issuer, kid: str | None) -> jwt.PyJWK:
        for attempt in (0, 1):
            iss.keys.refresh()
            keys = iss.keys.current
            if kid is None and len(keys) == 1:
                return next(iter(keys.values()))
            if kid is not None and kid in keys:
                return keys[kid]
            with self._lock:  # one re-read of the file for an unknown kid, at most once a RELOAD_EVERY
                if attempt or time.monotonic() - iss.last_reload < RELOAD_EVERY:
                    break
                iss.last_reload = time.monotonic()
            iss.keys.refresh(force=True)
        raise OAuthRefused("no key for this kid" if kid is not None else "no kid and not exactly one key")

    def verify(self, token: str) -> Principal:
        """The principal of ``token``.

        Raises:
            OAuthRefused: any reason not to accept it (see the module docstring).
        """
        if not looks_like_jwt(token):
            raise OAuthRefused("not a JWT")
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise OAuthRefused("malformed JWT") from None
        typ, alg, kid = header.get("typ"), header.get("alg"), header.get("kid")
        if typ is not None and (not isinstance(typ, str) or typ.lower() not in _TYPES):
            raise OAuthRefused("typ is not at+jwt or JWT")
        claimed = unverified.get("iss")
        iss = self._issuers.get(claimed) if isinstance(claimed, str) else None
        if iss is None:
            raise OAuthRefused("unknown issuer")
        if not isinstance(alg, str) or alg not in iss.cfg.algorithms:
            raise OAuthRefused("algorithm not allowed")
        if kid is not None and not isinstance(kid, str):
            raise OAuthRefused("malformed kid")
        key = self._key(iss, kid)
        kty = key._jwk_data.get("kty", "")
        if not alg.startswith(_KTY_ALGS.get(kty, ("-",))) or key._jwk_data.get("alg", alg) != alg:
            raise OAuthRefused("algorithm does not fit the key")
        try:  # (PyJWT checks the signature first, then the claims)
            claims = jwt.decode(token, key.key, algorithms=[alg], audience=list(iss.cfg.audiences),
                                issuer=iss.cfg.issuer, leeway=self.cfg.leeway_seconds,
                                options={"require": ["exp", "iss", "aud"], "verify_iat": False})
        except jwt.ExpiredSignatureError:
            raise OAuthRefused("expired", signed=True) from None
        except jwt.ImmatureSignatureError:
            raise OAuthRefused("not yet valid", signed=True) from None
        except jwt.InvalidAudienceError:
            raise OAuthRefused("wrong audience", signed=True) from None
        except jwt.MissingRequiredClaimError as exc:
            raise OAuthRefused(f"no {exc.claim} claim", signed=True) from None
        except (jwt.InvalidSignatureError, jwt.DecodeError) as exc:
            raise OAuthRefused(f"invalid: {type(exc).__name__}") from None
        except jwt.PyJWTError as exc:
            raise OAuthRefused(f"invalid: {type(exc).__name__}", signed=True) from None
        try:
            return self._principal(iss.cfg, claims, token)
        except OAuthRefused as exc:
            raise OAuthRefused(str(exc), signed=True) from None

    def _principal(self, cfg: OAuthIssuer, claims: dict[str, Any], token: str) -> Principal:
        value = claims.get(cfg.principal_claim)
        if not isinstance(value, str) or not CLAIM_VALUE_RE.fullmatch(value):
            raise OAuthRefused(f"principal claim {cfg.principal_claim} missing or not a plain name")
        account = claims.get(cfg.account_claim)
        if not isinstance(account, str) or not NAME_RE.match(account):
            raise OAuthRefused(f"account claim {cfg.account_claim} missing or not an OS account name")
        if not any(fnmatch.fnmatchcase(account, glob) for glob in cfg.accounts):
            raise OAuthRefused("account not allowed for this issuer")
        why = ordinary_account(account, self._reserved)
        if why is not None:
            raise OAuthRefused(why)
        if not self._usable(account):
            raise OAuthRefused("account locked or expired")
        groups: tuple[str, ...] = ()
        raw = claims.get(cfg.groups_claim) if cfg.groups_claim else None
        if isinstance(raw, list):
            groups = tuple(f"{cfg.name}:{g}" for g in raw if isinstance(g, str) and CLAIM_VALUE_RE.fullmatch(g))
        return Principal(name=f"{cfg.name}:{value}", os_user=account,
                         token_id=hashlib.sha256(token.encode("ascii")).hexdigest()[:12],
                         scopes=scopes_of(claims), expires=float(claims["exp"]),
                         claims=audit_claims(claims), groups=groups)


def scopes_of(claims: dict[str, Any]) -> tuple[str, ...]:
    """The token's scopes: ``scope`` (RFC 9068, space-separated) and ``scp`` (a string or a list)."""
    found: list[str] = []
    for key in ("scope", "scp"):
        raw = claims.get(key)
        items = raw.split() if isinstance(raw, str) else raw if isinstance(raw, list) else []
        found += [s for s in items if isinstance(s, str)]
    return tuple(sorted(set(found)))


def _act_chain(act: Any) -> str:
    subs: list[str] = []
    while isinstance(act, dict) and len(subs) < 8:
        subs.append(str(act.get("sub", "?")))
        act = act.get("act")
    return " < ".join(subs)


def audit_claims(claims: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The claims every record of the token's calls names: ``iss``, ``sub``, ``client`` (``azp``
    or ``client_id``), ``act`` (the delegation chain's ``sub`` values, newest first) and ``jti``,
    printable-escaped and at most 256 characters each."""
    client = claims.get("azp", claims.get("client_id"))
    found = {"iss": claims.get("iss"), "sub": claims.get("sub"), "client": client,
             "act": _act_chain(claims.get("act")) or None, "jti": claims.get("jti")}
    return tuple((k, printable(str(v))[:256]) for k, v in found.items() if v is not None)
