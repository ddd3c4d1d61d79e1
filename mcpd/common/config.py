"""The daemon configuration (``mcpd.yaml``): one typed schema, validated once.

Every option lives in exactly one dataclass field below with its default; the YAML file may set
any subset. Unknown keys and wrongly typed values are configuration errors
(:class:`ConfigError`), which ``mcpd serve`` reports and exits with
:data:`EXIT_CONFIG` so systemd does not restart it (``RestartPreventExitStatus=78``).

Example (every key optional)::

    listen: {host: 0.0.0.0, port: 9091}
    tls: {cert: /etc/mcpd/tls/server.crt, key: /etc/mcpd/tls/server.key}
    base_path: ""                  # public prefix added by a reverse proxy, e.g. /files
    allowed_origins: []            # Origin values accepted on /sse, /message and /mcp (docs/REFERENCE.md §1.3)
    allowed_hosts: []              # Host values accepted (421 otherwise); auto = the certificate's names
    keepalive_seconds: 15          # ': ping' comment interval on idle streams (docs/REFERENCE.md §1.2)
    max_body_bytes: 4194304        # POST /message body cap (docs/REFERENCE.md §1.3)
    session_queue_size: 256        # outgoing messages buffered per session (docs/REFERENCE.md §1.4)
    session_queue_bytes: 16777216  # and at most this many bytes of them, also per /mcp POST and per batch answer (docs/REFERENCE.md §1.7)
    principal_queue_bytes: 134217728  # outgoing bytes one principal's sessions, /mcp POST streams and unread /mcp answers hold together
    total_queue_bytes: 536870912   # and all principals' together (past either: disconnected as for a full queue)
    max_in_flight: 64              # requests of one session running at once (-32000 beyond)
    max_batch: 256                 # members of one batch (beyond: the batch is refused whole, one -32600)
    max_privileged_per_principal: 32  # privileged calls of one principal in flight (RATE_LIMITED beyond)
    max_calls_per_principal: 1024  # unprivileged calls of one principal waiting or running (RATE_LIMITED beyond)
    metrics_listen: ""             # HOST:PORT on loopback for /metrics and /healthz (plain HTTP); "": off
    max_sessions: 1000             # open sessions in total, /sse and /mcp together (503 beyond)
    max_sessions_per_principal: 100  # open sessions of one principal, both transports (429 beyond)
    mcp_session_idle_seconds: 3600 # a Streamable HTTP session with no request nor GET stream this long ends
    mcp_session_evict_seconds: 60  # one idle this long makes room for a new session at a full cap (0: never)
    tool_names: slash              # "portable": tools/list says files_read ... (calls accept both)
    users_file: /etc/mcpd/users.yaml
    grants_file: /etc/mcpd/mcp-sudo.yaml
    helper_socket: /run/mcpd/helper.sock   # empty: no root helper (privileged → HELPER_UNAVAILABLE)
    service_user: mcpd             # the only uid the policy process accepts on the helper socket (SO_PEERCRED)
    auth_cache_seconds: 30         # how long the front may reuse a token the policy process verified while it is down
    audit_log: /var/log/mcpd/audit.jsonl
    access_log: /var/log/mcpd-front/access.jsonl   # the front's record of calls not sent to the policy process
    audit: {checkpoint_records: 100, checkpoint_seconds: 60,   # both chains' checkpoints: every N records or M s
            syslog_socket: /dev/log}   # where their syslog copy goes ("": none; the journal copy goes too)
    state_dir: /var/lib/mcpd       # the front's state (0750 mcpd)
    helper_state_dir: /var/lib/mcpd-helper   # the policy process's state (0700 mcpd-policy): issued tokens
    read: {default_bytes: 10240, response_cap: 10485760, max_line_bytes: 65536,
           grep_file_bytes: 1073741824, grep_total_bytes: 8589934592, grep_max_ratio: 200}   # files/grep's limits; files/read's decompression too
    tasks: {max_per_principal: 16, default_ttl_seconds: 300, max_ttl_seconds: 3600,
            poll_interval_seconds: 1, max_result_bytes: 67108864}   # files/find and files/grep as MCP tasks
    workers: {per_account: 4, timeout_seconds: 10, max_accounts: 64,
              spawn_burst: 16, spawns_per_second: 1,   # workers started per principal: a burst, then a rate
              cancel_grace_seconds: 0.25}   # a cancelled call's worker may finish this long and is kept; 0: killed
    connections: {max_total: 4096, max_per_address: 1024, handshake_seconds: 10, header_seconds: 10,
                  body_seconds: 30, idle_seconds: 15, max_header_bytes: 65536}   # what one client connection may hold
    workspaces: {alice: /srv/projects/alice}   # root of relative file: resource URIs, per principal
    default_workspace: "~"         # for principals not listed: "~" = the OS account's home, "" = none
    login: {pam_service: mcpd, token_ttl_seconds: 28800, free_failures: 2, base_delay_seconds: 0.5,
            max_delay_seconds: 4, max_failures: 5, lockout_seconds: 900, answer_seconds: 3.2,
            tokens_per_user: 10, in_flight: 8, in_flight_per_address: 2}   # password logins (docs/REFERENCE.md §5.2, §5.3)
    limits:                        # per principal; 0 = unlimited (requests) / read.response_cap (bytes)
      default: {requests_per_day: 0, max_file_bytes: 0}
      tiers: {small: {requests_per_day: 100, max_file_bytes: 1048576}}
      users: {alice: small}        # principal -> tier (login principals are named after the OS account)
      save_every: 20               # counters hit disk every N requests and at shutdown
    oauth:                         # OAuth 2.1 resource server (docs/REFERENCE.md §5.4); absent: off
      resource: https://files.example.com:9091/mcp
      scopes_supported: [files:read, files:privileged]
      leeway_seconds: 60
      issuers: [{name: corp, issuer: https://idp.example.com/realms/corp,
                 jwks_file: /var/lib/mcpd-jwks/corp.json, jwks_uri: https://idp.example.com/certs,
                 audiences: [https://files.example.com:9091/mcp], algorithms: [RS256, ES256],
                 principal_claim: sub, account_claim: preferred_username, accounts: ["*"],
                 groups_claim: groups, client_id: mcpd-cli}]
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any

from mcpd.common.oauthconfig import OAuth, OAuthIssuer, check_oauth
from mcpd.common.strictyaml import parse_strict_yaml
from mcpd.helper.wire.rootconf import DEV_TOKEN_FILE, EXIT_CONFIG, POLICY_USER, WALK_USER, RootSettings  # noqa: F401
from mcpd.helper.wire.securefile import ConfigFileError, read_secure_file

__all__ = ["EXIT_CONFIG", "POLICY_USER", "WALK_USER", "Config", "ConfigError", "OAuth", "OAuthIssuer", "load",
           "from_dict"]
_ROOT = RootSettings()  # the defaults of the keys the root helper reads itself
# base_path: "/seg/seg", each segment plain (served and advertised alike), none "." or ".."
_BASE_PATH_RE = re.compile(r"(?:/(?!\.\.?(?:/|$))[A-Za-z0-9._~-]+)+")


class ConfigError(Exception):
    """The configuration file is unreadable, not YAML, or breaks the schema (message says where)."""


@dataclasses.dataclass(frozen=True)
class Listen:
    """Where the TLS listener binds (docs/REFERENCE.md §1.1)."""

    host: str = "0.0.0.0"
    port: int = 9091


@dataclasses.dataclass(frozen=True)
class TLS:
    """Certificate chain and private key files (PEM) for the listener (docs/REFERENCE.md §1.1)."""

    cert: str = "/etc/mcpd/tls/server.crt"
    key: str = _ROOT.tls_key


@dataclasses.dataclass(frozen=True)
class ReadLimits:
    """docs/REFERENCE.md §3 sizes, in bytes; ``grep_*``: files/grep's limits (bytes of text per
    file and per call, decompressed; the largest decompression ratio before a file is a bomb);
    ``grep_file_bytes`` and ``grep_max_ratio`` also bound files/read's decompression."""

    default_bytes: int = 10240
    response_cap: int = 10 * 1024 * 1024
    max_line_bytes: int = 64 * 1024
    grep_file_bytes: int = 1024 * 1024 * 1024
    grep_total_bytes: int = 8 * 1024 * 1024 * 1024
    grep_max_ratio: int = 200


