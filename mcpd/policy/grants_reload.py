"""Reloading ``mcp-sudo.yaml`` safely: keep the last good policy (docs/REFERENCE.md §4.5).

:class:`PolicyHolder` owns the current :class:`~mcpd.common.grantmatch.Policy` through the one reload
holder, :class:`mcpd.common.reload.Reloading`. A reload that fails (unsafe file, bad YAML, schema
error) changes nothing and is reported; a reload that succeeds replaces the policy and reports a
human summary of what changed (:func:`summarize_changes`). Every policy it holds carries the fixed
deny ``secrets`` (:func:`mcpd.policy.grants.secret_paths`).

Every load, the first one included, and every failed reload is recorded when an
:class:`~mcpd.common.audit.writer.AuditLog` is given: a set of adjacent records (:func:`reload_records`)
that holds the whole list of changes and, for a load, the whole text of the file and its SHA-256,
however long, so the policy in force at any time can be rebuilt from the log alone (``mcpd grants
at TIME``). A set of ``parts`` records numbers each (``part`` 1 to ``parts``) and each carries the
file's ``sha256`` and the count of ``changes``: an auditor sees that none is missing.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

from mcpd.common.audit.records import MAX_VALUE_CHARS
from mcpd.common.audit.writer import AuditLog
from mcpd.common.folders import read_file, write_file
from mcpd.common.grantmatch import Policy, is_secret
from mcpd.common.printable import printable
from mcpd.common.reload import Reloading
from mcpd.helper.wire.securefile import ConfigFileError, read_secure_file
from mcpd.policy.grants import PolicyError, parse_policy

log = logging.getLogger(__name__)

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
                out |= {f"{where} approve by {','.join(r.approve.by)} for {r.approve.seconds:g}s"
                        f"{' self' if r.approve.self_ok else ''}"} if r.approve is not None else set()
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


def reload_records(grants_file: str, lines: list[str], text: str | None, *, load: str = "reload",
                   previous: str | None = None, attempted: str | None = None,
                   summary: str | None = None) -> list[dict[str, Any]]:
    """The fields of the records of one load (``text``: the file loaded) or failed reload
    (``text`` None; ``lines``: its errors; ``attempted``: the text that failed, when it could be
    read), in order, each value within the audit log's
    :data:`~mcpd.common.audit.records.MAX_VALUE_CHARS`, so nothing is cut.

    Every record has ``grants_file``, ``load`` (``start``: the daemon's first load; ``reload``),
    ``decision`` (``loaded``, or ``kept the last good policy``), ``reason`` (the first: ``summary``
    when given, else the lines joined by ``"; "`` when that fits in :data:`SUMMARY_CHARS`, else
    the first few and how many more; the others: ``(continued)``), ``changes`` (how many lines),
    ``part`` (1-based) and ``parts``, ``sha256`` (of the file's bytes, UTF-8: the file loaded, or
    the one that failed; absent when it could not be read), ``previous_sha256`` when given
    (``previous``: the digest of the load the changes are counted from); then one piece:
    ``changes_text`` (a load's lines) or ``errors_text`` (a failure's), each line written with
    :func:`~mcpd.common.printable.printable` and joined by newlines, then ``grants_text`` (the
    file loaded, or the text that failed). The pieces of one field, in ``part`` order, joined,
    are the whole.
    """
    field_name = "changes_text" if text is not None else "errors_text"
    body = text if text is not None else attempted
    pieces = [(field_name, c) for c in _chunks("\n".join(printable(line) for line in lines))]
    pieces += [("grants_text", c) for c in _chunks(body)] if body is not None else []
    summary = _summary(lines, field_name) if summary is None else summary
    head: dict[str, Any] = {"grants_file": grants_file, "load": load,
                            "decision": "loaded" if text is not None else "kept the last good policy"}
    digest = {"sha256": _sha256(body)} if body is not None else {}
    digest.update({"previous_sha256": previous} if previous is not None else {})
    return [dict(head, reason=summary if i == 1 else "(continued)", **digest, changes=len(lines), part=i,
                 parts=len(pieces), **{name: piece}) for i, (name, piece) in enumerate(pieces, 1)]


def _summary(lines: list[str], field_name: str) -> str:
    """``lines`` joined by ``"; "`` when that fits in :data:`SUMMARY_CHARS`, else the first few
    and how many more (all of them are in ``field_name``)."""
    summary = "; ".join(lines)
    if len(summary) > SUMMARY_CHARS:
        shown = summary[:SUMMARY_CHARS].rsplit("; ", 1)[0]
        rest = len(lines) - shown.count("; ") - 1
        summary = f"{shown}; ... and {rest} more (all {len(lines)} in {field_name})"
    return summary


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


#: the text of the last load recorded, in the policy process's state folder: a start counts its
#: changes from it, and says when the file is the same
LAST_LOAD = "grants.loaded"


class PolicyHolder(Reloading[Policy]):
    """The live grants policy with last-good reloads (docs/REFERENCE.md §4.5), on :class:`Reloading`.

    Args:
        path: the grants file.
        owner_uid: the required owner of the file (0 = root).
        audit: where loads are recorded, or ``None``.
        secrets: the fixed deny (:func:`mcpd.policy.grants.secret_paths`) of every policy held.
        state_dir: a descriptor of the policy process's state folder, where the text of the last
            load recorded is kept (:data:`LAST_LOAD`), or None.

    The initial load happens in the constructor; if it fails the policy is empty (nothing is
    granted, the secrets still denied) and :attr:`last_errors` says why. It is recorded as a
    ``load: start``, its changes counted from the last load recorded before (kept in
    ``state_dir``): ``the same file as the last load`` when the digests match. When the audit
    log starts fresh (:attr:`~mcpd.common.audit.writer.AuditLog.started_fresh`: no record, no head state)
    although that folder holds an earlier load, the log's history was removed: an alert says so.
    """

    def __init__(self, path: str, owner_uid: int = 0, audit: AuditLog | None = None,
                 secrets: tuple[str, ...] = (), state_dir: int | None = None) -> None:
        self.audit, self.secrets, self.state_dir = audit, tuple(secrets), state_dir
        self.owner_uid = owner_uid
        self._attempted: str | None = None  # the text of the last file read, loaded or not
        is_secret(self.secrets, "/")  # a malformed entry raises PathError here, not in a decision
        empty = Policy(source=path, secrets=self.secrets)
        super().__init__(path, self._read, empty)
        before, note = self._last_load()
        if before is not None and audit is not None and audit.started_fresh:
            audit.record("alert", reason="the audit log and its head state are gone, though this daemon ran before "
                                         "(its last grants load is in its state folder): its earlier records were "
                                         "removed", log_file=audit.path)
        self._report(before or empty, load="start", note=note)

    def _read(self, path: str) -> Policy:
        """:func:`~mcpd.policy.grants.load_policy`, keeping the text read (:attr:`_attempted`)."""
        self._attempted = None
        try:
            text = read_secure_file(path, self.owner_uid)
        except ConfigFileError as exc:
            raise PolicyError(exc.errors) from None
        self._attempted = text
        return parse_policy(text, path, self.secrets)

    def _last_load(self) -> tuple[Policy | None, str]:
        """The policy of the last load recorded before this start (None when none is known) and
        what to say when it cannot be used."""
        if self.state_dir is None:
            return None, ""
        try:
            data = read_file(self.state_dir, LAST_LOAD)
        except OSError as exc:
            return None, f"the last load's text is unreadable ({exc.strerror})"
        if data is None:
            return None, ""
        try:
            return parse_policy(data.decode("utf-8"), self.path, self.secrets), ""
        except (PolicyError, UnicodeDecodeError):
            return None, f"the last load's text (sha256 {hashlib.sha256(data).hexdigest()[:12]}) no longer parses"

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

    def _report(self, old: Policy, load: str = "reload", note: str = "") -> ReloadResult:
        errors = self.last_errors
        start = load == "start"
        known = not start or bool(old.text)  # a start counts from the last load recorded, when known
        previous = _sha256(old.text) if known and (old.text or not start) else None
        same = previous is not None and not errors and previous == _sha256(self.current.text)
        lines = [] if errors or (start and same) else summarize_changes(old, self.current)
        result = ReloadResult(not errors, lines or ([] if errors else ["no changes"]), errors)
        summary = None
        if start and not errors:
            since = ("the same file as the last load" if same else
                     f"{len(lines)} change{'s' * (len(lines) != 1)} since the last load" if known else
                     f"no earlier load known{': ' + note if note else ''}, so everything is new")
            summary = f"daemon start: {since}" + ("" if same else f": {_summary(lines, 'changes_text')}")
        if self.audit is not None:
            self.audit.record_set("reload" if result.ok else "reload_failed",
                                  reload_records(self.path, lines if result.ok else errors,
                                                 self.current.text if result.ok else None, load=load,
                                                 previous=previous, summary=summary,
                                                 attempted=None if result.ok else self._attempted))
        if result.ok and self.state_dir is not None and (not same or not start):
            try:
                write_file(self.state_dir, LAST_LOAD, self.current.text.encode("utf-8"))
            except OSError as exc:
                log.warning("cannot keep the last load's text in the state folder: %s", exc)
        return result
