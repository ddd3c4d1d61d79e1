"""The few settings of ``mcpd.yaml`` the root helper itself acts on, and the accounts it uses.

The root helper reads ``mcpd.yaml`` once, on a descriptor it checked, and takes from it only
what it needs to start the policy process and guard its own requests (:class:`RootSettings`).
The policy process validates the whole file against the full schema (:mod:`mcpd.common.config`,
whose defaults for these keys are the ones below) and refuses to start when it is invalid.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

EXIT_CONFIG = 78  # EX_CONFIG from sysexits.h: configuration broken, do not restart
WALK_USER = "mcpd-walk"  # the account of privileged list/find walkers (docs/PRIVSEP.md): owns nothing
POLICY_USER = "mcpd-policy"  # the account of the policy process: tokens, grants, logins, audit
#: the real gid a worker starts with ("nogroup"), its account's gid being its effective and saved
#: gid: no process of the account matches its credentials until it is non-dumpable (docs/PRIVSEP.md,
#: "A worker's start"); an account in this group gets no worker
WORKER_START_GID = 65534


@dataclasses.dataclass(frozen=True)
class RootSettings:
    """Paths and names from ``mcpd.yaml`` (top-level keys of the same names; ``pam_service`` is
    ``login.pam_service``, ``tls_key`` is ``tls.key``). Relative paths are taken from the config
    file's folder."""

    users_file: str = "/etc/mcpd/users.yaml"
    grants_file: str = "/etc/mcpd/mcp-sudo.yaml"
    helper_socket: str = "/run/mcpd/helper.sock"
    service_user: str = "mcpd"
    audit_log: str = "/var/log/mcpd/audit.jsonl"
    access_log: str = "/var/log/mcpd-front/access.jsonl"
    helper_state_dir: str = "/var/lib/mcpd-helper"
    pam_service: str = "mcpd"
    tls_key: str = "/etc/mcpd/tls/server.key"

    def private(self, config_path: str) -> tuple[str, ...]:
        """The daemon's own secrets root refuses to open whatever it is asked, as path prefixes (so
        ``F~``, ``F.1`` and everything in a folder go too): the config, users and grants files,
        the policy's state, the audit and access logs, the TLS key and the CA key beside it. The policy
        process checks the complete list, :func:`mcpd.policy.grants.secret_paths`."""
        return (config_path, self.users_file, self.grants_file, self.helper_state_dir, self.audit_log,
                self.access_log, self.tls_key, os.path.join(os.path.dirname(self.tls_key), "ca.key"))


def root_settings(data: Any, config_path: str) -> RootSettings:
    """Pick :class:`RootSettings` from a parsed ``mcpd.yaml`` mapping (``data``; anything else
    counts as empty). Raises ``ValueError`` when one of them is not a string."""
    data = data if isinstance(data, dict) else {}
    nested = {"pam_service": ("login", "pam_service"), "tls_key": ("tls", "key")}
    base, found = os.path.dirname(os.path.realpath(config_path)), {}
    for f in dataclasses.fields(RootSettings):
        outer, key = nested.get(f.name, (None, f.name))
        where = data.get(outer) if outer else data
        if isinstance(where, dict) and key in where:
            if not isinstance(where[key], str):
                raise ValueError(f"{config_path}: {f.name}: expected a string")
            value = where[key]
            found[f.name] = value if f.name in ("service_user", "pam_service") or not value else os.path.join(base, value)
    return RootSettings(**found)
