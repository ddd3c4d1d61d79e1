"""OAuth access tokens, verified in the policy process (docs/REFERENCE.md §5.4): JWKS files and the token check.

:class:`OAuthVerifier` turns a JWT access token into a :class:`~mcpd.common.identity.Principal`
or refuses it (:class:`OAuthRefused`, its reason for the audit record only). In order: the shape
(:func:`~mcpd.common.identity.looks_like_jwt`), the header (``typ`` ``at+jwt`` or ``JWT``,
``alg`` in the issuer's allow-list, which never holds ``none`` or ``HS*``), the issuer by exact
``iss``, the key by ``kid`` in that issuer's JWK Set (an unknown ``kid`` re-reads the file once,
at most once a second, then refuses), the signature alone with PyJWT's JWS (every refusal after it
is ``signed``: of a genuine token), ``exp`` (required), ``nbf`` and ``iat`` JSON numbers of seconds
(:func:`_plain_time`) checked with ``leeway_seconds``, ``aud`` among the issuer's ``audiences`` (required). Then the
identity: principal ``<issuer name>:<principal_claim>`` (:data:`CLAIM_VALUE_RE`: never a
``:``, a control character or a space), the OS account of ``account_claim`` when it matches the
issuer's ``accounts`` globs and is an ordinary account (:func:`ordinary_account`) root says is
usable (``/etc/shadow``: not locked, not expired).

Each JWK Set file is held by the one reload holder, read without root's help (a public file, mode
0644) and trusted only when it is a regular file, no symlink, owned by root or by
:data:`JWKS_USER`, not group- or world-writable, in a folder of the same owners and mode
(:func:`~mcpd.common.folders.safe_folder`, checked before the read), and a JWK Set :func:`~mcpd.common.jwkset.parse_jwk_set`
accepts whole (a key with a private member, a symmetric key, a broken key refuses the set, as
``mcpd jwks fetch`` refuses it); a bad file is logged and the last good set kept. Keys for
another use than ``sig`` are not used. No network is used here.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import pwd
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jwt

from mcpd.common.config import POLICY_USER, WALK_USER
from mcpd.common.folders import safe_folder
from mcpd.common.identity import NAME_RE, Principal, looks_like_jwt
from mcpd.common.jwkset import JWKSetError, parse_jwk_set
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

    def __init__(self, reason: str, signed: bool = False, claims: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.signed = signed
        #: the verified token's :func:`audit_claims` (empty unless ``signed``)
        self.claims = audit_claims(claims) if signed and claims is not None else ()


def _plain_time(value: Any) -> bool:
    """Whether ``value`` is a JSON number of seconds PyJWT and the clock can hold (0 to 2**53)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 2**53


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
        ConfigFileError: unsafe file (see the module docstring), not a JWK Set of public keys
            (:func:`~mcpd.common.jwkset.parse_jwk_set`: the whole set is refused), or no usable
            signing key in it.
    """
    found: list[list[str]] = []
    text = ""
    owners = owners if owners is not None else _jwks_owners()
    folder_errors = []
    for owner in sorted(owners):  # the folder: owned by one of them, not group/other-writable, root's above
        try:
            os.close(safe_folder(os.path.dirname(os.path.abspath(path)), owner=owner, leaf_mask=0o022, create=False))
            break
        except OSError as exc:
            folder_errors.append(f"{path}: unsafe folder: {exc.strerror or exc}")
    else:
        raise ConfigFileError(folder_errors[-1:])
    for owner in sorted(owners):
        try:
            text = read_secure_file(path, owner_uid=owner)
            break
        except ConfigFileError as exc:
            found.append(exc.errors)
    else:  # the reason of the attempt whose owner fitted, when one did (else: not owned by any)
        raise ConfigFileError(next((e for e in found if not any("not owned by" in m for m in e)), found[0]))
    try:  # the one JWK Set checker: a private, symmetric or broken key refuses the whole set
        checked = parse_jwk_set(text.encode("utf-8"))
    except JWKSetError as exc:
        raise ConfigFileError([f"{path}: {exc}"]) from None
    keys: dict[str, jwt.PyJWK] = {}
    for i, jwk in enumerate(checked):
        if jwk.get("use", "sig") != "sig":
            continue  # a public key for encryption is never used to verify
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


def daemon_accounts(service_user: str) -> set[str]:
    """The daemon's own OS accounts, never a token's account: the service's, the policy
    process's, the walker's and the JWK Set fetcher's (:data:`JWKS_USER`)."""
    return {service_user, POLICY_USER, WALK_USER, JWKS_USER}


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
        try:  # the signature alone first: every refusal after it is of a genuine token
            jwt.api_jws.PyJWS().decode_complete(token, key.key, algorithms=[alg])
        except jwt.PyJWTError as exc:
            raise OAuthRefused(f"invalid: {type(exc).__name__}") from None
        for name in ("exp", "nbf", "iat"):
            if name in unverified and not _plain_time(unverified[name]):
                raise OAuthRefused(f"{name} is not a number of seconds", signed=True, claims=unverified)
        try:  # then the claims (the signature already verified: PyJWT is not asked again)
            claims = jwt.decode(token, options={"verify_signature": False, "verify_exp": True, "verify_nbf": True,
                                                "verify_iat": False, "verify_aud": True, "verify_iss": True,
                                                "verify_sub": True, "verify_jti": True,
                                                "require": ["exp", "iss", "aud"]},
                                audience=list(iss.cfg.audiences), issuer=iss.cfg.issuer,
                                leeway=self.cfg.leeway_seconds)
        except jwt.ExpiredSignatureError:
            raise OAuthRefused("expired", signed=True, claims=unverified) from None
        except jwt.ImmatureSignatureError:
            raise OAuthRefused("not yet valid", signed=True, claims=unverified) from None
        except jwt.InvalidAudienceError:
            raise OAuthRefused("wrong audience", signed=True, claims=unverified) from None
        except jwt.MissingRequiredClaimError as exc:
            raise OAuthRefused(f"no {exc.claim} claim", signed=True, claims=unverified) from None
        except (jwt.PyJWTError, ValueError, TypeError, OverflowError) as exc:
            raise OAuthRefused(f"invalid: {type(exc).__name__}", signed=True, claims=unverified) from None
        try:
            return self._principal(iss.cfg, claims, token)
        except OAuthRefused as exc:
            raise OAuthRefused(str(exc), signed=True, claims=claims) from None

    def _principal(self, cfg: OAuthIssuer, claims: dict[str, Any], token: str) -> Principal:
        value = claims.get(cfg.principal_claim)
        if not isinstance(value, str) or not CLAIM_VALUE_RE.fullmatch(value):
            raise OAuthRefused(f"principal claim {cfg.principal_claim} missing or not a plain name")
        account = claims.get(cfg.account_claim)
        if not isinstance(account, str) or not NAME_RE.fullmatch(account):
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
                         token_id=oauth_token_id(token),
                         scopes=scopes_of(claims), expires=float(claims["exp"]),
                         claims=audit_claims(claims), groups=groups)


def oauth_token_id(token: str) -> str:
    """An access token's 12-hex id in records (as a static token's): its SHA-256's first 12 digits."""
    return hashlib.sha256(token.encode("ascii", "replace")).hexdigest()[:12]


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
