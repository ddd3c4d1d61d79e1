"""``mcp-sudo.yaml``: the grants policy and its pure decision function (SPEC §4).

The file (SPEC §4.2)::

    users:
      alice:                                  # an OS user name
        privileged:
          tools:
            files/read:
              allowed: true                   # required; false means no grant
              paths: ["/var/log", "/etc/nginx/*.conf"]   # required when allowed
              deny: ["/var/log/auth.log"]     # optional; always wins
              expires: 2027-03-31T00:00:00Z   # optional, ISO 8601 with a UTC offset
              reauth_after: 5m                # optional: 0, 30s, 5m, 1h (issue 5)
    groups:
      ops: {privileged: {tools: {...}}}       # members of the OS group (primary group included)

Loading is strict like ``visudo -c`` (:func:`load_policy`); the decision (:func:`decide`) is a pure
function of the policy, the user, the user's groups, the tool, the path and the time, like sudo's
policy plugin. Choices where SPEC is silent:

* Keys under ``users:`` are OS user names (the helper passes the principal's ``os_user``).
* ``deny`` entries of every rule that applies to the user for the tool are honoured, even those of
  a rule that is ``allowed: false`` or expired: a deny only ever narrows (fail closed).
* ``reauth_after`` (like sudo's ``timestamp_timeout``): a call under such a rule needs a token
  from a password login (``linuxctl login``) of that OS account at most that long ago; a static
  ``users.yaml`` token never satisfies it. ``0`` means every call: one password login satisfies
  one such call. Otherwise the answer is ``reauthentication required``.
* Symlinks may be followed (SPEC §4.4) only when the allowing entry covers ``/`` and no deny entry
  applies to the user for the tool (a followed link could otherwise reach a denied file).
* The daemon's own secrets (SPEC §4.5a, :func:`secret_paths`) are a fixed deny checked before any
  grant, ``/`` included: :attr:`Policy.secrets`. A followed symlink can still reach one, so the
  opener's caller checks the descriptor's real path with :func:`is_secret` after opening.
"""

from __future__ import annotations

import datetime
import fnmatch
import functools
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mcpd.common.config import DEV_TOKEN_FILE
from mcpd.helper.wire.strictyaml import ConfigFileError, LineDict, LineList, parse_strict_yaml, read_secure_file
from mcpd.common.filesig import signature
from mcpd.helper.wire.pathmatch import PathError, clean_path, components
from mcpd.common.validate import NAME_MAX, PATH_MAX
from mcpd.policy.entries import entry_covers, entry_covers_root, split_entry

if TYPE_CHECKING:
    from mcpd.common.config import Config

