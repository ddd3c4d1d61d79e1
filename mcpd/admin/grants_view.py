"""How ``mcpd grants`` shows a grant: a rule's readable lines (state, expiry, ``reauth_after``,
paths, deny entries, each with its ``file:line``, escaped), and the JSON shapes of a rule and a
whole policy (``export --json``). It decides nothing: :mod:`mcpd.common.grantmatch` does.
"""

from __future__ import annotations

import datetime
from typing import Any

from mcpd.common.grantmatch import Approve, Policy, Rule
from mcpd.common.identity import UsersFileError, load_users
from mcpd.common.printable import printable
from mcpd.common.redaction import describe, union

_FMT = "%Y-%m-%dT%H:%M:%SZ"


def duration_text(seconds: float) -> str:
    """A ``reauth_after`` window as the file writes it: ``0``, ``45s``, ``5m``, ``1h``."""
    whole = int(seconds)
    if whole == 0:
        return "0"
    unit = next((u for u, n in (("h", 3600), ("m", 60)) if whole % n == 0), "s")
    return f"{whole // {'h': 3600, 'm': 60, 's': 1}[unit]}{unit}"


def reauth_text(seconds: float) -> str:
    """What a ``reauth_after`` window asks of a caller, in words."""
    if seconds == 0:
        return ("reauth_after 0: every call needs a password login of its own (linuxctl login): one call "
                "per login; a users.yaml token never qualifies")
    return (f"reauth_after {duration_text(seconds)}: a call needs a password login (linuxctl login) at most "
            f"{duration_text(seconds)} old; a users.yaml token never qualifies")


def approve_text(approve: Approve) -> str:
    """A rule's ``approve`` block in words: ``approve by bob, %ops for 1h (not their own)``."""
    cover = f" for {duration_text(approve.seconds)}" if approve.seconds else " each call"
    return f"approve by {', '.join(approve.by)}{cover}{'' if approve.self_ok else ' (not their own)'}"


def rule_lines(policy: Policy, rule: Rule, now: datetime.datetime, head: str, indent: str) -> list[str]:
    """The readable lines of one rule: ``head (state, expires, reauth_after, file:line)``, then its
    ``path`` and ``deny`` entries and what its ``reauth_after`` asks, each escaped."""
    state = "expired" if rule.allowed and rule.expired(now) else "allowed" if rule.allowed else "not allowed"
    facts = [state] + ([f"expires {rule.expires.strftime(_FMT)}"] if rule.expires else [])
    facts += [f"reauth_after {duration_text(rule.reauth_after)}"] if rule.reauth_after is not None else []
    facts += [f"redact {describe(rule.redact)}"] if rule.redact else []
    facts += [approve_text(rule.approve)] if rule.approve is not None else []
    lines = [f"{head} ({', '.join(facts)}, {policy.source}:{rule.line})"]
    lines += [f"{indent}path {e.text} ({policy.source}:{e.line})" for e in rule.paths]
    lines += [f"{indent}deny {e.text} ({policy.source}:{e.line})" for e in rule.deny]
    lines += [f"{indent}{reauth_text(rule.reauth_after)}"] if rule.reauth_after is not None else []
    return [printable(line) for line in lines]


def rule_to_dict(rule: Rule) -> dict[str, Any]:
    """The JSON shape of one rule: ``allowed``, ``paths``, ``deny``, ``expires`` (ISO 8601 UTC or
    null), ``reauth_after`` (seconds, an integer, or null), ``line``, ``redact`` (detector names) and
    ``approve`` (``{by, for: seconds, self}``) when the rule has them."""
    out: dict[str, Any] = {
        "allowed": rule.allowed,
        "paths": [e.text for e in rule.paths],
        "deny": [e.text for e in rule.deny],
        "expires": rule.expires.strftime(_FMT) if rule.expires else None,
        "reauth_after": None if rule.reauth_after is None else int(rule.reauth_after),
        "line": rule.line,
    }
    if rule.redact:
        out["redact"] = list(rule.redact)
    if rule.approve is not None:
        out["approve"] = {"by": list(rule.approve.by), "for": int(rule.approve.seconds), "self": rule.approve.self_ok}
    return out


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """The JSON shape of a policy: ``users`` and ``groups`` mirroring the YAML file, and
    ``fixed_deny``, the daemon's own secrets (:attr:`Policy.secrets`)."""
    def subjects(table: dict[str, dict[str, Rule]]) -> dict[str, Any]:
        return {
            name: {"privileged": {"tools": {t: rule_to_dict(r) for t, r in sorted(rules.items())}}}
            for name, rules in sorted(table.items())
        }

    return {"users": subjects(policy.users), "groups": subjects(policy.groups), "fixed_deny": list(policy.secrets)}


def redaction_lines(grant: tuple[str, ...], users_file: str, os_user: str) -> list[str]:
    """What ``mcpd grants test`` says of redaction (docs/REFERENCE.md §3 "Redaction"): the allowing
    grant's detectors, each principal of ``users_file`` bound to ``os_user`` with its own, and the
    union that applies to that principal's privileged call. A users file that cannot be read here
    is said so (the grant's part still stands)."""
    lines = [f"redaction (grant): {describe(grant)}"]
    try:
        users = load_users(users_file)
    except (UsersFileError, OSError) as exc:
        return lines + [f"redaction (users.yaml): unknown here ({str(exc)[:200]})"]
    for name in sorted(n for n, u in users.items() if u.os_user == os_user):
        own = users[name].redact
        lines.append(f"redaction for principal {name}: {describe(union(grant, own))} "
                     f"(users.yaml: {describe(own)})")
    return lines