#: Reserved key in the args of a worker-bound request: this call's own response cap in bytes (the
#: principal's ``max_file_bytes``, set by mcpd.front.limits, honoured by mcpd.core.ops when it is
#: below ``ReadLimits.response_cap``).
CAP_KEY = "_cap"

#: Bytes of a regular file that ``files/filetype`` reads and judges (64 KiB): on the privileged
#: route the policy process copies exactly these into a sealed memfd for the worker.
SAMPLE_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class Workers:
    """Worker pool sizing: per OS account, with a per-request deadline in seconds, and
    how fast one principal may have workers started (a token bucket: ``spawn_burst`` at once, then
    ``spawns_per_second``; a call that needs a new worker past that is refused ``RATE_LIMITED``), and
    how long a cancelled call's worker may still finish its op, its reply discarded, before it is
    killed (``cancel_grace_seconds``, 0 to 60, and never past the call's own deadline; 0: killed
    at once)."""

    per_account: int = 4
    timeout_seconds: float = 10.0
    max_accounts: int = 64
    spawn_burst: int = 16  # at least per_account: an account's first parallel calls all get a worker
    spawns_per_second: float = 1.0
    cancel_grace_seconds: float = 0.25  # a worker that finishes within it is kept: cancelling costs no spawn


@dataclasses.dataclass(frozen=True)
class Tasks:
    """Tool calls run as MCP tasks (docs/REFERENCE.md §2.6): how many one principal keeps at once
    (running or finished, until each one's time to live ends), the time to live a task gets when
    its client names none and the longest it may ask for (seconds; a task is dropped, its work
    stopped and its result freed, when it ends), the polling interval suggested to clients, and the
    bytes of results one principal's tasks hold at once (a result past them is a ``FILE_TOO_LARGE``
    error result)."""

    max_per_principal: int = 16
    default_ttl_seconds: float = 300.0
    max_ttl_seconds: float = 3600.0
    poll_interval_seconds: float = 1.0
    max_result_bytes: int = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Connections:
    """What one client connection may hold (docs/REFERENCE.md §1.7): counts, and seconds to send each part."""

    max_total: int = 4096  # TLS connections at once; more are closed at once
    max_per_address: int = 1024  # from one client address
    handshake_seconds: float = 10.0  # to finish the TLS handshake
    header_seconds: float = 10.0  # from a request's first byte (or the connection's start) to its last header
    body_seconds: float = 30.0  # from the last header to the last byte of the body
    #: a kept-alive connection with no request in flight; a stream taking nothing, queue full. Longer
    #: than the usual clients' keep-alive (httpx, the SDKs: 5 s), so the client closes an idle
    #: connection first and never sends a request on one the server is closing
    idle_seconds: float = 15.0
    max_header_bytes: int = 65536  # a request's line and headers, received while they are unfinished


