"""Grant matching: which paths a loaded grants policy lets a principal use, purely.

Shared by the policy process (which decides each privileged call) and the walker (which filters
every entry of a privileged list or find by the same grants). No YAML, no file reading: loading
and validating ``mcp-sudo.yaml`` is :mod:`mcpd.policy.grants`; the walker gets the rules that
apply as data (:func:`rules_to_wire`, :func:`policy_from_wire`).

A path is judged as a tuple of components (:func:`components`), never
as a string, so ``/srv/app`` can never match ``/srv/app-evil`` and no glob can match a ``/``: an
entry covers a path when it matches the path itself or one of its ancestors; ``*``, ``?`` and
``[...]`` match within one component (``fnmatch.fnmatchcase``), ``**`` zero or more whole
components. The rules (docs/REFERENCE.md §4): the daemon's own secrets (:attr:`Policy.secrets`)
are a fixed deny checked before any grant, ``/`` included; ``deny`` entries of every rule that
applies to the user for the tool win, even those of a rule ``allowed: false`` or expired;
``reauth_after`` (like sudo's ``timestamp_timeout``) needs a password login of the account at most
that long ago (``0``: one login, one call), never a static token; symlinks may be followed only
when the allowing entry covers ``/`` and no deny applies, and the caller then checks the opened
descriptor's real path with :func:`is_secret`.
"""

from __future__ import annotations

import datetime
import fnmatch
import functools
import re
from dataclasses import dataclass, field
from typing import Any

from mcpd.helper.wire.pathmatch import PathError, clean_path

TOOLS = ("files/read", "files/list", "files/find", "files/filetype", "files/grep")
NO_GRANT = "no grant covers this path"
DENIED = "path is denied by the grant"
GRANTED = "granted"
REAUTH = "reauthentication required"
SECRET = "the daemon's own secrets are never served"
DECIDED_MAX = 1024  # decisions remembered per loaded grants file (see Policy.decided)
_GLOB_CHARS = frozenset("*?[")


# ---------------------------------------------------------------- entries


def components(clean: str) -> tuple[str, ...]:
    """The components of an already cleaned absolute path (``/`` → ``()``)."""
    return tuple(part for part in clean.split("/") if part)


def split_entry(entry: str) -> tuple[str, ...]:
    """Validate a grant entry and return its components.

    Raises:
        PathError: relative, not normalised (``..``, ``.``, ``//``, trailing ``/``), NUL byte, or
            ``**`` mixed with other characters inside one component.
    """
    if not entry.startswith("/") and "\0" not in entry:
        raise PathError(f"path {entry!r} must be absolute")
    cleaned = clean_path(entry)
    if cleaned != entry:
        raise PathError(f"path {entry!r} is not normalised (write {cleaned!r})")
    parts = components(entry)
    if any("**" in part and part != "**" for part in parts):
        raise PathError(f"path {entry!r}: '**' must be a whole component")
    return parts


def _component_matches(pattern: str, name: str) -> bool:
    return pattern == name if _GLOB_CHARS.isdisjoint(pattern) else fnmatch.fnmatchcase(name, pattern)


