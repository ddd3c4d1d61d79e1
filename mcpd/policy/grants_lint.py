"""``mcpd grants check``'s warnings about a loaded grants policy (:func:`lint_policy`).

Rules that apply to no one or grant nothing, entries no request path can ever match
(:func:`entry_problems`) and entries a deny covers whole (:func:`entry_subsumes`). Nothing here
decides a call: :mod:`mcpd.common.grantmatch` does.
"""

from __future__ import annotations

import datetime
import fnmatch
from collections.abc import Callable

from mcpd.common.grantmatch import Entry, Policy, Rule, entry_covers, secret_entries
from mcpd.common.validate import NAME_MAX, PATH_MAX

_Errors = list[tuple[int, str]]  # (line, message)
_GLOB_CHARS = frozenset("*?[")


def entry_subsumes(outer: tuple[str, ...], inner: tuple[str, ...]) -> bool:
    """Whether every path the entry ``inner`` covers is covered by the entry ``outer`` too (both
    components from :func:`~mcpd.common.grantmatch.split_entry`).

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

    Warned: a subject that is no OS account or group; an allowed rule that has expired; ``redact``
    on a rule ``allowed: false`` (only the allowing rule's redaction applies); a
    ``paths`` entry every path of which is denied (by a ``deny`` of its own rule, or by the fixed
    deny of the daemon's own secrets); a ``paths`` or ``deny`` entry no request can match
    (:func:`entry_problems`), and :func:`entry_problems`'s hints; an ``approve`` on a rule that
    grants nothing, or whose ``by`` names an OS group (``%group``) that does not exist.
    """
    out: list[tuple[int, str]] = []
    secrets = secret_entries(policy.secrets)
    for kind, table, exists in (("users", policy.users, user_exists), ("groups", policy.groups, group_exists)):
        for name, rules in table.items():
            if rules and not exists(name) and ":" not in name:  # (corp:ops: an OAuth token's group, §5.4)
                what = "OS account" if kind == "users" else "OS group"
                out.append((min(r.line for r in rules.values()),
                            f"{kind}.{name}: no {what} is named {name}: its rules apply to no one "
                            "(check the spelling)"))
            for rule in rules.values():
                out += _lint_rule(rule, now, secrets)
                out += _lint_approve(rule, group_exists)
    return sorted(out, key=lambda w: w[0])


def _lint_approve(rule: Rule, group_exists: Callable[[str], bool]) -> _Errors:
    """An ``approve`` block on a rule that grants nothing, or naming an OS group that does not exist."""
    if rule.approve is None:
        return []
    where = f"{rule.subject} {rule.tool}"
    out = [(rule.line, f"{where}: approve on a rule that grants nothing approves nothing")] if not rule.allowed else []
    out += [(rule.line, f"{where}: approve.by {b}: no OS group is named {b[1:]}: nobody of it can approve")
            for b in rule.approve.by if b.startswith("%") and not group_exists(b[1:])]
    return out


def _lint_rule(rule: Rule, now: datetime.datetime, secrets: tuple[tuple[str, tuple[str, ...]], ...]) -> _Errors:
    where, out, dead = f"{rule.subject} {rule.tool}", [], 0
    if rule.allowed and rule.expired(now):
        out.append((rule.line, f"{where}: expired {rule.expires:%Y-%m-%dT%H:%M:%SZ}: it grants nothing"))
    if rule.redact and not rule.allowed:
        out.append((rule.line, f"{where}: redact on a rule that grants nothing redacts nothing (the rule "
                    "that allows a call decides its redaction, with the principal's own)"))
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