@dataclasses.dataclass(frozen=True)
class Login:
    """Password logins (docs/REFERENCE.md §5.2, §5.3): PAM service, token lifetime, lockout (seconds, counts),
    the one answer time of every login (above PAM's failure delay: pam_unix asks 2 s, which libpam
    randomises to 1-3 s), live tokens per account, logins in flight (in total, per address)."""

    pam_service: str = _ROOT.pam_service
    token_ttl_seconds: float = 8 * 3600.0
    free_failures: int = 2
    base_delay_seconds: float = 0.5
    max_delay_seconds: float = 4.0
    max_failures: int = 5
    lockout_seconds: float = 900.0
    answer_seconds: float = 3.2
    tokens_per_user: int = 10
    in_flight: int = 8
    in_flight_per_address: int = 2
    #: seconds a step-up sign-in or an approval waits for its person (mcpd.policy.confirm)
    confirm_seconds: float = 300.0


@dataclasses.dataclass(frozen=True)
class UserLimits:
    """One tier of per-principal limits (issue 5): ``0`` means unlimited / the response cap."""

    requests_per_day: int = 0
    max_file_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-principal limits: ``default`` tier, named ``tiers``, ``users`` (principal → tier name);
    counters are saved every ``save_every`` requests and at shutdown (see ``mcpd/front/limits.py``)."""

    default: UserLimits = UserLimits()
    tiers: dict[str, UserLimits] = dataclasses.field(default_factory=dict)
    users: dict[str, str] = dataclasses.field(default_factory=dict)
    save_every: int = 20


@dataclasses.dataclass(frozen=True)
class Audit:
    """Checkpoints of both logs' chains (docs/REFERENCE.md §7.3): one after at most
    ``checkpoint_records`` records (>= 1), and at most ``checkpoint_seconds`` (> 0, at most a day)
    after a record; to the journal and to ``syslog_socket`` (an absolute path, or ``""``: no syslog copy)."""

    checkpoint_records: int = 100
    checkpoint_seconds: float = 60.0
    syslog_socket: str = "/dev/log"

    def writer_args(self) -> dict[str, Any]:
        """The :class:`mcpd.common.audit.writer.AuditLog` arguments these settings mean."""
        return {"checkpoints": (self.checkpoint_records, self.checkpoint_seconds), "syslog_socket": self.syslog_socket}


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole daemon configuration; build it with :func:`load` or :func:`from_dict`."""

    listen: Listen = Listen()
    tls: TLS = TLS()
    base_path: str = ""
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    keepalive_seconds: float = 15.0
    max_body_bytes: int = 4 * 1024 * 1024
    session_queue_size: int = 256
    session_queue_bytes: int = 16 * 1024 * 1024
    principal_queue_bytes: int = 128 * 1024 * 1024
    total_queue_bytes: int = 512 * 1024 * 1024
    max_in_flight: int = 64
    max_batch: int = 256
    max_privileged_per_principal: int = 32
    max_calls_per_principal: int = 1024
    metrics_listen: str = ""
    max_sessions: int = 1000
    max_sessions_per_principal: int = 100
    tool_names: str = "slash"
    mcp_session_idle_seconds: float = 3600.0
    mcp_session_evict_seconds: float = 60.0
    users_file: str = _ROOT.users_file
    grants_file: str = _ROOT.grants_file
    helper_socket: str = "/run/mcpd/helper.sock"
    service_user: str = _ROOT.service_user
    auth_cache_seconds: float = 30.0
    audit_log: str = _ROOT.audit_log
    access_log: str = _ROOT.access_log
    audit: Audit = Audit()
    state_dir: str = _ROOT.state_dir
    helper_state_dir: str = _ROOT.helper_state_dir
    read: ReadLimits = ReadLimits()
    workers: Workers = Workers()
    tasks: Tasks = Tasks()
    connections: Connections = Connections()
    workspaces: dict[str, str] = dataclasses.field(default_factory=dict)
    default_workspace: str = "~"
    login: Login = Login()
    limits: Limits = Limits()
    oauth: OAuth = OAuth()