def entry_covers(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Whether an entry (components of :func:`split_entry`) covers a path (its components).

    The entry covers the path when it matches the path or any ancestor of it. ``reach`` holds
    the path positions where the pattern consumed so far may end; time O(len(pattern) x len(path)).
    """
    reach = {0}
    for part in pattern:
        if part == "**":
            reach = set(range(min(reach), len(path) + 1))
        else:
            reach = {j + 1 for j in reach if j < len(path) and _component_matches(part, path[j])}
        if not reach:
            return False
    return True


def entry_covers_root(pattern: tuple[str, ...]) -> bool:
    """Whether an entry covers ``/`` itself, hence every path (``/``, ``/**``)."""
    return entry_covers(pattern, ())


# ---------------------------------------------------------------- rules and decisions


@dataclass(frozen=True)
class Entry:
    """One ``paths``/``deny`` entry: its text, components and 1-based line."""

    text: str
    parts: tuple[str, ...]
    line: int


@dataclass(frozen=True)
class Approve:
    """A grant's ``approve`` block: who may approve a call (``by``: principal names, and OS groups
    as ``%group``), how long one approval covers the same principal and path (``seconds``; ``0``:
    that one call) and whether an approver may approve their own request (``self_ok``)."""

    by: tuple[str, ...]
    seconds: float = 0.0
    self_ok: bool = False


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
    redact: tuple[str, ...] = ()  # the secret detectors of what this grant serves (mcpd.common.redaction)
    approve: Approve | None = None  # a person approves each call first (mcpd.policy.confirm)

    def expired(self, now: datetime.datetime) -> bool:
        """Whether ``expires`` is at or before ``now`` (an aware datetime)."""
        return self.expires is not None and now >= self.expires


@dataclass(frozen=True)
class Policy:
    """A loaded grants file: ``users[name][tool]`` and ``groups[name][tool]`` rules, the fixed deny
    ``secrets`` (:func:`mcpd.policy.grants.secret_paths`, given by the caller) and the ``text`` it was parsed from."""

    source: str = "mcp-sudo.yaml"
    users: dict[str, dict[str, Rule]] = field(default_factory=dict)
    groups: dict[str, dict[str, Rule]] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    text: str = ""
    #: decisions of :func:`decide` for static tokens while :attr:`timeless` (bounded; this object only)
    decided: dict[tuple[str, frozenset[str], str, str], Decision] = field(default_factory=dict, compare=False,
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
            the grant`` or ``no grant covers this path`` (docs/REFERENCE.md §4.1), or why the path is invalid.
        rule: the rule and entry that decided (``users.alice files/read paths /var/log
            (mcp-sudo.yaml:6)``, ``fixed deny /etc/mcpd/users.yaml*``), or ``None``.
        resolved_path: the lexically cleaned path, or ``None`` when the path is invalid.
        covers_root: the allowing entry covers ``/`` and no deny applies (symlinks may be followed).
        note: an explanation for operators only (e.g. which grant expired).
        reauth_after: the ``reauth_after`` window (seconds) of the allowing rule, or ``None``.
        redact: the allowing rule's ``redact`` detectors (docs/REFERENCE.md §3 "Redaction").
        approve: the allowing rule's ``approve`` block (a person approves the call first), or ``None``.
    """

    allowed: bool
    reason: str
    rule: str | None
    resolved_path: str | None
    covers_root: bool = False
    note: str = ""
    reauth_after: float | None = None
    redact: tuple[str, ...] = ()
    approve: Approve | None = None



# ---------------------------------------------------------------- the daemon's own secrets


def escape_glob(path: str) -> str:
    """``path`` as a grant entry naming exactly it: ``*``, ``?`` and ``[`` become ``[*]`` ..."""
    return re.sub(r"[*?[]", lambda m: f"[{m.group(0)}]", path)



@functools.lru_cache(maxsize=8)
def secret_entries(secrets: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The fixed deny ``secrets`` (grant-style entries), each with its components."""
    return tuple((s, split_entry(s)) for s in secrets)


@functools.lru_cache(maxsize=1024)  # pure; the same few paths are asked again and again
def _secret_hit(secrets: tuple[str, ...], parts: tuple[str, ...]) -> str | None:
    return next((text for text, entry in secret_entries(secrets) if entry_covers(entry, parts)), None)


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
    """Decide a privileged call, purely (docs/REFERENCE.md §4.1, §4.3, §4.5a).

    Args:
        policy: the loaded grants, with its fixed deny ``secrets`` (refused first, whatever a
            grant says).
        user: the OS user name (a key under ``users:``).
        groups: the OS group names the user belongs to (see :func:`mcpd.policy.grants.os_groups`).
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
            return Decision(True, GRANTED, _where(policy, rule, "paths", entry), cleaned, root, "", rule.reauth_after,
                            rule.redact, rule.approve)
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
    return datetime.datetime.now(datetime.UTC)


# ---------------------------------------------------------------- the walker's copy of the rules


def rules_to_wire(policy: Policy, user: str, groups: frozenset[str] | set[str], tool: str) -> list[dict[str, Any]]:
    """The rules of ``policy`` that apply to ``user`` (in ``groups``) for ``tool``, as JSON data
    for the walker (:func:`policy_from_wire`): those are all :func:`decide` reads for that
    principal and tool, so the walker decides every entry as the policy process decided the call."""
    return [{"subject": r.subject, "tool": r.tool, "allowed": r.allowed, "line": r.line,
             "paths": [[e.text, e.line] for e in r.paths], "deny": [[e.text, e.line] for e in r.deny],
             "expires": None if r.expires is None else r.expires.isoformat(), "reauth_after": r.reauth_after}
            for r in applicable_rules(policy, user, groups, tool)]


def policy_from_wire(rules: list[dict[str, Any]], secrets: tuple[str, ...]) -> Policy:
    """The :class:`Policy` holding ``rules`` (from :func:`rules_to_wire`) and the fixed deny
    ``secrets``. Raises ``ValueError``, ``TypeError``, ``KeyError`` or
    :class:`~mcpd.helper.wire.pathmatch.PathError` for anything malformed (fail closed)."""
    users: dict[str, dict[str, Rule]] = {}
    groups: dict[str, dict[str, Rule]] = {}
    for r in rules:
        kind, _, name = str(r["subject"]).partition(".")
        table = {"users": users, "groups": groups}[kind]
        expires = None if r["expires"] is None else datetime.datetime.fromisoformat(r["expires"])
        if (expires is not None and expires.tzinfo is None) or r["tool"] not in TOOLS or not isinstance(r["allowed"], bool):
            raise ValueError("malformed rule")
        reauth = None if r["reauth_after"] is None else float(r["reauth_after"])
        paths, deny = (tuple(Entry(str(text), split_entry(str(text)), int(line)) for text, line in r[key])
                       for key in ("paths", "deny"))
        table.setdefault(name, {})[r["tool"]] = Rule(r["subject"], r["tool"], r["allowed"], paths, deny, expires,
                                                     int(r["line"]), reauth)
    return Policy(users=users, groups=groups, secrets=tuple(secrets))
