"""Principals and bearer tokens (docs/REFERENCE.md §5.1).

A token looks like ``mcpd_<id>_<secret>``: ``id`` is 12 lowercase hex digits naming the token
record, ``secret`` is 43 URL-safe base64 characters (256 bits). ``users.yaml`` stores, per token,
a random salt and ``sha256(salt || secret)`` in hex; the plain token exists only in the output of
the command that created it. Verification looks the record up by ``id`` and compares digests with
:func:`hmac.compare_digest` (constant time); an unknown id still costs one digest and compare.

``users.yaml``::

    users:
      alice:                       # principal name
        os_user: alice             # the OS account whose rights unprivileged calls use
        redact: secrets            # optional: secrets, or a list of detectors (mcpd.common.redaction)
        tokens:
          - id: 0a1b2c3d4e5f
            salt: 9f...            # 32 hex digits
            sha256: 5e...          # 64 hex digits
            created: 2026-11-29T21:00:00Z
            expires: null          # optional ISO 8601 UTC
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import re
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mcpd.common import filesig
from mcpd.common.redaction import RedactError, parse_redact, union
from mcpd.common.strictyaml import parse_strict_yaml
from mcpd.helper.wire.securefile import ConfigFileError, read_secure_file

TOKEN_RE = re.compile(r"^mcpd_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
#: the longest OAuth access token taken (characters): larger ones are refused unread
MAX_JWT_CHARS = 8192
_JWT_RE = re.compile(r"[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*")
NAME_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
#: what a missing users file means (:func:`load_users`), as ``mcpd status`` and ``mcpd users check`` say it
MISSING_USERS_FILE = "missing (no principals yet: mcpd users add NAME --os-user ACCOUNT)"
#: what a principal or OS account name must be (:data:`NAME_RE`), for messages
NAME_TEXT = "a name of lowercase letters, digits, '_', '.' and '-' (at most 32, not starting with a digit, '.' or '-')"


class UsersFileError(Exception):
    """``users.yaml`` is unreadable, malformed, or breaks the schema above."""


@dataclass(frozen=True)
class Principal:
    """An authenticated caller.

    Attributes:
        name: the principal's name in ``users.yaml``.
        os_user: the OS account whose rights its unprivileged calls use (docs/REFERENCE.md §5.1).
        token_id: the 12-hex id of the token that authenticated this request (of an OAuth
            access token: the first 12 hex digits of its SHA-256).
        redact: the secret detectors its answers go through (docs/REFERENCE.md §3 "Redaction").
        scopes: an OAuth access token's scopes (docs/REFERENCE.md §5.4); ``None`` for static and
            login tokens, which are not limited by scope.
        expires: when an OAuth access token expires (UNIX seconds; 0: not an OAuth token).
        claims: an OAuth token's ``iss``, ``sub``, ``client``, ``act``, ``jti`` for the records.
        groups: an OAuth token's groups, ``<issuer>:<group>``.
    """

    name: str
    os_user: str
    token_id: str
    redact: tuple[str, ...] = ()
    scopes: tuple[str, ...] | None = None
    expires: float = 0.0
    claims: tuple[tuple[str, str], ...] = ()
    groups: tuple[str, ...] = ()

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Principal:
        """The principal the policy process sent (``dataclasses.asdict`` of one, as JSON).

        Raises:
            KeyError, TypeError, ValueError: not a principal's shape (an unknown detector:
                :class:`mcpd.common.redaction.RedactError`, a ValueError).
        """
        scopes = data.get("scopes")
        return cls(name=str(data["name"]), os_user=str(data["os_user"]), token_id=str(data["token_id"]),
                   redact=parse_redact(data.get("redact") or []),
                   scopes=None if scopes is None else tuple(str(s) for s in scopes),
                   expires=float(data.get("expires", 0.0)),
                   claims=tuple((str(k), str(v)) for k, v in data.get("claims", ())),
                   groups=tuple(str(g) for g in data.get("groups", ())))


@dataclass
class TokenRecord:
    """One stored token: its id, salt and digest (hex strings) and ISO 8601 times."""

    id: str
    salt: str
    sha256: str
    created: str
    expires: str | None = None


@dataclass
class UserRecord:
    """One principal in ``users.yaml``."""

    name: str
    os_user: str
    tokens: list[TokenRecord] = field(default_factory=list)
    redact: tuple[str, ...] = ()


def _digest(salt_hex: str, secret: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt_hex) + secret.encode("ascii")).hexdigest()


def new_token() -> tuple[str, TokenRecord]:
    """Create a fresh token.

    Returns:
        ``(plain_token, record)``; only the record may be stored.
    """
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)  # 32 bytes: always 43 URL-safe base64 characters (TOKEN_RE)
    salt = secrets.token_hex(16)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    record = TokenRecord(id=token_id, salt=salt, sha256=_digest(salt, secret), created=now)
    return f"mcpd_{token_id}_{secret}", record


_DUMMY_SALT = "00" * 16


def verify(users: dict[str, UserRecord], token: str, now: datetime.datetime | None = None) -> Principal | None:
    """Find the principal a plain ``token`` belongs to, in constant time per token.

    Returns ``None`` for a malformed, unknown, wrong or expired token (the caller answers 401).
    """
    m = TOKEN_RE.match(token)
    if not m:
        return None
    token_id, secret = m.group(1), m.group(2)
    found: tuple[UserRecord, TokenRecord] | None = None
    for user in users.values():
        for rec in user.tokens:
            if hmac.compare_digest(rec.id, token_id):
                found = (user, rec)
    if found is None:
        hmac.compare_digest(_digest(_DUMMY_SALT, secret), "0" * 64)
        return None
    user, rec = found
    if not hmac.compare_digest(_digest(rec.salt, secret), rec.sha256):
        return None
    if rec.expires:
        when = now or datetime.datetime.now(datetime.UTC)
        if when >= parse_time(rec.expires):
            return None
    return Principal(name=user.name, os_user=user.os_user, token_id=rec.id, redact=user.redact)


def login_principal(users: dict[str, UserRecord], os_user: str, token_id: str) -> Principal | None:
    """The identity a login token of OS account ``os_user`` acts as (docs/REFERENCE.md §5.3).

    It is the static principal that account is bound to in ``users.yaml``, so a login shares that
    principal's sessions, quotas, limits and workspace and never collides with another one's; when
    several principals are bound to the account, ``login:<os_user>``, a name no static principal
    can have (``NAME_RE`` has no ``:``). ``None`` when no principal is bound to it any more
    (``mcpd users remove``): the login token then authenticates nobody. A login redacts as its
    principal, with every bound principal's ``redact`` together.
    """
    bound = sorted(u.name for u in users.values() if u.os_user == os_user)
    if not bound:
        return None
    redact = union(*(users[n].redact for n in bound))
    return Principal(name=bound[0] if len(bound) == 1 else f"login:{os_user}", os_user=os_user, token_id=token_id,
                     redact=redact)


def looks_like_jwt(token: str) -> bool:
    """Whether ``token`` has an OAuth access token's shape: a compact JWS (three base64url parts)
    of at most :data:`MAX_JWT_CHARS` characters (docs/REFERENCE.md §5.4)."""
    return len(token) <= MAX_JWT_CHARS and _JWT_RE.fullmatch(token) is not None


def parse_time(value: str) -> datetime.datetime:
    """Parse an ISO 8601 UTC time (``2026-11-29T21:00:00Z``); raise ``ValueError`` if malformed."""
    dt = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.UTC)
    return dt


def _str(value: Any, where: str, expected: str, pattern: re.Pattern[str] | None = None) -> str:
    if isinstance(value, datetime.datetime):
        value = value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if not isinstance(value, str) or (pattern and not pattern.match(value)):
        raise UsersFileError(f"{where}: invalid value (expected {expected})")
    return value


_HEX12 = re.compile(r"^[0-9a-f]{12}$")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def parse_users(data: Any, source: str = "users.yaml") -> dict[str, UserRecord]:
    """Validate a parsed ``users.yaml`` mapping; raise :class:`UsersFileError` naming the bad key."""
    if data is None:
        return {}
    if not isinstance(data, dict) or set(data) - {"users"}:
        raise UsersFileError(f"{source}: top level must be a mapping with only 'users'")
    users_raw = data.get("users") or {}
    if not isinstance(users_raw, dict):
        raise UsersFileError(f"{source}: 'users' must be a mapping")
    users: dict[str, UserRecord] = {}
    for name, body in users_raw.items():
        where = f"{source}: users.{name}"
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise UsersFileError(f"{where}: invalid principal name (expected {NAME_TEXT})")
        if not isinstance(body, dict) or set(body) - {"os_user", "tokens", "redact"}:
            raise UsersFileError(f"{where}: expected keys os_user, tokens, redact")
        try:
            redact = parse_redact(body.get("redact"))
        except RedactError as exc:
            raise UsersFileError(f"{where}.redact: {exc}") from None
        os_user = _str(body.get("os_user"), f"{where}.os_user", f"an OS account: {NAME_TEXT}", NAME_RE)
        tokens: list[TokenRecord] = []
        for i, t in enumerate(body.get("tokens") or []):
            tw = f"{where}.tokens[{i}]"
            if not isinstance(t, dict) or set(t) - {"id", "salt", "sha256", "created", "expires"}:
                raise UsersFileError(f"{tw}: unknown or missing keys")
            expires = t.get("expires")
            tokens.append(
                TokenRecord(
                    id=_str(t.get("id"), f"{tw}.id", "12 lowercase hex digits, quoted", _HEX12),
                    salt=_str(t.get("salt"), f"{tw}.salt", "32 lowercase hex digits, quoted", _HEX32),
                    sha256=_str(t.get("sha256"), f"{tw}.sha256", "64 lowercase hex digits, quoted", _HEX64),
                    created=_str(t.get("created"), f"{tw}.created", "a UTC time like 2026-11-29T21:00:00Z"),
                    expires=None if expires is None else _str(expires, f"{tw}.expires",
                                                              "a UTC time like 2027-01-01T00:00:00Z"),
                )
            )
        users[name] = UserRecord(name=name, os_user=os_user, tokens=tokens, redact=redact)
    return users


def load_users(path: str | Path, owner_uid: int | None = None) -> dict[str, UserRecord]:
    """Read and validate ``users.yaml`` with the one strict YAML loader (duplicate keys refused;
    messages give lines, never the file's text, whose lines hold salts and digests). A missing
    file means no users.

    Args:
        path: the file.
        owner_uid: when given (0 for root's file, as the helper reads it), the file is read by
            :func:`mcpd.helper.wire.securefile.read_secure_file`: no symlink, owned by that uid, not
            group- or world-writable, checked on the open descriptor.

    Raises:
        UsersFileError: unreadable, unsafe, not YAML, or schema violation.
    """
    p = Path(path)
    try:
        # (filesig looks through root where this process may not enter the folder, as the policy
        # process may not enter /etc/mcpd: os.path.lexists would say "missing" there)
        if owner_uid is not None and filesig.signature(str(p)) is None:
            return {}
        text = p.read_text(encoding="utf-8") if owner_uid is None else read_secure_file(str(p), owner_uid)
        data = parse_strict_yaml(text, str(p))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise UsersFileError(f"{p}: cannot read: {getattr(exc, 'strerror', None) or 'not UTF-8'}") from exc
    except ConfigFileError as exc:
        raise UsersFileError("; ".join(exc.errors)) from exc
    return parse_users(data, str(p))


def dump_users(users: dict[str, UserRecord]) -> dict[str, Any]:
    """The YAML-ready mapping for ``users`` (inverse of :func:`parse_users`)."""
    out: dict[str, Any] = {}
    for name, u in sorted(users.items()):
        out[name] = {
            "os_user": u.os_user,
            "tokens": [
                {k: v for k, v in vars(t).items() if v is not None} for t in u.tokens
            ],
        }
        if u.redact:
            out[name]["redact"] = list(u.redact)
    return {"users": out}


def save_users(path: str | Path, users: dict[str, UserRecord]) -> None:
    """Atomically replace ``users.yaml`` with mode 0600 (rename over the old file). The new file is
    written first as ``.users.yaml.XXXXXXXX`` beside it (mode 0600): a name the daemon's fixed deny
    and root's secrets cover as they cover the file's swap files, even when the tool dies before
    the rename and leaves it there."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)  # .users.yaml.XXXXXXXX: the secret's own deny
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("# mcpd principals and token digests (docs/REFERENCE.md §5.1). Manage with `mcpd users`.\n")
            yaml.safe_dump(dump_users(users), f, sort_keys=False)
        os.chmod(tmp, 0o600)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
