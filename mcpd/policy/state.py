"""What every request handler of the policy process shares.

:class:`State` (the configuration, the audit log, the users and grants in force, the root
client, the login tokens, the live workers and their descriptors), :class:`Worker` (one worker
this process started, bound to one principal), :func:`principal_of` (the principal of a request's token,
or its refusal) and :class:`Refused` (a request that ends its connection). It holds no handler.
"""

from __future__ import annotations

import collections
import dataclasses
import socket
import threading
from typing import Any

from mcpd.common import identity
from mcpd.common.audit.records import find_fields
from mcpd.common.audit.writer import AuditLog
from mcpd.common.buckets import TokenBuckets
from mcpd.common.config import Config
from mcpd.common.reload import Reloading
from mcpd.helper.wire.errors import PERMISSION_DENIED, ToolError
from mcpd.policy.confirm import Confirmations
from mcpd.policy.grants_reload import PolicyHolder
from mcpd.policy.login import Issued, Login, Store
from mcpd.policy.oauth import OAuthRefused, OAuthVerifier, oauth_token_id
from mcpd.policy.opened import OpenedFiles
from mcpd.policy.rootclient import RootClient

CONTENT_OPS = ("files/read", "files/filetype")
WALK_OPS = {"files/list": "path", "files/find": "root"}  # walk op -> its path argument (the walker parses the rest)
GREP_OP = "files/grep"  # walked by a walker, each file opened by root, searched by the worker (mcpd.policy.grepcall)
EXITED_KEPT = 256  # ended workers whose owner is remembered (State.exited)


class Refused(Exception):
    """A request that ends its connection with an audit ``alert`` (reason in the message)."""


@dataclasses.dataclass
class Worker:
    """A worker this process started: bound to one principal (name and OS account)."""

    pid: int
    pidfd: int
    owner: tuple[str, str]
    ctl: socket.socket
    token_id: str = ""  # the token that spawned it: the worker ends when it no longer authenticates
    login: bool = False  # a password login's token (else one in users.yaml, or an OAuth token)
    #: an OAuth access token's exp (UNIX seconds): the worker is bound to it until then; 0: not one
    oauth_expires: float = 0.0
    busy: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    reports: bytearray = dataclasses.field(default_factory=bytearray)  # bytes of its reports read so far
    checked: bool = False  # seen hardened (_started), which it must be before it gets a descriptor


@dataclasses.dataclass
class State:
    """Everything the handlers share."""

    cfg: Config
    audit: AuditLog
    users: Reloading[dict[str, identity.UserRecord]]
    policy: PolicyHolder
    root: RootClient
    issued: Store
    login: Login
    #: OAuth access tokens' verifier (docs/REFERENCE.md §5.4); None: OAuth is off
    oauth: OAuthVerifier | None = None
    workers: dict[int, Worker] = dataclasses.field(default_factory=dict)
    #: the owners of the workers last seen ending (pid -> owner), at most EXITED_KEPT: the front's
    #: kill request for one it found dead is answered without an alert (it is no attack)
    exited: collections.OrderedDict[int, tuple[str, str]] = dataclasses.field(default_factory=collections.OrderedDict)
    opened: OpenedFiles = dataclasses.field(default_factory=OpenedFiles)
    #: the control sockets of ended workers whose peer end still holds something this process
    #: sent (SIOCOUTQ above 0), per owner, under ``lock``: kept open only to see when it is released
    untaken: dict[tuple[str, str], list[socket.socket]] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    #: workers started per principal (under ``lock``): twice the front's bucket, so the front's own
    #: bound is never met here, even with its requests delayed or after a restart of the front; a
    #: front that asks past it (compromised) is refused without an audit record per request
    spawns: TokenBuckets = dataclasses.field(init=False)
    #: step-up sign-ins and approvals waiting for a person (mcpd.policy.confirm): here, never in root
    confirms: Confirmations = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.spawns = TokenBuckets(2 * self.cfg.workers.spawn_burst, self.cfg.workers.spawns_per_second)
        self.confirms = Confirmations(self.audit, self.cfg.login.confirm_seconds)

    def authenticate(self, token: str) -> tuple[identity.Principal, Issued | None] | None:
        """The principal of a ``users.yaml`` token, of a login token or of an OAuth access token
        (docs/REFERENCE.md §5), else None (an OAuth token's reason is in a ``reject`` record)."""
        if self.oauth is not None and identity.looks_like_jwt(token):
            try:
                return self.oauth.verify(token), None
            except OAuthRefused as exc:
                if exc.signed:  # a genuine token refused (expired, audience, account): who, and why
                    self.audit.record("reject", tool="authenticate", decision="reject", reason=f"oauth: {exc}",
                                      route="oauth", token_id=oauth_token_id(token), **dict(exc.claims))
                return None
        self.users.refresh()
        principal = identity.verify(self.users.current, token)
        if principal is not None:
            return principal, None
        rec = self.issued.verify(token)
        if rec is None or not self.root.usable(rec.os_user):  # locked or expired since the login
            return None
        principal = identity.login_principal(self.users.current, rec.os_user, rec.id)
        return None if principal is None else (principal, rec)


def principal_of(state: State, req: dict[str, Any]) -> tuple[identity.Principal, Issued | None]:
    """The principal of the request's token; else one ``reject`` record (for a privileged call:
    its tool, route and requested path, as any other refusal of a call names them) and
    ``PERMISSION_DENIED`` (reason ``invalid token``)."""
    found = state.authenticate(req["token"])
    if found is None:
        call = {}
        if req["type"] == "privileged_call":
            path = req["args"].get(WALK_OPS.get(req["op"], "path"))
            call = {"route": "privileged", "requested_path": path if isinstance(path, str) else None,
                    **find_fields(req["op"], req["args"])}
        state.audit.record("reject", tool=req.get("op", req["type"]), decision="reject", reason="invalid token",
                           session=req.get("session"), peer=req.get("peer"), **call)
        raise ToolError(PERMISSION_DENIED, "permission denied", reason="invalid token")
    return found

