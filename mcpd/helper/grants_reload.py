"""Reloading ``mcp-sudo.yaml`` safely: keep the last good policy (SPEC §4.5).

:class:`PolicyHolder` owns the current :class:`~mcpd.helper.grants.Policy`. A reload that fails
(unsafe file, bad YAML, schema error) changes nothing and is reported; a reload that succeeds
replaces the policy and reports a human summary of what changed (:func:`summarize_changes`).
Every reload, good or bad, is one audit record when an :class:`~mcpd.helper.audit.AuditLog` is
given.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from mcpd.common.filesig import Signature, signature
from mcpd.helper.audit import AuditLog
from mcpd.helper.grants import Policy, PolicyError, Rule, load_policy


@dataclass(frozen=True)
class ReloadResult:
    """Outcome of :meth:`PolicyHolder.reload`: ``ok``, the change summary lines or the errors."""

    ok: bool
    summary: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _flatten(policy: Policy) -> dict[str, dict[str, Rule]]:
    out: dict[str, dict[str, Rule]] = {}
    for name, rules in policy.users.items():
        out[f"users.{name}"] = rules
    for name, rules in policy.groups.items():
        out[f"groups.{name}"] = rules
    return out


def _rule_changes(subject: str, tool: str, old: Rule, new: Rule) -> list[str]:
    lines: list[str] = []
    where = f"{subject} {tool}"
    if old.allowed != new.allowed:
        lines.append(f"{where}: allowed {str(old.allowed).lower()} -> {str(new.allowed).lower()}")
    for kind in ("paths", "deny"):
        before = {e.text for e in getattr(old, kind)}
        after = {e.text for e in getattr(new, kind)}
        lines += [f"{where}: {kind} added {p}" for p in sorted(after - before)]
        lines += [f"{where}: {kind} removed {p}" for p in sorted(before - after)]
    if old.expires != new.expires:
        fmt = "%Y-%m-%dT%H:%M:%SZ"
        a = old.expires.strftime(fmt) if old.expires else "never"
        b = new.expires.strftime(fmt) if new.expires else "never"
        lines.append(f"{where}: expires {a} -> {b}")
    return lines


def summarize_changes(old: Policy, new: Policy) -> list[str]:
    """Human lines describing what changed from ``old`` to ``new``: subjects, tools, paths, deny
    entries, ``allowed`` and ``expires``; ``["no changes"]`` when nothing did."""
    before, after = _flatten(old), _flatten(new)
    lines = [f"{s} added" for s in sorted(set(after) - set(before))]
    lines += [f"{s} removed" for s in sorted(set(before) - set(after))]
    for subject in sorted(set(before) & set(after)):
        a, b = before[subject], after[subject]
        lines += [f"{subject} {t} added" for t in sorted(set(b) - set(a))]
        lines += [f"{subject} {t} removed" for t in sorted(set(a) - set(b))]
        for tool in sorted(set(a) & set(b)):
            lines += _rule_changes(subject, tool, a[tool], b[tool])
    return lines or ["no changes"]


def _signature(path: str) -> Signature | None:
    try:
        return signature(path)
    except OSError:
        return None


class PolicyHolder:
    """The live grants policy with last-good reloads (SPEC §4.5).

    Args:
        path: the grants file.
        owner_uid: the required owner of the file (0 = root).
        audit: where reloads are recorded, or ``None``.

    The initial load happens in the constructor; if it fails the policy is empty (nothing is
    granted) and :attr:`last_errors` says why.
    """

    def __init__(self, path: str, owner_uid: int = 0, audit: AuditLog | None = None) -> None:
        self.path = path
        self.owner_uid = owner_uid
        self.audit = audit
        self._lock = threading.Lock()
        self._policy = Policy(source=path)
        self._signature: tuple[int, int, int, int] | None = None
        self.last_errors: list[str] = []
        self.reload()

    @property
    def policy(self) -> Policy:
        """The current (last good) policy."""
        with self._lock:
            return self._policy

    def reload(self) -> ReloadResult:
        """Load the file again; on failure keep the current policy. Never raises for file problems."""
        signature = _signature(self.path)
        try:
            new = load_policy(self.path, self.owner_uid)
        except PolicyError as exc:
            with self._lock:
                self.last_errors = exc.errors
                self._signature = signature
            self._record("reload_failed", "kept the last good policy", "; ".join(exc.errors))
            return ReloadResult(False, errors=exc.errors)
        with self._lock:
            summary = summarize_changes(self._policy, new)
            self._policy = new
            self._signature = signature
            self.last_errors = []
        self._record("reload", "loaded", "; ".join(summary))
        return ReloadResult(True, summary=summary)

    def reload_if_changed(self) -> ReloadResult | None:
        """Reload when the file's device, inode, size or mtime changed; ``None`` when unchanged."""
        if _signature(self.path) == self._signature:
            return None
        return self.reload()

    def _record(self, event: str, decision: str, reason: str) -> None:
        if self.audit is not None:
            self.audit.record(event, grants_file=self.path, decision=decision, reason=reason)
