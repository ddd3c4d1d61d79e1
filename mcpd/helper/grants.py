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
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from typing import Any

from mcpd.helper.pathmatch import PathError, clean_path, components, entry_covers, entry_covers_root, split_entry
from mcpd.common.strictyaml import ConfigFileError, LineDict, LineList, parse_strict_yaml, read_secure_file

TOOLS = ("files/read", "files/list", "files/find", "files/filetype")
RULE_KEYS = ("allowed", "paths", "deny", "expires", "reauth_after")
NO_GRANT = "no grant covers this path"
DENIED = "path is denied by the grant"
GRANTED = "granted"
REAUTH = "reauthentication required"
_DURATION_RE = re.compile(r"^(0|[1-9][0-9]{0,6})(s|m|h)?$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, None: 1}
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\$?$")


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
    """A loaded grants file: ``users[name][tool]`` and ``groups[name][tool]`` rules."""

    source: str = "mcp-sudo.yaml"
    users: dict[str, dict[str, Rule]] = field(default_factory=dict)
    groups: dict[str, dict[str, Rule]] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """The answer of :func:`decide`.

    Attributes:
        allowed: True only when a live grant covers the path and no deny entry does.
        reason: ``granted``, ``path is denied by the grant`` or ``no grant covers this path``
            (SPEC §4.1), or why the path itself is invalid.
        rule: the rule and entry that decided (``users.alice files/read paths /var/log
            (mcp-sudo.yaml:6)``), or ``None`` when nothing matched.
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


class _Errors:
    def __init__(self, source: str) -> None:
        self.source = source
        self._found: list[tuple[int, str]] = []

    def add(self, line: int, message: str) -> None:
        self._found.append((line, f"{self.source}:{line}: {message}"))

    @property
    def items(self) -> list[str]:
        """The messages in file order (stable for one line)."""
        return [text for _, text in sorted(self._found, key=lambda item: item[0])]


def _mapping(value: Any, line: int, what: str, errs: _Errors) -> LineDict | None:
    if value is None:
        return LineDict()
    if not isinstance(value, LineDict):
        errs.add(line, f"{what} must be a mapping")
        return None
    return value


def _unknown_keys(d: LineDict, allowed: tuple[str, ...], what: str, errs: _Errors) -> None:
    for key in d:
        if key not in allowed:
            errs.add(d.key_line[key], f"unknown key {key!r} in {what} (expected {', '.join(allowed)})")


def _expires(value: Any, line: int, errs: _Errors) -> datetime.datetime | None:
    when: datetime.datetime | None = None
    if isinstance(value, datetime.datetime):
        when = value
    elif isinstance(value, str):
        try:
            when = datetime.datetime.fromisoformat(value)
        except ValueError:
            when = None
    if when is None or when.tzinfo is None:
        errs.add(line, "expires must be an ISO 8601 time with a UTC offset, like 2027-03-31T00:00:00Z")
        return None
    return when.astimezone(datetime.timezone.utc)


def parse_duration(value: Any) -> float | None:
    """Seconds of a ``reauth_after`` value: ``0``, ``30``, ``30s``, ``5m``, ``1h``; ``None`` if malformed."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return float(value)
    m = _DURATION_RE.match(value) if isinstance(value, str) else None
    if m is None:
        return None
    return float(int(m.group(1)) * _UNIT_SECONDS[m.group(2)])


def _entries(value: Any, line: int, key: str, errs: _Errors) -> tuple[Entry, ...]:
    if not isinstance(value, LineList):
        errs.add(line, f"{key} must be a list of absolute paths")
        return ()
    out: list[Entry] = []
    for item, item_line in zip(value, value.item_line):
        if not isinstance(item, str):
            errs.add(item_line, f"{key} entries must be strings")
            continue
        try:
            out.append(Entry(item, split_entry(item), item_line))
        except PathError as exc:
            errs.add(item_line, str(exc))
    return tuple(out)


def _rule(subject: str, tool: str, body: Any, line: int, errs: _Errors) -> Rule | None:
    d = _mapping(body, line, f"{subject} {tool}", errs)
    if d is None:
        return None
    _unknown_keys(d, RULE_KEYS, f"{subject} {tool}", errs)
    allowed = d.get("allowed")
    if not isinstance(allowed, bool):
        errs.add(d.key_line.get("allowed", line), f"{subject} {tool}: allowed must be true or false")
        return None
    paths = _entries(d["paths"], d.key_line["paths"], "paths", errs) if "paths" in d else ()
    deny = _entries(d["deny"], d.key_line["deny"], "deny", errs) if "deny" in d else ()
    if allowed and isinstance(d.get("paths"), LineList) and not d["paths"]:
        errs.add(d.key_line["paths"], f"{subject} {tool}: empty paths grant nothing; write paths: ['/'] for everything")
    elif allowed and "paths" not in d:
        errs.add(line, f"{subject} {tool}: a path tool granted without paths (write paths: ['/'] for everything)")
    expires = _expires(d["expires"], d.key_line["expires"], errs) if "expires" in d else None
    reauth: float | None = None
    if "reauth_after" in d:
        reauth = parse_duration(d["reauth_after"])
        if reauth is None:
            errs.add(d.key_line["reauth_after"], "reauth_after must be a duration like 0, 30s, 5m or 1h")
    return Rule(subject, tool, allowed, paths, deny, expires, line, reauth)


def _subjects(kind: str, value: Any, line: int, errs: _Errors) -> dict[str, dict[str, Rule]]:
    out: dict[str, dict[str, Rule]] = {}
    d = _mapping(value, line, kind, errs)
    if d is None:
        return out
    for name, body in d.items():
        nline = d.key_line[name]
        if not isinstance(name, str) or not _NAME_RE.match(name):
            errs.add(nline, f"invalid {kind[:-1]} name {name!r}")
            continue
        subject = f"{kind}.{name}"
        sd = _mapping(body, nline, subject, errs)
        if sd is None:
            continue
        _unknown_keys(sd, ("privileged",), subject, errs)
        priv = _mapping(sd.get("privileged"), sd.key_line.get("privileged", nline), f"{subject}.privileged", errs)
        if priv is None:
            continue
        _unknown_keys(priv, ("tools",), f"{subject}.privileged", errs)
        tools = _mapping(priv.get("tools"), priv.key_line.get("tools", nline), f"{subject}.privileged.tools", errs)
        if tools is None:
            continue
        rules: dict[str, Rule] = {}
        for tool, rbody in tools.items():
            tline = tools.key_line[tool]
            if tool not in TOOLS:
                errs.add(tline, f"unknown tool {tool!r} (expected {', '.join(TOOLS)})")
                continue
            rule = _rule(subject, tool, rbody, tline, errs)
            if rule is not None:
                rules[tool] = rule
        out[name] = rules
    return out


def parse_policy(text: str, source: str = "mcp-sudo.yaml") -> Policy:
    """Parse and validate a grants file's text (SPEC §4.2, §4.3, §4.5); no file-safety check.

    Raises:
        PolicyError: YAML errors, duplicate/unknown keys, wrong types, bad or missing paths,
            unknown tools, bad ``expires``; every message is ``source:line: message``.
    """
    try:
        data = parse_strict_yaml(text, source)
    except ConfigFileError as exc:
        raise PolicyError(exc.errors) from None
    errs = _Errors(source)
    top = _mapping(data, 1, "the top level", errs)
    users: dict[str, dict[str, Rule]] = {}
    groups: dict[str, dict[str, Rule]] = {}
    if top is not None:
        _unknown_keys(top, ("users", "groups"), "the top level", errs)
        users = _subjects("users", top.get("users"), top.key_line.get("users", 1), errs)
        groups = _subjects("groups", top.get("groups"), top.key_line.get("groups", 1), errs)
    if errs.items:
        raise PolicyError(errs.items)
    return Policy(source, users, groups)


def load_policy(path: str, owner_uid: int = 0) -> Policy:
    """Load the grants file like ``visudo -c``: safe file (root-owned, not group/world-writable,
    checked on the open descriptor), then :func:`parse_policy`.

    Raises:
        PolicyError: any problem, as ``file:line: message`` strings.
    """
    try:
        text = read_secure_file(path, owner_uid)
    except ConfigFileError as exc:
        raise PolicyError(exc.errors) from None
    return parse_policy(text, path)


# ---------------------------------------------------------------- decision


def applicable_rules(policy: Policy, user: str, groups: frozenset[str] | set[str], tool: str) -> list[Rule]:
    """The rules for ``tool`` that apply to ``user``: the user's own first, then its groups' by name."""
    rules: list[Rule] = []
    own = policy.users.get(user, {}).get(tool)
    if own is not None:
        rules.append(own)
    for group in sorted(groups):
        rule = policy.groups.get(group, {}).get(tool)
        if rule is not None:
            rules.append(rule)
    return rules


def _where(policy: Policy, rule: Rule, kind: str, entry: Entry) -> str:
    return f"{rule.subject} {rule.tool} {kind} {entry.text} ({policy.source}:{entry.line})"


def decide(
    policy: Policy,
    user: str,
    groups: frozenset[str] | set[str],
    tool: str,
    path: str,
    now: datetime.datetime,
    login_time: datetime.datetime | None = None,
    login_used: bool = False,
) -> Decision:
    """Decide a privileged call, purely (SPEC §4.1, §4.3; ``reauth_after``: issue 5).

    Args:
        policy: the loaded grants.
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
    """
    try:
        cleaned = clean_path(path)
    except PathError as exc:
        return Decision(False, str(exc), None, None)
    parts = components(cleaned)
    rules = applicable_rules(policy, user, groups, tool) if tool in TOOLS else []
    for rule in rules:
        for entry in rule.deny:
            if entry_covers(entry.parts, parts):
                return Decision(False, DENIED, _where(policy, rule, "deny", entry), cleaned)
    expired_note = ""
    needs_reauth: tuple[Rule, Entry] | None = None
    for rule in rules:
        if not rule.allowed:
            continue
        for entry in rule.paths:
            if not entry_covers(entry.parts, parts):
                continue
            if rule.expired(now):
                if not expired_note and rule.expires is not None:
                    when = rule.expires.strftime("%Y-%m-%dT%H:%M:%SZ")
                    expired_note = f"{_where(policy, rule, 'paths', entry)} expired {when}"
                continue
            if not fresh_enough(rule.reauth_after, now, login_time, login_used):
                needs_reauth = needs_reauth or (rule, entry)
                continue
            root = entry_covers_root(entry.parts) and not any(r.deny for r in rules)
            return Decision(True, GRANTED, _where(policy, rule, "paths", entry), cleaned, root,
                            reauth_after=rule.reauth_after)
    if needs_reauth is not None:
        rule, entry = needs_reauth
        return Decision(False, REAUTH, _where(policy, rule, "paths", entry), cleaned,
                        note=f"reauth_after {rule.reauth_after:g}s", reauth_after=rule.reauth_after)
    return Decision(False, NO_GRANT, None, cleaned, note=expired_note)


def fresh_enough(
    window: float | None, now: datetime.datetime, login_time: datetime.datetime | None, login_used: bool
) -> bool:
    """Whether a login at ``login_time`` satisfies a ``reauth_after`` of ``window`` seconds at ``now``.

    ``None`` (no ``reauth_after``) is always satisfied; otherwise a static token (``login_time``
    ``None``) never is; ``0`` needs a login not yet used for such a call; a positive window needs
    ``now - login_time <= window``.
    """
    if window is None:
        return True
    if login_time is None:
        return False
    if window == 0:
        return not login_used
    return (now - login_time).total_seconds() <= window


def covers(
    policy: Policy,
    user: str,
    groups: frozenset[str] | set[str],
    tool: str,
    path: str,
    now: datetime.datetime | None = None,
) -> bool:
    """Whether a live grant covers ``path`` (filters ``files/list``/``files/find`` entries)."""
    return decide(policy, user, groups, tool, path, now or utcnow()).allowed


def grant_covers_root(
    policy: Policy,
    user: str,
    groups: frozenset[str] | set[str],
    tool: str,
    path: str,
    now: datetime.datetime | None = None,
) -> bool:
    """Whether the grant allowing this call covers ``/`` with no deny, so symlinks may be followed
    (SPEC §4.4)."""
    return decide(policy, user, groups, tool, path, now or utcnow()).covers_root


def utcnow() -> datetime.datetime:
    """The current time as an aware UTC datetime."""
    return datetime.datetime.now(datetime.timezone.utc)


def os_groups(user: str) -> frozenset[str]:
    """The OS groups of ``user``, its primary group included; empty for an unknown user."""
    import grp
    import os
    import pwd

    try:
        gid = pwd.getpwnam(user).pw_gid
        gids = os.getgrouplist(user, gid)
    except (KeyError, OSError):
        return frozenset()
    names: set[str] = set()
    for g in gids:
        try:
            names.add(grp.getgrgid(g).gr_name)
        except KeyError:
            continue
    return frozenset(names)