TOOLS = ("files/read", "files/list", "files/find", "files/filetype")
RULE_KEYS = ("allowed", "paths", "deny", "expires", "reauth_after")
NO_GRANT = "no grant covers this path"
DENIED = "path is denied by the grant"
GRANTED = "granted"
REAUTH = "reauthentication required"
SECRET = "the daemon's own secrets are never served"
DECIDED_MAX = 1024  # decisions remembered per loaded grants file (see Policy.decided)
_DURATION_RE = re.compile(r"^(0|[1-9][0-9]{0,6})(s|m|h)?$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, None: 1}
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\$?$")
_Errors = list[tuple[int, str]]  # (line, message), prefixed with the file name at the end


class PolicyError(ConfigFileError):
    """The grants file is unsafe, unreadable or invalid; ``errors`` are ``file:line: message``."""


@dataclass(frozen=True)
class Entry:
    """One ``paths``/``deny`` entry: its text, components and 1-based line."""

    text: str
    parts: tuple[str, ...]
    line: int


@dataclass(frozen=True)
class Rule:
    """The grant of one tool to one subject (``users.NAME`` or ``groups.NAME``)."""

    subject: str
    tool: str
    allowed: bool
    paths: tuple[Entry, ...]
    deny: tuple[Entry, ...]
    expires: datetime.datetime | None
    line: int
    reauth_after: float | None = None

    def expired(self, now: datetime.datetime) -> bool:
        """Whether ``expires`` is at or before ``now`` (an aware datetime)."""
        return self.expires is not None and now >= self.expires


@dataclass(frozen=True)
class Policy:
    """A loaded grants file: ``users[name][tool]`` and ``groups[name][tool]`` rules, the fixed deny
    ``secrets`` (:func:`secret_paths`, given by the caller) and the ``text`` it was parsed from."""

    source: str = "mcp-sudo.yaml"
    users: dict[str, dict[str, Rule]] = field(default_factory=dict)
    groups: dict[str, dict[str, Rule]] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    text: str = ""
    #: decisions of :func:`decide` for static tokens while :attr:`timeless` (bounded; this object only)
    decided: dict[tuple[str, frozenset[str], str, str], "Decision"] = field(default_factory=dict, compare=False,
                                                                            repr=False)

    @functools.cached_property
    def timeless(self) -> bool:
        """No rule has ``expires``: a static token's decision then never changes with time."""
        return all(r.expires is None for table in (*self.users.values(), *self.groups.values()) for r in table.values())


@dataclass(frozen=True)
class Decision:
    """The answer of :func:`decide`.

    Attributes:
        allowed: True only when a live grant covers the path and no deny entry does.
        reason: ``granted``, ``the daemon's own secrets are never served``, ``path is denied by
            the grant`` or ``no grant covers this path`` (SPEC §4.1), or why the path is invalid.
        rule: the rule and entry that decided (``users.alice files/read paths /var/log
            (mcp-sudo.yaml:6)``, ``fixed deny /etc/mcpd/users.yaml*``), or ``None``.
        resolved_path: the lexically cleaned path, or ``None`` when the path is invalid.
        covers_root: the allowing entry covers ``/`` and no deny applies (symlinks may be followed).
        note: an explanation for operators only (e.g. which grant expired).
        reauth_after: the ``reauth_after`` window (seconds) of the allowing rule, or ``None``.
    """

    allowed: bool
    reason: str
    rule: str | None
    resolved_path: str | None
    covers_root: bool = False
    note: str = ""
    reauth_after: float | None = None


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
    return when.astimezone(datetime.timezone.utc)


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
    return Rule(subject, tool, allowed, paths, deny, expires, line, reauth)


def _subjects(kind: str, value: Any, line: int, errs: _Errors) -> dict[str, dict[str, Rule]]:
    out: dict[str, dict[str, Rule]] = {}
    d = _mapping(value, line, kind, errs) or LineDict()
    for name, body in d.items():
        at = d.key_line[name]
        if not isinstance(name, str) or not _NAME_RE.match(name):
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
    """Parse and validate a grants file's text (SPEC §4.2, §4.3, §4.5); no file-safety check.

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


def escape_glob(path: str) -> str:
    """``path`` as a grant entry naming exactly it: ``*``, ``?`` and ``[`` become ``[*]`` ..."""
    return re.sub(r"[*?[]", lambda m: f"[{m.group(0)}]", path)


def secret_paths(cfg: Config, config_path: str) -> tuple[str, ...]:
    """The fixed deny of the daemon's own secrets (SPEC §4.5a), for :attr:`Policy.secrets`.

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


@functools.lru_cache(maxsize=8)
def _secret_entries(secrets: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple((s, split_entry(s)) for s in secrets)


@functools.lru_cache(maxsize=1024)  # pure; the same few paths are asked again and again
def _secret_hit(secrets: tuple[str, ...], parts: tuple[str, ...]) -> str | None:
    return next((text for text, entry in _secret_entries(secrets) if entry_covers(entry, parts)), None)


def is_secret(secrets: Policy | tuple[str, ...], path: str) -> bool:
    """Whether ``path`` (cleaned lexically) is one of the daemon's own secrets or below one; for
    the descriptor's real path after opening. ``secrets``: a :class:`Policy` or its ``secrets``.
    A path that cannot be cleaned (relative, ``socket:[...]``) counts as secret: fail closed."""
    try:
        parts = components(clean_path(path))
    except PathError:
        return True
    return _secret_hit(secrets.secrets if isinstance(secrets, Policy) else secrets, parts) is not None


# ---------------------------------------------------------------- decision


def applicable_rules(policy: Policy, user: str, groups: frozenset[str] | set[str], tool: str) -> list[Rule]:
    """The rules for ``tool`` that apply to ``user``: the user's own first, then its groups' by name."""
    tables = [policy.users.get(user, {})] + [policy.groups.get(g, {}) for g in sorted(groups)]
    return [t[tool] for t in tables if tool in t]


def _where(policy: Policy, rule: Rule, kind: str, entry: Entry) -> str:
    return f"{rule.subject} {rule.tool} {kind} {entry.text} ({policy.source}:{entry.line})"


def decide(policy: Policy, user: str, groups: frozenset[str] | set[str], tool: str, path: str,
           now: datetime.datetime, login_time: datetime.datetime | None = None, login_used: bool = False) -> Decision:
    """Decide a privileged call, purely (SPEC §4.1, §4.3, §4.5a; ``reauth_after``: issue 5).

    Args:
        policy: the loaded grants, with its fixed deny ``secrets`` (refused first, whatever a
            grant says).
        user: the OS user name (a key under ``users:``).
        groups: the OS group names the user belongs to (see :func:`os_groups`).
        tool: ``files/read`` ... (an unknown tool is never granted).
        path: the request path, cleaned lexically before matching.
        now: the current time, timezone-aware.
        login_time: when the caller's token was issued by a password login (aware), or ``None``
            for a static ``users.yaml`` token (never fresh enough for ``reauth_after``).
        login_used: that login already satisfied a ``reauth_after: 0`` call.

    Returns:
        A :class:`Decision`; anything but ``allowed`` is a refusal. Never raises for bad input.
        When ``covers_root`` lets the opener follow symlinks, the caller must still check the
        opened descriptor's real path with :func:`is_secret`.

    A static token's decision (``login_time`` None) under grants where no rule expires does not
    depend on ``now``: it is remembered on ``policy`` (:attr:`Policy.decided`) and answered from
    there, so a reloaded grants file (a new :class:`Policy`) decides afresh.
    """
    key = (user, frozenset(groups), tool, path) if login_time is None and policy.timeless else None
    if key is not None and (hit := policy.decided.get(key)) is not None:
        return hit  # the same inputs, the same grants, and nothing that expires: the same answer
    decision = _decide(policy, user, groups, tool, path, now, login_time, login_used)
    if key is not None:
        if len(policy.decided) >= DECIDED_MAX:
            policy.decided.clear()
        policy.decided[key] = decision
    return decision


def _decide(policy: Policy, user: str, groups: frozenset[str] | set[str], tool: str, path: str,
            now: datetime.datetime, login_time: datetime.datetime | None, login_used: bool) -> Decision:
    try:
        cleaned = clean_path(path)
    except PathError as exc:
        return Decision(False, str(exc), None, None)
    parts = components(cleaned)
    if (secret := _secret_hit(policy.secrets, parts)) is not None:
        return Decision(False, SECRET, f"fixed deny {secret}", cleaned)
    rules = applicable_rules(policy, user, groups, tool) if tool in TOOLS else []
    for rule, entry in ((r, e) for r in rules for e in r.deny if entry_covers(e.parts, parts)):
        return Decision(False, DENIED, _where(policy, rule, "deny", entry), cleaned)
    note, reauth = "", None
    for rule, entry in ((r, e) for r in rules if r.allowed for e in r.paths if entry_covers(e.parts, parts)):
        if rule.expired(now):
            note = note or f"{_where(policy, rule, 'paths', entry)} expired {rule.expires:%Y-%m-%dT%H:%M:%SZ}"
        elif not fresh_enough(rule.reauth_after, now, login_time, login_used):
            reauth = reauth or (rule, entry)
        else:
            root = entry_covers_root(entry.parts) and not any(r.deny for r in rules)
            return Decision(True, GRANTED, _where(policy, rule, "paths", entry), cleaned, root, "", rule.reauth_after)
    if reauth is not None:
        rule, entry = reauth
        return Decision(False, REAUTH, _where(policy, rule, "paths", entry), cleaned, False,
                        f"reauth_after {rule.reauth_after:g}s", rule.reauth_after)
    return Decision(False, NO_GRANT, None, cleaned, note=note)


def fresh_enough(window: float | None, now: datetime.datetime, login_time: datetime.datetime | None,
                 login_used: bool) -> bool:
    """Whether a login at ``login_time`` satisfies a ``reauth_after`` of ``window`` seconds at ``now``.

    ``None`` (no ``reauth_after``) is always satisfied; otherwise a static token (``login_time``
    ``None``) never is; ``0`` needs a login not yet used for such a call; a positive window needs
    ``now - login_time <= window``.
    """
    if window is None or login_time is None:
        return window is None
    return not login_used if window == 0 else (now - login_time).total_seconds() <= window


def utcnow() -> datetime.datetime:
    """The current time as an aware UTC datetime."""
    return datetime.datetime.now(datetime.timezone.utc)


# ---------------------------------------------------------------- lint (`mcpd grants check`)

_GLOB_CHARS = frozenset("*?[")


def entry_subsumes(outer: tuple[str, ...], inner: tuple[str, ...]) -> bool:
    """Whether every path the entry ``inner`` covers is covered by the entry ``outer`` too (both
    components from :func:`~mcpd.policy.entries.split_entry`).

    Sound, not complete: True only when it follows from the components (``/srv`` covers
    ``/srv/app/*.log``; ``/srv/*`` covers ``/srv/app``; ``/srv/**`` covers ``/srv/**/x``); two
    globs are compared only as equal text, ``*`` against any single component, or ``**``.
    """
    reach = {0}
    for part in outer:
        if part == "**":
            reach = set(range(min(reach), len(inner) + 1))
        else:
            reach = {j + 1 for j in reach if j < len(inner) and _component_subsumes(part, inner[j])}
        if not reach:
            return False
    return True


def _component_subsumes(outer: str, inner: str) -> bool:
    if inner == "**":  # it may stand for no component at all: only an outer ** is sure to cover it
        return False
    if _GLOB_CHARS.isdisjoint(inner):
        return entry_covers((outer,), (inner,))
    return outer in (inner, "*")


def _glob_elements(part: str) -> list[tuple[str, str]]:
    """A component's elements as fnmatch reads them: ``("lit", char)``, ``("?", "")``, ``("*", "")``,
    ``("set", inside)``, or ``("open[", "[")`` for a ``[`` with no ``]`` (matched literally)."""
    out, i, n = [], 0, len(part)
    while i < n:
        c, i = part[i], i + 1
        if c in "*?":
            out.append((c, ""))
        elif c == "[":
            j = i + (i < n and part[i] == "!")
            j += j < n and part[j] == "]"
            while j < n and part[j] != "]":
                j += 1
            if j >= n:
                out.append(("open[", "["))
            else:
                out.append(("set", part[i:j]))
                i = j + 1
        else:
            out.append(("lit", c))
    return out


def _min_bytes(elements: list[tuple[str, str]]) -> int:
    return sum(len(text.encode("utf-8", "surrogatepass")) if kind in ("lit", "open[") else kind != "*"
               for kind, text in elements)


def entry_problems(entry: Entry) -> tuple[str | None, list[str]]:
    """Why no request path can ever match ``entry`` (or ``None``), and hints about parts that
    match something other than what was probably meant.

    Cannot match: a component that needs more than :data:`~mcpd.common.validate.NAME_MAX` bytes or
    an entry that needs more than :data:`~mcpd.common.validate.PATH_MAX` (requests are refused
    above those), a ``[...]`` that matches no character (``[z-a]``), a component that matches only
    ``.`` or ``..`` (request paths are cleaned of those). Hints: a ``[`` with no ``]`` (matched
    literally), braces (``{a,b}`` is not expanded).
    """
    hints: list[str] = []
    total = 0
    for part in entry.parts:
        if part == "**":
            continue
        elements = _glob_elements(part)
        need = _min_bytes(elements)
        total += need + 1
        if need > NAME_MAX:
            return f"component '{part[:40]}...' needs more than {NAME_MAX} bytes, the longest name there is", hints
        if "(?!)" in fnmatch.translate(part):
            return f"[...] in '{part}' matches no character", hints
        if len(elements) <= 2 and all(e in (("lit", "."), ("set", ".")) for e in elements):
            return f"'{part}' matches only '.' or '..', which a cleaned request path never has", hints
        if any(kind == "open[" for kind, _ in elements):
            hints.append(f"the '[' in '{part}' has no ']' and matches a literal '['")
        if "{" in part and "," in part and "}" in part:
            hints.append(f"braces in '{part}' are not expanded: they match the literal characters")
    if total > PATH_MAX:
        return f"it needs more than {PATH_MAX} bytes, the longest path a request may have", hints
    return None, hints


def lint_policy(policy: Policy, now: datetime.datetime, user_exists: Callable[[str], bool],
                group_exists: Callable[[str], bool]) -> list[tuple[int, str]]:
    """Warnings about a loaded policy: rules that apply to no one or grant nothing, and entries no
    path can match; ``(line, message)`` sorted by line.

    Args:
        policy: the loaded grants (its :attr:`Policy.secrets` count as deny entries).
        now: the time expiry is judged at (aware).
        user_exists, group_exists: whether an OS account or group of that name exists.

    Warned: a subject that is no OS account or group; an allowed rule that has expired; a
    ``paths`` entry every path of which is denied (by a ``deny`` of its own rule, or by the fixed
    deny of the daemon's own secrets); a ``paths`` or ``deny`` entry no request can match
    (:func:`entry_problems`), and :func:`entry_problems`'s hints.
    """
    out: list[tuple[int, str]] = []
    secrets = _secret_entries(policy.secrets)
    for kind, table, exists in (("users", policy.users, user_exists), ("groups", policy.groups, group_exists)):
        for name, rules in table.items():
            if rules and not exists(name):
                what = "OS account" if kind == "users" else "OS group"
                out.append((min(r.line for r in rules.values()),
                            f"{kind}.{name}: no {what} is named {name}: its rules apply to no one "
                            "(check the spelling)"))
            for rule in rules.values():
                out += _lint_rule(rule, now, secrets)
    return sorted(out, key=lambda w: w[0])


def _lint_rule(rule: Rule, now: datetime.datetime, secrets: tuple[tuple[str, tuple[str, ...]], ...]) -> _Errors:
    where, out, dead = f"{rule.subject} {rule.tool}", [], 0
    if rule.allowed and rule.expired(now):
        out.append((rule.line, f"{where}: expired {rule.expires:%Y-%m-%dT%H:%M:%SZ}: it grants nothing"))
    for key, entries in (("paths", rule.paths), ("deny", rule.deny)):
        for entry in entries:
            problem, hints = entry_problems(entry)
            out += [(entry.line, f"{where}: {key} {entry.text}: {hint}") for hint in hints]
            if problem is not None:
                out.append((entry.line, f"{where}: {key} {entry.text} can never match: {problem}"))
                dead += key == "paths"
                continue
            covers = [f"deny {d.text} (line {d.line})" for d in rule.deny if entry_subsumes(d.parts, entry.parts)]
            covers += [f"the fixed deny {text} (the daemon's own secrets)" for text, parts in secrets
                       if entry_subsumes(parts, entry.parts)]
            if key == "paths" and covers:
                out.append((entry.line, f"{where}: paths {entry.text}: every path it covers is denied by {covers[0]}"))
                dead += 1
    if rule.allowed and rule.paths and dead == len(rule.paths):
        out.append((rule.line, f"{where}: no path can match: every paths entry is denied or can never match, "
                               "so the rule grants nothing"))
    return out


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
    import grp, pwd  # noqa: E401

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
