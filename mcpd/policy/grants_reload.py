"""Reloading ``mcp-sudo.yaml`` safely: keep the last good policy (SPEC §4.5).

:class:`PolicyHolder` owns the current :class:`~mcpd.policy.grants.Policy` through the one reload
holder, :class:`mcpd.common.reload.Reloading`. A reload that fails (unsafe file, bad YAML, schema
error) changes nothing and is reported; a reload that succeeds replaces the policy and reports a
human summary of what changed (:func:`summarize_changes`). Every policy it holds carries the fixed
deny ``secrets`` (:func:`mcpd.policy.grants.secret_paths`).

Every load, the first one included, and every failed reload is recorded when an
:class:`~mcpd.common.audit.AuditLog` is given: a set of adjacent records (:func:`reload_records`)
that holds the whole list of changes and, for a load, the whole text of the file and its SHA-256,
however long, so the policy in force at any time can be rebuilt from the log alone (``mcpd grants
at TIME``). A set of ``parts`` records numbers each (``part`` 1 to ``parts``) and each carries the
file's ``sha256`` and the count of ``changes``: an auditor sees that none is missing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from mcpd.common.audit import MAX_VALUE_CHARS, AuditLog
from mcpd.common.printable import printable
from mcpd.common.reload import Reloading
from mcpd.policy.grants import Policy, is_secret, load_policy

SUMMARY_CHARS = 1000  # the first record's reason: the changes joined, when they fit, else the first few


@dataclass(frozen=True)
class ReloadResult:
    """Outcome of :meth:`PolicyHolder.reload`: ``ok``, the change summary lines or the errors."""

    ok: bool
    summary: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _facts(policy: Policy) -> set[str]:
    out: set[str] = set()
    for kind in ("users", "groups"):
        for name, rules in getattr(policy, kind).items():
            out.add(f"{kind}.{name}")
            for tool, r in rules.items():
                expires = r.expires.strftime("%Y-%m-%dT%H:%M:%SZ") if r.expires else None
                where = f"{kind}.{name} {tool}"
                out |= {where, f"{where} allowed {str(r.allowed).lower()}", f"{where} expires {expires or 'never'}"}
                out |= {f"{where} reauth_after {r.reauth_after:g}s"} if r.reauth_after is not None else set()
                out |= {f"{where} {k} {e.text}" for k in ("paths", "deny") for e in getattr(r, k)}
    return out


def summarize_changes(old: Policy, new: Policy) -> list[str]:
    """Human lines describing what changed from ``old`` to ``new``: a single-valued setting
    (``allowed``, ``expires``, ``reauth_after``) that changed is one line ``users.alice files/read
    reauth_after 300s -> 600s``; any other fact (a subject, a tool, each ``paths`` and ``deny``
    entry, a setting set or unset) is ``... added`` or ``... removed``; ``["no changes"]`` when
    nothing did."""
    before, after = _facts(old), _facts(new)
    gone, came = sorted(before - after), sorted(after - before)
    single = (" allowed ", " expires ", " reauth_after ")
    was = {f.rpartition(" ")[0]: f.rpartition(" ")[2] for f in gone if any(k in f for k in single)}
    lines, changed = [], set()
    for fact in came:
        head, _, value = fact.rpartition(" ")
        if head in was:
            lines.append(f"{head} {was[head]} -> {value}")
            changed.add(head)
        else:
            lines.append(f"{fact} added")
    lines += [f"{f} removed" for f in gone if f.rpartition(" ")[0] not in changed]
    return lines or ["no changes"]


def _chunks(text: str) -> list[str]:
    return [text[i:i + MAX_VALUE_CHARS] for i in range(0, len(text), MAX_VALUE_CHARS)] or [""]


def reload_records(grants_file: str, lines: list[str], text: str | None) -> list[dict[str, Any]]:
    """The fields of the records of one load (``text``: the file loaded) or failed reload
    (``text`` None; ``lines``: its errors), in order, each value within the audit log's
    :data:`~mcpd.common.audit.MAX_VALUE_CHARS`, so nothing is cut.

    Every record has ``grants_file``, ``decision`` (``loaded``, or ``kept the last good
    policy``), ``reason`` (the first: the lines joined by ``"; "`` when that fits in
    :data:`SUMMARY_CHARS`, else the first few and how many more; the others: ``(continued)``),
    ``changes`` (how many lines), ``part`` (1-based) and ``parts``, and for a load ``sha256`` (of the
    file's bytes, UTF-8); then one piece: ``changes_text`` (a load's lines) or ``errors_text`` (a
    failure's), each line written with :func:`~mcpd.common.printable.printable` and joined by
    newlines, then, for a load, ``grants_text`` (the file). The pieces of one field, in ``part``
    order, joined, are the whole.
    """
    field_name = "changes_text" if text is not None else "errors_text"
    pieces = [(field_name, c) for c in _chunks("\n".join(printable(line) for line in lines))]
    pieces += [("grants_text", c) for c in _chunks(text)] if text is not None else []
    summary = "; ".join(lines)
    if len(summary) > SUMMARY_CHARS:
        shown = summary[:SUMMARY_CHARS].rsplit("; ", 1)[0]
        rest = len(lines) - shown.count("; ") - 1
        summary = f"{shown}; ... and {rest} more (all {len(lines)} in {field_name})"
    head: dict[str, Any] = {"grants_file": grants_file,
                            "decision": "loaded" if text is not None else "kept the last good policy"}
    digest = {"sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()} if text is not None else {}
    return [dict(head, reason=summary if i == 1 else "(continued)", **digest, changes=len(lines), part=i,
                 parts=len(pieces), **{name: piece}) for i, (name, piece) in enumerate(pieces, 1)]


class PolicyHolder(Reloading[Policy]):
    """The live grants policy with last-good reloads (SPEC §4.5), on :class:`Reloading`.

    Args:
        path: the grants file.
        owner_uid: the required owner of the file (0 = root).
        audit: where reloads are recorded, or ``None``.
        secrets: the fixed deny (:func:`mcpd.policy.grants.secret_paths`) of every policy held.

    The initial load happens in the constructor; if it fails the policy is empty (nothing is
    granted, the secrets still denied) and :attr:`last_errors` says why.
    """

    def __init__(self, path: str, owner_uid: int = 0, audit: AuditLog | None = None,
                 secrets: tuple[str, ...] = ()) -> None:
        self.audit, self.secrets = audit, tuple(secrets)
        is_secret(self.secrets, "/")  # a malformed entry raises PathError here, not in a decision
        empty = Policy(source=path, secrets=self.secrets)
        super().__init__(path, lambda p: load_policy(p, owner_uid, self.secrets), empty)
        self._report(empty)

    @property
    def policy(self) -> Policy:
        """The current (last good) policy."""
        return self.current

    @property
    def text(self) -> str:
        """The text the current policy was parsed from (``""`` while nothing loaded)."""
        return self.current.text

    def reload(self) -> ReloadResult:
        """Load the file again; on failure keep the current policy. Never raises for file problems."""
        old = self.current
        self.refresh(force=True)
        return self._report(old)

    def reload_if_changed(self) -> ReloadResult | None:
        """Reload when the file's device, inode, size or mtime changed; ``None`` when unchanged."""
        old = self.current
        return self._report(old) if self.refresh() else None

    def _report(self, old: Policy) -> ReloadResult:
        errors = self.last_errors
        result = ReloadResult(not errors, [] if errors else summarize_changes(old, self.current), errors)
        if self.audit is not None:
            self.audit.record_set("reload" if result.ok else "reload_failed",
                                  reload_records(self.path, result.summary or result.errors,
                                                 self.current.text if result.ok else None))
        return result
