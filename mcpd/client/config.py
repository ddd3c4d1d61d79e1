"""linuxctl's connection settings: flags, environment, and the config file with contexts.

The file is ``$XDG_CONFIG_HOME/linuxctl/config.yaml`` (default ``~/.config/linuxctl/config.yaml``);
every key is optional::

    current-context: prod          # the context used when --context / MCPD_CONTEXT is not given
    contexts:                      # one entry per server, like kubectl's contexts
      prod: {url: "https://files.example.com:9091", cacert: /etc/ssl/mcpd-prod-ca.crt}
      staging: {url: "https://staging:9091", token: mcpd_...}   # a file with a token: chmod 600
    cacert: /etc/ssl/our-ca.crt    # top-level url/token/cacert: defaults for every context

Which source wins for each of url, token and cacert (flags, an explicit context, the environment,
``current-context``, the top level, and last the context's tokens from ``linuxctl login --oidc``,
:mod:`mcpd.client.tokenstore`) is :func:`resolve`'s, as docs/REFERENCE.md §6 states it. A
missing file is an empty one. Errors are :class:`~mcpd.client.errors.UsageError` (exit 2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcpd.client.errors import UsageError
from mcpd.common.strictyaml import parse_strict_yaml
from mcpd.helper.wire.securefile import ConfigFileError

KEYS = ("url", "token", "cacert")
TOP_KEYS = frozenset({*KEYS, "contexts", "current-context"})


@dataclass
class Settings:
    """Connection settings as given on the command line or in the environment (may be incomplete).

    ``from_env`` names which of url/token/cacert came from the environment rather than a flag;
    ``context`` is the explicitly chosen context (None: the file's ``current-context``, if any).
    """

    url: str | None
    token: str | None
    cacert: str | None
    timeout: float
    context: str | None = None
    from_env: frozenset[str] = field(default_factory=frozenset)
    transport: str = "auto"  # "auto", "http" (Streamable HTTP, /mcp) or "sse" (/sse)


@dataclass
class ConfigFile:
    """A parsed config file: ``top`` (url/token/cacert), ``contexts`` by name, ``current``."""

    top: dict[str, str]
    contexts: dict[str, dict[str, str]]
    current: str | None


def config_path() -> Path:
    """The config file path: ``$XDG_CONFIG_HOME/linuxctl/config.yaml`` or ``~/.config/...``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "linuxctl" / "config.yaml"


def _fields(path: Path, where: str, data: Any) -> dict[str, str]:
    if not isinstance(data, dict) or set(data) - set(KEYS):
        raise UsageError(f"{path}: {where} must be a mapping with only the keys url, token, cacert")
    if not all(isinstance(v, str) for v in data.values()):
        raise UsageError(f"{path}: {where}: url, token and cacert must be strings")
    return dict(data)


def load_config_file(path: Path) -> ConfigFile:
    """Read the optional config file; a missing file is empty.

    Raises:
        UsageError: unreadable, not YAML, an unknown key or a wrongly typed value, a
            ``current-context`` naming no context, or a token anywhere while the file is
            readable by group or others.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return ConfigFile({}, {}, None)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from exc
    with os.fdopen(fd, encoding="utf-8") as f:
        mode = os.fstat(f.fileno()).st_mode
        try:
            data = parse_strict_yaml(f.read(), str(path))
        except (ConfigFileError, UnicodeDecodeError) as exc:
            raise UsageError(f"{path}: not valid YAML") from exc
    if data is None:
        return ConfigFile({}, {}, None)
    if not isinstance(data, dict) or set(data) - TOP_KEYS:
        raise UsageError(f"{path}: expected a mapping with only the keys url, token, cacert, contexts, "
                         "current-context")
    top = _fields(path, "the top level", {k: v for k, v in data.items() if k in KEYS})
    raw = data.get("contexts") or {}
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: contexts must be a mapping of names to url/token/cacert")
    contexts = {str(name): _fields(path, f"context {name}", value) for name, value in raw.items()}
    current = data.get("current-context")
    if current is not None and (not isinstance(current, str) or current not in contexts):
        raise UsageError(f"{path}: current-context names no context under contexts")
    if mode & 0o077 and ("token" in top or any("token" in c for c in contexts.values())):
        raise UsageError(f"{path}: holds a token but is readable by others (chmod 600 it)")
    return ConfigFile(top, contexts, current)


def resolve(settings: Settings, *, need_token: bool = True) -> tuple[str, str, str | None]:
    """Fill missing settings from the config file (see the module docstring for precedence).

    Returns:
        ``(url, token, cacert or None)``; ``token`` is ``""`` when ``need_token`` is False and
        none was found.

    Raises:
        UsageError: an unknown context, no URL, or (with ``need_token``) no token anywhere; and
            :func:`load_config_file`'s errors.
    """
    given = {"url": settings.url, "token": settings.token, "cacert": settings.cacert}
    flags = {k: v for k, v in given.items() if v and k not in settings.from_env}
    env = {k: v for k, v in given.items() if v and k in settings.from_env}
    layers: list[dict[str, str]] = [flags, env]
    name = settings.context
    if settings.context is not None or not all(k in flags or k in env for k in KEYS):
        path = config_path()
        file = load_config_file(path)
        name = settings.context or file.current
        chosen: dict[str, str] = {}
        if name is not None:
            if name not in file.contexts:
                known = ", ".join(sorted(file.contexts)) or "none"
                raise UsageError(f"no context {name!r} in {path} (known: {known})")
            chosen = file.contexts[name]
        layers = [flags, chosen, env, file.top] if settings.context is not None else [flags, env, chosen, file.top]
    merged: dict[str, str] = {}
    for layer in reversed(layers):
        merged.update(layer)
    if not merged.get("url"):
        raise UsageError("no server URL: use --url, MCPD_URL, --context or the config file")
    if need_token and not merged.get("token"):
        from mcpd.client.tokenstore import usable_token

        merged["token"] = usable_token(name, merged["url"], settings.timeout) or ""
    if need_token and not merged.get("token"):
        raise UsageError("no token: use --token, MCP_TOKEN, linuxctl login (--oidc) or the config file")
    return merged["url"], merged.get("token", ""), merged.get("cacert") or None