def _convert(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list")
        (item,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
        return tuple(_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping")
        key_hint, value_hint = typing.get_args(hint)
        return {_convert(k, key_hint, f"{where} key"): _convert(v, value_hint, f"{where}.{k}") for k, v in value.items()}
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:  # (NaN: no number)
            raise ConfigError(f"{where}: expected a number")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false")
        return value
    if isinstance(hint, types.UnionType):  # pragma: no cover - no unions in the schema yet
        raise ConfigError(f"{where}: unsupported type")
    raise ConfigError(f"{where}: unsupported type")


def _build(cls: Any, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names, key=str)
    if unknown:
        raise ConfigError(f"{where or 'config'}: unknown key {unknown[0]!r}")
    kwargs = {k: _convert(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    return cls(**kwargs)


def from_dict(data: dict[str, Any]) -> Config:
    """Validate a parsed mapping against the schema.

    Raises:
        ConfigError: unknown key, wrong type, or an out-of-range value.
    """
    if data.get("allowed_hosts") == "auto":
        data = {**data, "allowed_hosts": ["auto"]}
    cfg = _build(Config, data, "")
    _check_ranges(cfg)
    try:
        check_oauth(cfg.oauth)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.oauth.enabled and not cfg.helper_socket:
        raise ConfigError('oauth: needs the helper unit (helper_socket not ""): only its policy process verifies '
                          "access tokens")
    return cfg


def _check_ranges(cfg: Config) -> None:
    positive = {
        "listen.port": cfg.listen.port,
        "max_body_bytes": cfg.max_body_bytes,
        "session_queue_size": cfg.session_queue_size,
        "session_queue_bytes": cfg.session_queue_bytes,
        "principal_queue_bytes": cfg.principal_queue_bytes,
        "total_queue_bytes": cfg.total_queue_bytes,
        "max_in_flight": cfg.max_in_flight,
        "max_batch": cfg.max_batch,
        "max_privileged_per_principal": cfg.max_privileged_per_principal,
        "max_calls_per_principal": cfg.max_calls_per_principal,
        "max_sessions": cfg.max_sessions,
        "max_sessions_per_principal": cfg.max_sessions_per_principal,
        "read.default_bytes": cfg.read.default_bytes,
        "read.response_cap": cfg.read.response_cap,
        "read.max_line_bytes": cfg.read.max_line_bytes,
        "read.grep_file_bytes": cfg.read.grep_file_bytes,
        "read.grep_total_bytes": cfg.read.grep_total_bytes,
        "read.grep_max_ratio": cfg.read.grep_max_ratio,
        "workers.per_account": cfg.workers.per_account,
        "workers.max_accounts": cfg.workers.max_accounts,
        "workers.spawn_burst": cfg.workers.spawn_burst,
    }
    positive.update({"login.max_failures": cfg.login.max_failures, "limits.save_every": cfg.limits.save_every,
                     "connections.max_total": cfg.connections.max_total,
                     "connections.max_per_address": cfg.connections.max_per_address,
                     "connections.max_header_bytes": cfg.connections.max_header_bytes,
                     "login.tokens_per_user": cfg.login.tokens_per_user, "login.in_flight": cfg.login.in_flight,
                     "login.in_flight_per_address": cfg.login.in_flight_per_address,
                     "audit.checkpoint_records": cfg.audit.checkpoint_records})
    if not 0 < cfg.audit.checkpoint_seconds <= 86400:
        raise ConfigError("audit.checkpoint_seconds: must be more than 0 and at most 86400 (a day)")
    if cfg.audit.syslog_socket and (not cfg.audit.syslog_socket.startswith("/") or "\0" in cfg.audit.syslog_socket):
        raise ConfigError('audit.syslog_socket: must be an absolute path, or "" (no syslog copy)')
    c = cfg.connections
    if min(c.handshake_seconds, c.header_seconds, c.body_seconds, c.idle_seconds) <= 0:
        raise ConfigError("connections: every *_seconds must be positive")
    for tier in (cfg.limits.default, *cfg.limits.tiers.values()):
        if tier.requests_per_day < 0 or tier.max_file_bytes < 0:
            raise ConfigError("limits: requests_per_day and max_file_bytes must not be negative")
    for user, tier_name in cfg.limits.users.items():
        if tier_name not in cfg.limits.tiers:
            raise ConfigError(f"limits.users.{user}: unknown tier {tier_name!r}")
    if min(cfg.login.token_ttl_seconds, cfg.login.lockout_seconds) <= 0 or min(
            cfg.login.base_delay_seconds, cfg.login.answer_seconds) < 0:
        raise ConfigError("login: token_ttl_seconds and lockout_seconds must be positive, the delays not negative")
    for name, value in positive.items():
        if value < 1:
            raise ConfigError(f"{name}: must be at least 1")
    if not 1 <= cfg.listen.port <= 65535:
        raise ConfigError("listen.port: must be 1..65535")
    if cfg.auth_cache_seconds < 0:
        raise ConfigError("auth_cache_seconds: must not be negative")
    if not cfg.mcp_session_evict_seconds >= 0:
        raise ConfigError("mcp_session_evict_seconds: must not be negative (0: idle sessions are never evicted)")
    if min(cfg.keepalive_seconds, cfg.workers.timeout_seconds, cfg.mcp_session_idle_seconds,
           cfg.workers.spawns_per_second) <= 0:
        raise ConfigError("keepalive_seconds, workers.timeout_seconds, workers.spawns_per_second and "
                          "mcp_session_idle_seconds must be positive")
    if not 0 <= cfg.workers.cancel_grace_seconds <= 60:  # (and never past a call's deadline, whatever it is)
        raise ConfigError("workers.cancel_grace_seconds: must be 0 (a cancelled call's worker is killed at once) "
                          "to 60 (it never runs past the call's own deadline)")
    t = cfg.tasks
    if t.max_per_principal < 1 or t.max_result_bytes < 1 or not 0 < t.default_ttl_seconds <= t.max_ttl_seconds <= 86400 \
            or not 0 < t.poll_interval_seconds <= 60:
        raise ConfigError("tasks: max_per_principal and max_result_bytes must be at least 1, 0 < default_ttl_seconds <= "
                          "max_ttl_seconds <= 86400 (a day), 0 < poll_interval_seconds <= 60")
    if cfg.workers.spawn_burst < cfg.workers.per_account:
        raise ConfigError("workers.spawn_burst: must be at least workers.per_account (an account's first "
                          "parallel calls each start a worker)")
    for name, root in cfg.workspaces.items():
        if not root.startswith("/") or "\0" in root:
            raise ConfigError(f"workspaces.{name}: must be an absolute path")
    if cfg.default_workspace not in ("", "~") and not cfg.default_workspace.startswith("/"):
        raise ConfigError('default_workspace: must be "~", "" or an absolute path')
    if cfg.tool_names not in ("slash", "portable"):
        raise ConfigError('tool_names: must be "slash" or "portable"')
    if cfg.base_path and (not cfg.base_path.startswith("/") or cfg.base_path.endswith("/")):
        raise ConfigError("base_path: must start with '/' and not end with '/' (or be empty)")
    if cfg.base_path and not _BASE_PATH_RE.fullmatch(cfg.base_path):
        raise ConfigError("base_path: only segments of letters, digits and - . _ ~ (no '%', no empty, '.' or "
                          "'..' segment: the server must see the path its clients are told)")
    if cfg.base_path.lower() == "/.well-known" or cfg.base_path.lower().startswith("/.well-known/"):
        raise ConfigError("base_path: not under /.well-known/ (nothing there is ever authenticated)")


def load(path: str | Path, owner_uid: int | None = None) -> Config:
    """Read and validate ``mcpd.yaml`` with the one strict YAML loader (duplicate keys refused).

    Relative file paths inside it (``tls.cert``, ``users_file`` ...) are resolved against the
    config file's folder, so a development state folder can be moved as a whole.

    Args:
        path: the file.
        owner_uid: when given (0 for root, as the helper reads it), the file is read once by
            :func:`mcpd.helper.wire.securefile.read_secure_file`: no symlink, owned by that uid, not
            group- or world-writable, checked on the open descriptor that is parsed.

    Raises:
        ConfigError: unreadable or unsafe file, invalid YAML, or a schema violation.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8") if owner_uid is None else read_secure_file(str(p), owner_uid)
        data = parse_strict_yaml(text, str(p))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read: {getattr(exc, 'strerror', None) or 'not UTF-8'}") from exc
    except ConfigFileError as exc:
        raise ConfigError("; ".join(exc.errors)) from exc
    try:
        cfg = from_dict(data or {})
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from exc
    return _resolve_paths(cfg, p.resolve().parent)


def _resolve_paths(cfg: Config, base: Path) -> Config:
    def r(value: str) -> str:
        return value if not value or Path(value).is_absolute() else str(base / value)

    return dataclasses.replace(
        cfg,
        tls=TLS(cert=r(cfg.tls.cert), key=r(cfg.tls.key)),
        users_file=r(cfg.users_file),
        grants_file=r(cfg.grants_file),
        helper_socket=r(cfg.helper_socket),
        audit_log=r(cfg.audit_log),
        access_log=r(cfg.access_log),
        state_dir=r(cfg.state_dir),
        helper_state_dir=r(cfg.helper_state_dir),
        oauth=dataclasses.replace(cfg.oauth, issuers=tuple(
            dataclasses.replace(i, jwks_file=r(i.jwks_file)) for i in cfg.oauth.issuers)),
    )
