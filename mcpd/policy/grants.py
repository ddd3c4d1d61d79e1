"""``mcp-sudo.yaml``: loading and validating the grants policy, and the fixed deny of secrets.

The file (docs/REFERENCE.md §4.2)::

    users:
      alice:                                  # an OS user name
        privileged:
          tools:
            files/read:
              allowed: true                   # required; false means no grant
              paths: ["/var/log", "/etc/nginx/*.conf"]   # required when allowed
              deny: ["/var/log/auth.log"]     # optional; always wins
              expires: 2027-03-31T00:00:00Z   # optional, ISO 8601 with a UTC offset
              reauth_after: 5m                # optional: 0, 30s, 5m, 1h
              redact: secrets                 # optional: secrets, or a list of detectors
    groups:
      ops: {privileged: {tools: {...}}}       # members of the OS group (primary group included)

Loading is strict like ``visudo -c`` (:func:`load_policy`): every error is ``file:line:
message``. What the rules mean (deny wins, ``reauth_after``, symlinks, the daemon's own secrets)
is decided by :func:`mcpd.common.grantmatch.decide`, shared with the walker. Keys under ``users:``
are OS user names (the policy process passes the principal's ``os_user``).
"""

from __future__ import annotations

import datetime
import os
import re
import time
from typing import TYPE_CHECKING, Any

from mcpd.common.config import DEV_TOKEN_FILE
from mcpd.common.filesig import signature
from mcpd.common.grantmatch import TOOLS, Approve, Entry, Policy, Rule, escape_glob, split_entry
from mcpd.common.redaction import RedactError, parse_redact
from mcpd.common.strictyaml import LineDict, LineList, parse_strict_yaml
from mcpd.helper.wire.pathmatch import PathError, clean_path
from mcpd.helper.wire.securefile import ConfigFileError, read_secure_file

if TYPE_CHECKING:
    from mcpd.common.config import Config

RULE_KEYS = ("allowed", "paths", "deny", "expires", "reauth_after", "redact", "approve")
APPROVE_KEYS = ("by", "for", "self")
_DURATION_RE = re.compile(r"^(0|[1-9][0-9]{0,6})(s|m|h)?$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, None: 1}
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\$?$")
#: a group an OAuth token carries (docs/REFERENCE.md §5.4): ``<issuer name>:<group>``
_IDP_GROUP_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}:[A-Za-z0-9_.@+=-]{1,128}$")
_Errors = list[tuple[int, str]]  # (line, message), prefixed with the file name at the end


class PolicyError(ConfigFileError):
    """The grants file is unsafe, unreadable or invalid; ``errors`` are ``file:line: message``."""



# ---------------------------------------------------------------- loading


def _mapping(value: Any, line: int, what: str, errs: _Errors, keys: tuple[str, ...] = ()) -> LineDict | None:
    if value is None:
        return LineDict()
    if not isinstance(value, LineDict):
        errs.append((line, f"{what} must be a mapping"))
        return None
    bad = [k for k in value if keys and k not in keys]
    errs += [(value.key_line[k], f"unknown key {k!r} in {what} (expected {', '.join(keys)})") for k in bad]
    return value


def _expires(value: Any, line: int, errs: _Errors) -> datetime.datetime | None:
    try:
        when = value if isinstance(value, datetime.datetime) else datetime.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        when = None
    if when is None or when.tzinfo is None:
        errs.append((line, "expires must be an ISO 8601 time with a UTC offset, like 2027-03-31T00:00:00Z"))
        return None
    return when.astimezone(datetime.UTC)


