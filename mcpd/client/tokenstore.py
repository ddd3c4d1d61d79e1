"""Where ``linuxctl login --oidc`` keeps a context's OAuth tokens, and how they are used later.

One file per context: ``$XDG_CONFIG_HOME/linuxctl/tokens/CONTEXT.json`` (default
``~/.config/linuxctl/tokens/``; ``default`` when no context is chosen), mode 0600 in a 0700
folder, written whole (a new file, then rename) and never through a symlink. It holds the access
token, its expiry, the refresh token, and what a refresh needs (issuer, token endpoint, client id,
scope, resource, the CA file trusted for the IdP) and the server it was got for, to which alone it
is ever sent. A file readable by group or others, or not the caller's, is refused.

:func:`usable_token` gives the stored access token to :func:`mcpd.client.config.resolve`,
refreshing it first when it expires within :data:`REFRESH_MARGIN` seconds and a refresh token is
there; an expired token without one is dropped (the caller logs in again).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
import time
from pathlib import Path
from typing import Any

from mcpd.client.errors import AuthError, MCPClientError, UsageError

REFRESH_MARGIN = 60.0  # seconds before expiry a stored token is renewed
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
FIELDS = ("access_token", "expires_at", "refresh_token", "scope", "issuer", "token_endpoint", "client_id",
          "resource", "audience", "idp_cafile", "server")


def token_path(context: str | None) -> Path:
    """The file of ``context`` (None: ``default``).

    Raises:
        UsageError: a context name that cannot be a file name.
    """
    name = context or "default"
    if not _NAME_RE.fullmatch(name):
        raise UsageError(f"context name {name[:80]!r} cannot name a token file (letters, digits, '.', '_', '-')")
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "linuxctl" / "tokens" / f"{name}.json"


def save(context: str | None, record: dict[str, Any]) -> Path:
    """Write ``record`` (the :data:`FIELDS`) for ``context``: 0600, atomically; return the path.

    Raises:
        UsageError: the folder is a symlink, not the caller's, or open to others.
    """
    path = token_path(context)
    folder = path.parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise UsageError(f"{folder}: must be your own folder, mode 0700, not a symlink")
    data = json.dumps({k: record.get(k, "") for k in FIELDS}).encode()
    tmp = folder / f".{path.name}.{secrets.token_hex(4)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


def load(context: str | None) -> dict[str, Any] | None:
    """The stored record of ``context``, or None when there is none.

    Raises:
        UsageError: a symlink, not the caller's, readable by others, or not a record.
    """
    path = token_path(context)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise UsageError(f"{path}: holds a token but is not your own file of mode 0600 (chmod 600 it)")
        raw = f.read(64 * 1024 + 1)
    try:
        record = json.loads(raw)
    except ValueError:
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("access_token"), str):
        raise UsageError(f"{path}: not a token record; remove it and log in again")
    return record


def server_key(url: str) -> str:
    """The server a token is kept for: its ``/mcp`` URL (scheme, host, port and base path).

    Raises:
        UsageError: not an https URL.
    """
    from mcpd.client.endpoints import endpoints

    return endpoints(url)[0]


def forget(context: str | None) -> bool:
    """Remove the stored tokens of ``context``; True when there were some."""
    try:
        os.unlink(token_path(context))
    except FileNotFoundError:
        return False
    return True


def usable_token(context: str | None, url: str, timeout: float) -> str | None:
    """The stored access token of ``context`` for the server ``url``, refreshed when due; None
    when there is none usable, or the token was got for another server (it is never sent to any
    server but the one it was got for, whatever the context says now).

    Raises:
        UsageError: an unsafe token file (:func:`load`).
    """
    record = load(context)
    if record is None or record.get("server") != server_key(url):
        return None
    expires_at = float(record.get("expires_at") or 0)
    if not expires_at or expires_at - time.time() > REFRESH_MARGIN:
        return str(record["access_token"])
    if not record.get("refresh_token") or not record.get("token_endpoint"):
        return None if expires_at < time.time() else str(record["access_token"])
    from mcpd.client import oidc

    provider = oidc.Provider(str(record.get("issuer", "")), str(record["token_endpoint"]))
    request = oidc.Request(str(record.get("client_id", "")), str(record.get("scope", "")),
                           str(record.get("resource", "")), str(record.get("audience", "")))
    try:
        tokens = oidc.refresh(provider, request, str(record["refresh_token"]), record.get("idp_cafile") or None,
                              timeout)
    except AuthError:
        forget(context)  # the refresh token is dead: log in again
        return None
    except MCPClientError:
        return None if expires_at < time.time() else str(record["access_token"])
    save(context, {**record, "access_token": tokens.access_token, "expires_at": tokens.expires_at,
                   "refresh_token": tokens.refresh_token})
    return tokens.access_token
