"""The ``oauth`` block of ``mcpd.yaml``: resource-server settings and the trusted issuers.

Part of the one configuration schema (:mod:`mcpd.common.config` embeds :class:`OAuth` as
``Config.oauth`` and reports :func:`check_oauth`'s errors as configuration errors); read by the
front (metadata, challenges, principal names) and the policy process (token verification).
Absent or without issuers, OAuth is off and only static and login tokens are accepted.
"""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class OAuthIssuer:
    """One trusted OAuth authorization server (docs/REFERENCE.md §5.4): ``name`` namespaces its
    principals (``<name>:<principal_claim value>``), ``issuer`` is the exact ``iss``, ``jwks_file``
    the key set the policy process verifies against (``jwks_uri``: what ``mcpd jwks fetch`` writes
    there), ``audiences`` the accepted ``aud`` values, ``algorithms`` the signature allow-list
    (asymmetric only), ``accounts`` globs of the OS accounts a token may map to."""

    name: str = ""
    issuer: str = ""
    jwks_file: str = ""
    jwks_uri: str = ""
    audiences: tuple[str, ...] = ()
    algorithms: tuple[str, ...] = ("RS256", "ES256")
    principal_claim: str = "sub"
    account_claim: str = "preferred_username"
    accounts: tuple[str, ...] = ()
    groups_claim: str = ""
    client_id: str = ""


#: the account that may own a JWK Set file beside root: ``mcpd jwks fetch`` runs as it (a system
#: account of this name, not a systemd DynamicUser, whose uid has no name while it is not running)
JWKS_USER = "mcpd-jwks"
#: signature algorithms an issuer may allow: asymmetric only (never ``none``, never HS*)
OAUTH_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
#: the scopes that mean something here: the ordinary route, and the privileged route on top of it
SCOPE_READ, SCOPE_PRIVILEGED = "files:read", "files:privileged"
_ISSUER_NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_CLAIM_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]{0,63}")


@dataclasses.dataclass(frozen=True)
class OAuth:
    """OAuth 2.1 resource-server mode (docs/REFERENCE.md §5.4), on when ``issuers`` is not empty:
    ``resource`` is this server's canonical URI (RFC 8707/9728), ``scopes_supported`` what its
    metadata advertises, ``leeway_seconds`` the clock skew allowed on ``exp``/``nbf``."""

    resource: str = ""
    scopes_supported: tuple[str, ...] = (SCOPE_READ, SCOPE_PRIVILEGED)
    leeway_seconds: float = 60.0
    issuers: tuple[OAuthIssuer, ...] = ()

    @property
    def enabled(self) -> bool:
        """Whether OAuth access tokens are accepted (an ``oauth`` block with issuers)."""
        return bool(self.issuers)



def _printable(value: str) -> bool:
    return bool(value) and value.isprintable() and value == value.strip()


def check_oauth(o: OAuth) -> None:
    """Validate an ``oauth`` block; raise ``ValueError`` naming the bad key."""
    if not o.issuers:
        if o.resource:
            raise ValueError("oauth: issuers must list at least one issuer (or drop the oauth block)")
        return
    if not o.resource.startswith("https://") or "#" in o.resource or not _printable(o.resource):
        raise ValueError("oauth.resource: must be this server's https:// URI (no fragment)")
    if not o.scopes_supported or set(o.scopes_supported) - {SCOPE_READ, SCOPE_PRIVILEGED}:
        raise ValueError(f"oauth.scopes_supported: only {SCOPE_READ} and {SCOPE_PRIVILEGED}")
    if not 0 <= o.leeway_seconds <= 300:
        raise ValueError("oauth.leeway_seconds: must be 0 to 300")
    names: set[str] = set()
    issuers: set[str] = set()
    for i, iss in enumerate(o.issuers):
        where = f"oauth.issuers[{i}]"
        if not _ISSUER_NAME_RE.fullmatch(iss.name) or iss.name in names or iss.name == "login":
            raise ValueError(f"{where}.name: a unique short name of lowercase letters, digits, '_' and '-' "
                              "(at most 32, starting with a letter; not 'login')")
        if not _printable(iss.issuer) or iss.issuer in issuers:
            raise ValueError(f"{where}.issuer: the exact, unique 'iss' value of the issuer")
        names.add(iss.name)
        issuers.add(iss.issuer)
        if not iss.jwks_file or "\0" in iss.jwks_file:
            raise ValueError(f"{where}.jwks_file: the path of the issuer's JWK Set file")
        if iss.jwks_uri and not iss.jwks_uri.startswith("https://"):
            raise ValueError(f"{where}.jwks_uri: must be an https:// URL (or absent)")
        if not iss.audiences or not all(_printable(a) for a in iss.audiences):
            raise ValueError(f"{where}.audiences: at least one accepted 'aud' value")
        bad = [a for a in iss.algorithms if a not in OAUTH_ALGORITHMS]
        if not iss.algorithms or bad:
            raise ValueError(f"{where}.algorithms: only asymmetric algorithms ({', '.join(OAUTH_ALGORITHMS)})")
        for key in ("principal_claim", "account_claim"):
            if not _CLAIM_RE.fullmatch(getattr(iss, key)):
                raise ValueError(f"{where}.{key}: a claim name")
        if iss.groups_claim and not _CLAIM_RE.fullmatch(iss.groups_claim):
            raise ValueError(f"{where}.groups_claim: a claim name (or absent)")
        if not iss.accounts or not all(_printable(a) and "/" not in a for a in iss.accounts):
            raise ValueError(f"{where}.accounts: at least one glob of OS account names (\"*\": any ordinary one)")