def parse_duration(value: Any) -> float | None:
    """Seconds of a ``reauth_after`` value: ``0``, ``30``, ``30s``, ``5m``, ``1h``; ``None`` if malformed."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return float(value)
    m = _DURATION_RE.match(value) if isinstance(value, str) else None
    return None if m is None else float(int(m.group(1)) * _UNIT_SECONDS[m.group(2)])


def _entries(d: LineDict, key: str, errs: _Errors) -> tuple[Entry, ...]:
    value, out = d.get(key, LineList()), []
    if not isinstance(value, LineList):
        errs.append((d.key_line[key], f"{key} must be a list of absolute paths"))
        return ()
    for item, line in zip(value, value.item_line):
        try:
            if not isinstance(item, str):
                raise PathError(f"{key} entries must be strings")
            out.append(Entry(item, split_entry(item), line))
        except PathError as exc:
            errs.append((line, str(exc)))
    return tuple(out)


def _rule(subject: str, tool: str, body: Any, line: int, errs: _Errors) -> Rule | None:
    where = f"{subject} {tool}"
    d = _mapping(body, line, where, errs, RULE_KEYS)
    if d is None:
        return None
    allowed, at = d.get("allowed"), d.key_line.get
    if not isinstance(allowed, bool):
        errs.append((at("allowed", line), f"{where}: allowed must be true or false"))
        return None
    paths, deny = _entries(d, "paths", errs), _entries(d, "deny", errs)
    if allowed and isinstance(d.get("paths"), LineList) and not d["paths"]:
        errs.append((at("paths", line), f"{where}: empty paths grant nothing; write paths: ['/'] for everything"))
    elif allowed and "paths" not in d:
        errs.append((line, f"{where}: a path tool granted without paths (write paths: ['/'] for everything)"))
    expires = _expires(d["expires"], at("expires", line), errs) if "expires" in d else None
    reauth = parse_duration(d["reauth_after"]) if "reauth_after" in d else None
    if reauth is None and "reauth_after" in d:
        errs.append((at("reauth_after", line), "reauth_after must be a duration like 0, 30s, 5m or 1h"))
    redact: tuple[str, ...] = ()
    try:
        redact = parse_redact(d.get("redact"))
    except RedactError as exc:
        errs.append((at("redact", line), f"{where}: {exc}"))
    if redact and tool not in ("files/read", "files/grep"):
        errs.append((at("redact", line), f"{where}: redact applies to files/read and files/grep only "
                     f"(what {tool} answers holds no file content)"))
    approve = _approve(d["approve"], at("approve", line), where, errs) if "approve" in d else None
    return Rule(subject, tool, allowed, paths, deny, expires, line, reauth, redact, approve)


def _approve(value: Any, line: int, where: str, errs: _Errors) -> Approve | None:
    """A rule's ``approve: {by: [NAME | %GROUP, ...], for: DURATION, self: BOOL}``: ``by`` a
    non-empty list of principal names and ``%``-prefixed OS groups, ``for`` how long one approval
    covers the same principal and path (default ``0``: that call only), ``self`` whether an
    approver may approve their own request (default false). Errors go to ``errs``."""
    d = _mapping(value, line, f"{where} approve", errs, APPROVE_KEYS)
    if d is None:
        return None
    by, at = d.get("by"), d.key_line.get
    names = [b[1:] if isinstance(b, str) and b.startswith("%") else b for b in by] if isinstance(by, list) else []
    if not isinstance(by, list) or not by or not all(isinstance(n, str) and _NAME_RE.match(n) for n in names):
        errs.append((at("by", line), f"{where}: approve.by must be a non-empty list of principal names "
                     "and %groups"))
        return None
    seconds = parse_duration(d["for"]) if "for" in d else 0.0
    if seconds is None:
        errs.append((at("for", line), f"{where}: approve.for must be a duration like 0, 30s, 5m or 1h"))
        return None
    if not isinstance(d.get("self", False), bool):
        errs.append((at("self", line), f"{where}: approve.self must be true or false"))
        return None
    return Approve(tuple(by), float(seconds), bool(d.get("self", False)))


def _subjects(kind: str, value: Any, line: int, errs: _Errors) -> dict[str, dict[str, Rule]]:
    out: dict[str, dict[str, Rule]] = {}
    d = _mapping(value, line, kind, errs) or LineDict()
    for name, body in d.items():
        at = d.key_line[name]
        if not isinstance(name, str) or not (_NAME_RE.match(name) or kind == "groups" and _IDP_GROUP_RE.match(name)):
            errs.append((at, f"invalid {kind[:-1]} name {name!r}"))
            continue
        subject = what = f"{kind}.{name}"
        tools = _mapping(body, at, subject, errs, ("privileged",))
        for key, keys in (("privileged", ("tools",)), ("tools", ())):  # down to subject.privileged.tools
            what = f"{what}.{key}"
            tools = None if tools is None else _mapping(tools.get(key), tools.key_line.get(key, at), what, errs, keys)
        if tools is None:
            continue
        out[name] = {}
        for tool, rbody in tools.items():
            if tool not in TOOLS:
                errs.append((tools.key_line[tool], f"unknown tool {tool!r} (expected {', '.join(TOOLS)})"))
            elif (rule := _rule(subject, tool, rbody, tools.key_line[tool], errs)) is not None:
                out[name][tool] = rule
    return out


def parse_policy(text: str, source: str = "mcp-sudo.yaml", secrets: tuple[str, ...] = ()) -> Policy:
    """Parse and validate a grants file's text (docs/REFERENCE.md §4.2, §4.3, §4.5); no file-safety check.

    Args:
        text: the file's text. source: the name in messages. secrets: :attr:`Policy.secrets`.

    Raises:
        PolicyError: YAML errors, duplicate/unknown keys, wrong types, bad or missing paths,
            unknown tools, bad ``expires``; every message is ``source:line: message``.
    """
    try:
        data = parse_strict_yaml(text, source)
    except ConfigFileError as exc:
        raise PolicyError(exc.errors) from None
    errs: _Errors = []
    top = _mapping(data, 1, "the top level", errs, ("users", "groups")) or LineDict()
    users = _subjects("users", top.get("users"), top.key_line.get("users", 1), errs)
    groups = _subjects("groups", top.get("groups"), top.key_line.get("groups", 1), errs)
    if errs:
        raise PolicyError([f"{source}:{line}: {msg}" for line, msg in sorted(errs, key=lambda e: e[0])])
    return Policy(source, users, groups, tuple(secrets), text)


def load_policy(path: str, owner_uid: int = 0, secrets: tuple[str, ...] = ()) -> Policy:
    """Load the grants file like ``visudo -c``: safe file (root-owned, not group/world-writable,
    checked on the open descriptor), then :func:`parse_policy` with ``secrets``.

    Raises:
        PolicyError: any problem, as ``file:line: message`` strings.
    """
    try:
        text = read_secure_file(path, owner_uid)
    except ConfigFileError as exc:
        raise PolicyError(exc.errors) from None
    return parse_policy(text, path, secrets)


# ---------------------------------------------------------------- the daemon's own secrets


def secret_paths(cfg: Config, config_path: str) -> tuple[str, ...]:
    """The fixed deny of the daemon's own secrets (docs/REFERENCE.md §4.5a), for :attr:`Policy.secrets`.

    Each result is a grant-style entry covering itself and everything below it:

    * ``mcpd.yaml`` (``config_path``), ``users_file`` and ``grants_file``: each file ``F`` as
      ``F*`` and ``.F*`` in its folder, so backups (``F~``, ``F.bak``, ``F.dpkg-old``) and editor
      swap files (``.F.swp``) go too.
    * ``audit_log``: its whole folder when that folder is the log's own (named ``mcpd`` or
      ``audit``, like ``/var/log/mcpd``), else the file as above (rotated ``F.1``, ``F.2.gz``).
    * ``access_log`` (the front's record of calls): the file as above.
    * ``tls.key`` and the CA key ``ca.key`` that ``mcpd certs`` writes beside it: their folder
      when it is a dedicated one named ``tls`` (``/etc/mcpd/tls``), else both files as above.
    * a ``tls.key`` that is a symlink (the ACME layout of certbot): also the whole folder of the file
      it leads to now, which holds the earlier keys and where the next one is written. The key is
      given as a literal entry as well, so that the walker of a privileged list or find, which may
      follow the symlink where this process may not enter, finds that folder itself.
    * the development mode's plain token (``dev-token`` in ``state_dir``).
    * ``helper_state_dir`` (the policy process's state) and ``<state_dir>/helper`` (the older token store).

    Relative settings are taken from ``config_path``'s folder; every path is also given by its
    ``realpath`` when that differs (a symlinked ``/etc/mcpd`` is covered under both names). The
    symlinks are followed when this runs (the policy process's start, ``mcpd grants``): root
    itself judges the secrets as they resolve at each open (:meth:`mcpd.helper.monitor.Monitor.places`).
    Empty settings are skipped. Glob characters in the names are escaped.
    """
    base, out = os.path.dirname(os.path.abspath(config_path)), set()
    audit_dir = os.path.dirname(os.path.join(base, cfg.audit_log))
    key_dir = os.path.dirname(os.path.join(base, cfg.tls.key))
    own_audit = bool(cfg.audit_log) and os.path.basename(audit_dir) in ("mcpd", "audit")
    own_tls = os.path.basename(key_dir) == "tls"
    files = [os.path.abspath(config_path), cfg.users_file, cfg.grants_file, "" if own_audit else cfg.audit_log,
             cfg.access_log, os.path.join(cfg.state_dir, DEV_TOKEN_FILE) if cfg.state_dir else ""]
    files += [] if own_tls else [cfg.tls.key, os.path.join(key_dir, "ca.key")]
    folders = [cfg.helper_state_dir, os.path.join(cfg.state_dir, "helper") if cfg.state_dir else ""]
    folders += [audit_dir] * own_audit + [key_dir] * own_tls
    if os.path.islink(key := os.path.join(base, cfg.tls.key)):  # certbot: live/H/privkey.pem -> ../../archive/H/privkeyN.pem
        folders.append(os.path.dirname(os.path.realpath(key)))
    if cfg.tls.key:  # the key itself as a literal entry too: the walker follows it (mcpd.walker.main.Objects)
        out.add(escape_glob(clean_path(key)))
    for path, folder in [(f, False) for f in files if f] + [(d, True) for d in folders if d]:
        for p in {clean_path(os.path.join(base, path)), os.path.realpath(os.path.join(base, path))}:
            head, name = os.path.split(escape_glob(p))
            out.update({escape_glob(p)} if folder else {f"{escape_glob(p)}*", os.path.join(head, f".{name}*")})
    return tuple(sorted(out))



GROUPS_SECONDS = 5.0  # how long a user's group list is reused while /etc/group and /etc/passwd stay the same
GROUP_FILES_SECONDS = 1.0  # a change to /etc/group or /etc/passwd is seen within this
_groups: dict[str, tuple[float, Any, frozenset[str]]] = {}
_group_files: list[Any] = [0.0, None]  # [look again after (monotonic s), their signatures]


def os_groups(user: str) -> frozenset[str]:
    """The OS groups of ``user``, its primary group included; empty for an unknown user.

    Looked up again when ``/etc/group`` or ``/etc/passwd`` changes (seen within
    :data:`GROUP_FILES_SECONDS`), and at least every
    :data:`GROUPS_SECONDS` (groups from LDAP or SSSD change without them), so removing an account
    from a group ends its group grants within seconds."""
    import grp  # noqa: E401
    import pwd

    now = time.monotonic()
    if now >= _group_files[0]:  # looked at (two stats) at most once a GROUP_FILES_SECONDS, not per call
        _group_files[:] = [now + GROUP_FILES_SECONDS, tuple(signature(p) for p in ("/etc/group", "/etc/passwd"))]
    files = _group_files[1]
    hit = _groups.get(user)
    if hit is not None and hit[0] > now and hit[1] == files:
        return hit[2]
    try:
        gids = os.getgrouplist(user, pwd.getpwnam(user).pw_gid)
    except (KeyError, OSError):
        gids = []
    names = set()
    for gid in gids:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            pass
    if len(_groups) > 4096:
        _groups.clear()
    _groups[user] = (now + GROUPS_SECONDS, files, frozenset(names))
    return _groups[user][2]
