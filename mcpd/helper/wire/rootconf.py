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
DEV_TOKEN_FILE = "dev-token"  # the development mode's plain token, in ``state_dir``: a secret, never served
#: the real gid a worker starts with ("nogroup"), its account's gid being its effective and saved
#: gid: no process of the account matches its credentials until it is non-dumpable (docs/PRIVSEP.md,
#: rule 5: a worker's start); an account in this group gets no worker
WORKER_START_GID = 65534
NO_ID = 0xFFFFFFFF  # (uid_t) -1: setresuid() and setresgid() take it as "leave this id as it is"


def plain_ids(*ids: int) -> bool:
    """Whether every uid or gid in ``ids`` is a plain one: above 0 (root) and below :data:`NO_ID`
    (which Python's ``pwd`` and ``grp`` give as -1). Root starts nothing as an account with
    another id: a ``setresuid(-1, -1, -1)`` would leave the child root."""
    return all(0 < i < NO_ID for i in ids)


@dataclasses.dataclass(frozen=True)
class RootSettings:
    """Paths and names from ``mcpd.yaml`` (top-level keys of the same names; ``pam_service`` is
    ``login.pam_service``, ``tls_key`` is ``tls.key``, ``per_account`` is ``workers.per_account``).
    Relative paths are taken from the config file's folder."""

    users_file: str = "/etc/mcpd/users.yaml"
    grants_file: str = "/etc/mcpd/mcp-sudo.yaml"
    service_user: str = "mcpd"
    audit_log: str = "/var/log/mcpd/audit.jsonl"
    access_log: str = "/var/log/mcpd-front/access.jsonl"
    helper_state_dir: str = "/var/lib/mcpd-helper"
    pam_service: str = "mcpd"
    tls_key: str = "/etc/mcpd/tls/server.key"
    state_dir: str = "/var/lib/mcpd"
    per_account: int = 4  # workers.per_account: root's own bound on one account's workers is 4 times it

    def private(self, config_path: str) -> tuple[str, ...]:
        """The daemon's own secrets root refuses to open whatever it is asked, as path prefixes for
        :func:`covered` (a file ``F`` as ``F``, so ``F~`` and ``F.1`` go too; a folder ``D`` as ``D/``,
        so ``D`` and everything in it go, ``D-other`` not), the same set as the policy's fixed deny
        (:func:`mcpd.policy.grants.secret_paths`): the config, users and grants files, the audit
        and access logs, the TLS key, the CA key beside it and the development mode's plain token,
        each file ``F`` also as ``.F`` in its folder (editor swap files); the policy's state
        (``helper_state_dir`` and ``helper`` in ``state_dir``), the audit log's folder when it is
        its own (named ``mcpd`` or ``audit``) and the keys' folder when it is named ``tls``."""
        audit_dir, key_dir = os.path.dirname(self.audit_log), os.path.dirname(self.tls_key)
        files = [config_path, self.users_file, self.grants_file, self.audit_log, self.access_log, self.tls_key,
                 os.path.join(key_dir, "ca.key"), os.path.join(self.state_dir, DEV_TOKEN_FILE) if self.state_dir else ""]
        folders = [self.helper_state_dir, os.path.join(self.state_dir, "helper") if self.state_dir else "",
                   audit_dir if self.audit_log and os.path.basename(audit_dir) in ("mcpd", "audit") else "",
                   key_dir if os.path.basename(key_dir) == "tls" else ""]
        dots = [os.path.join(os.path.dirname(f), "." + os.path.basename(f)) for f in files if f]
        return tuple([p for p in files + dots if os.path.isabs(p)] + [f.rstrip("/") + "/" for f in folders if os.path.isabs(f)])


def covered(path: str, prefixes: tuple[str, ...]) -> bool:
    """Whether ``path`` is at or below one of ``prefixes`` (:meth:`RootSettings.private`'s form)."""
    return path.startswith(prefixes) or (path + "/").startswith(prefixes)


def root_settings(data: Any, config_path: str) -> RootSettings:
    """Pick :class:`RootSettings` from a parsed ``mcpd.yaml`` mapping (``data``; anything else
    counts as empty). Raises ``ValueError`` when one of them is not a string (``per_account``: an
    integer)."""
    data = data if isinstance(data, dict) else {}
    nested = {"pam_service": ("login", "pam_service"), "tls_key": ("tls", "key"), "per_account": ("workers", "per_account")}
    base, found = os.path.dirname(os.path.realpath(config_path)), dict[str, Any]()
    for f in dataclasses.fields(RootSettings):
        outer, key = nested.get(f.name, (None, f.name))
        where = data.get(outer) if outer else data
        if isinstance(where, dict) and key in where:
            if type(where[key]) is not type(f.default):
                raise ValueError(f"{config_path}: {f.name}: expected {'a string' if f.type == 'str' else 'an integer'}")
            value = where[key]
            found[f.name] = value if f.name in ("service_user", "pam_service", "per_account") or not value else os.path.join(base, value)
    return RootSettings(**found)
