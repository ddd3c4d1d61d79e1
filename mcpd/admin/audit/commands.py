"""``mcpd audit``: read, prove and replay the audit logs (docs/REFERENCE.md §7).

* ``mcpd audit tail [-n N] [--json] [--user U] [--decision D] [--path GLOB] [--event E]
  [--since T] [--until T] [--follow] [--access]`` — the last records of the log and its rotated
  files, one readable line each (time, user, route, tool, path, decision, reason, bytes, rule),
  every field a client controls escaped and quoted (:func:`mcpd.common.printable.field`), or the
  raw JSON lines with ``--json``; ``--decision reject`` lists every refusal (``refused_at_open``
  and ``refused_by_os`` too); ``--access`` reads the front's access log (the unprivileged route)
  instead of the policy process's audit log, whose view also shows the privileged calls only the front
  recorded; records out of order or repeated are a warning.
* ``mcpd audit verify [--access] [--since-seq N] [--logrotate FILE] [--checkpoints FILE] [FILE...]``
  — checks the hash chain (default: the audit log, or the access log, and its rotated files, oldest first)
  from seq 1 and the audit log's end against its writer's head state: exit 0 and the record
  count when whole, else exit 1 listing every break (:func:`mcpd.admin.audit.verify.verify`); a
  history that does not begin at seq 1 passes only when logrotate's retention explains it
  (:class:`mcpd.admin.audit.retention.History`) or ``--since-seq`` allows it. ``--checkpoints
  FILE``: and each checkpoint of the log in FILE (kept off the host) names a record read, with its
  hash (:mod:`mcpd.admin.audit.checkpoints`); exit 2 when FILE is malformed.
* ``mcpd audit replay [--since T] [--user U]`` — re-decides every past privileged call against
  today's grants and lists those whose outcome would now differ, with the rule deciding today.
* ``mcpd grants at TIME`` (registered in the ``grants`` group) — the grants file in force at
  TIME, rebuilt from the audit log's load records.

Files default to ``mcpd.yaml``'s ``audit_log``/``access_log``/``grants_file`` (``--config``,
default ``/etc/mcpd/mcpd.yaml`` when it exists).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import heapq
import os
import sys
from collections.abc import Iterator
from typing import Any

import click

from mcpd.admin.audit.checkpoints import CheckpointFileError, Claim, Lookup, compare, read_checkpoints
from mcpd.admin.audit.filters import Filter, Order, last_records, parse_time
from mcpd.admin.audit.loads import Load, loads
from mcpd.admin.audit.logfiles import Line, follow_lines, read_lines, records, rotated_set
from mcpd.admin.audit.retention import LOGROTATE_FILE, History
from mcpd.admin.audit.verify import verify as verify_chain
from mcpd.admin.audit.views import as_json_line, human
from mcpd.admin.grants_cli import _any_owner_option, _config_option, _defaults, _file_option, _load
from mcpd.common.audit.head import Head, read_head_at
from mcpd.common.audit.journal import JOURNAL_SOCKET
from mcpd.common.audit.records import REFUSED_AT_OPEN
from mcpd.common.grantmatch import DENIED, NO_GRANT, SECRET, TOOLS, decide, utcnow
from mcpd.common.printable import printable
from mcpd.policy.grants import os_groups


def _time_option(name: str, help_text: str) -> Any:
    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime.datetime | None:
        if value is None:
            return None
        try:
            return parse_time(value)
        except ValueError:
            raise click.BadParameter("an ISO 8601 time (2026-12-01T06:00Z) or a span back (90s, 15m, 2h, 3d)") from None

    return click.option(name, default=None, callback=convert, help=help_text)


_since = _time_option("--since", "Only records at or after this time (ISO 8601, or 15m, 2h, 3d ago)")
_until = _time_option("--until", "Only records at or before this time")


@click.group()
def audit() -> None:
    """Read, verify and replay the audit logs (privileged decisions and every call)."""


@audit.command()
@click.option("-n", "count", default=20, show_default=True, type=click.IntRange(0, 1000000),
              help="How many (matching) records")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON records")
@click.option("--user", default=None, help="Only this principal or OS account")
@click.option("--decision", default=None, help="Only this decision (accept, reject ...)")
@click.option("--path", "path_glob", default=None, help="Only records whose requested or resolved path matches this glob")
@click.option("--event", default=None, help="Only this event (accept, reject, reload, alert, spawn, login ...)")
@click.option("--iss", default=None, help="Only OAuth calls of this issuer (its iss)")
@click.option("--sub", default=None, help="Only OAuth calls of this subject (the token's sub)")
@click.option("--client", default=None, help="Only OAuth calls of this client (azp or client_id)")
@click.option("--jti", default=None, help="Only the calls of this OAuth token (its jti)")
@_since
@_until
@click.option("--follow", is_flag=True, help="Keep printing new records (Ctrl-C to stop)")
@click.option("--access", is_flag=True, help="Read the front's access log (unprivileged calls) instead")
@click.option("--file", "log_file", default=None, type=click.Path(dir_okay=False),
              help="The log to read (default: from --config, else /var/log/mcpd/audit.jsonl)")
@_config_option
def tail(count: int, as_json: bool, user: str | None, decision: str | None, path_glob: str | None,
         event: str | None, iss: str | None, sub: str | None, client: str | None, jti: str | None,
         since: datetime.datetime | None, until: datetime.datetime | None, follow: bool,
         access: bool, log_file: str | None, config_path: str | None) -> None:
    """Print the last N records (readable, or --json), filtered, and with --follow the new ones.
    The log's rotated files are read too (newest last): -n and the filters span them. From the
    audit log, the privileged calls the front refused before the policy process received them
    (recorded in the access log) are shown too, in time order, marked [access log]."""
    cfg = _defaults(config_path)
    path = log_file or (cfg.access_log if access else cfg.audit_log)
    if not path:
        raise click.ClickException("no access log is configured (access_log in mcpd.yaml)")
    claims = tuple((k, v) for k, v in (("iss", iss), ("sub", sub), ("client", client), ("jti", jti)) if v is not None)
    flt = Filter(user, decision, path_glob, since, until, event, claims=claims)
    other = cfg.access_log if not access and not log_file and cfg.access_log else None

    def show(raw: bytes, rec: dict[str, Any], source: str = "") -> None:
        click.echo(as_json_line(raw, rec) if as_json else human(rec, source))

    order = Order(backwards=True)
    try:
        end = os.stat(path).st_size  # --follow goes on from exactly here
        found = [(raw, rec, "") for raw, rec in last_records(rotated_set(path), flt, count, end=end, order=order)]
    except OSError as exc:
        click.echo(f"error: {printable(exc.filename or path)}: {exc.strerror}", err=True)
        sys.exit(1)
    if other is not None:  # the privileged calls only the front recorded
        front = dataclasses.replace(flt, route="privileged")
        try:
            extra = last_records(rotated_set(other), front, count)
        except OSError as exc:
            click.echo(f"note: {printable(exc.filename or other)}: {exc.strerror}: the privileged calls the front "
                       "refused before the policy process received them are not shown", err=True)
        else:
            # merged by time, each log in its own order (a record's time is when it was begun, so
            # within one log times need not rise with seq)
            found = list(heapq.merge(found, [(raw, rec, "access log") for raw, rec in extra],
                                     key=lambda item: str(item[1].get("time", ""))))[-count:] if count else []
    for raw, rec, source in found:
        show(raw, rec, source)
    sys.stdout.flush()
    if (warning := order.warning(printable(path))) is not None:
        click.echo(warning, err=True)
    if follow:
        try:
            for raw in follow_lines(path, end):
                new = Line(path, raw).record()
                if new is not None and flt.match(new):
                    show(raw, new)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            pass
        except OSError as exc:  # (rotated to something that is no regular file, or unreadable)
            click.echo(f"error: {printable(exc.filename or path)}: {printable(str(exc.strerror))}", err=True)
            sys.exit(1)


@audit.command()
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--access", is_flag=True, help="Default to the front's access log instead of the audit log")
@click.option("--since-seq", "since_seq", type=click.IntRange(1), default=None,
              help="History may begin at this seq (the records before it were removed on purpose); "
                   "the chain must still reach back to it")
@click.option("--logrotate", "logrotate_file", default=LOGROTATE_FILE, show_default=True,
              type=click.Path(dir_okay=False), help="The logrotate file whose 'rotate N' says how many old files are kept")
@click.option("--checkpoints", "checkpoints_file", default=None, type=click.Path(dir_okay=False),
              help="Also prove the log matches these checkpoints a collector kept (journalctl -o json lines, "
                   "syslog lines, or {\"log\", \"seq\", \"hash\"} JSON lines)")
@_config_option
def verify(files: tuple[str, ...], access: bool, since_seq: int | None, logrotate_file: str,
           checkpoints_file: str | None, config_path: str | None) -> None:
    """Prove the hash chain whole over FILEs, oldest first (default: the audit log, or with
    --access the access log, and its rotated files), from seq 1, and the audit log's end where its
    writer left it (its head state in helper_state_dir). Every break is listed (edited, deleted,
    reordered, repeated, truncated, lost, missing). A chain that does not begin at seq 1 fails,
    naming the records missing, unless logrotate's retention removed them (the files are numbered,
    and the logrotate file says how many it keeps) or --since-seq allows it. Exit 0 with the
    record count, 1 when anything is wrong. With --checkpoints FILE, every checkpoint of this log
    in FILE must name a record read, with its hash (2: FILE is malformed)."""
    cfg = _defaults(config_path)
    claims = _read_claims(checkpoints_file) if checkpoints_file else None
    live = cfg.access_log if access else cfg.audit_log
    paths = list(files) or rotated_set(live)
    if not paths:
        raise click.ClickException(f"no audit log found at {live} (give the daemon's --config FILE, or the log FILEs)")
    head, note = _head_of(cfg, paths) if not access and live else (None, "")
    if access:
        note = "; the access log keeps no head state: records cut off its end cannot be ruled out"
    try:
        history = History.of(paths, live if not files else None, logrotate_file)
        start = since_seq if since_seq is not None else history.accepted_start()
        lookup = Lookup(c.point.seq for c in claims or ())
        lines = read_lines(paths)
        verdict = verify_chain(lookup.watch(lines) if claims is not None else lines, head, start or 1)
    except (OSError, EOFError) as exc:
        click.echo(f"error: {printable(str(exc))}", err=True)
        sys.exit(1)
    if claims is None and not os.path.exists(JOURNAL_SOCKET):
        click.echo("note: journald is not running on this host, so no copy of these records left it: a "
                   "consistent rewrite of the log and its head state (by root) cannot be seen here", err=True)
    span = "" if verdict.first_seq is None else f" (seq {verdict.first_seq}..{verdict.last_seq})"
    if verdict.problems:
        for problem in verdict.problems:
            click.echo(printable(str(problem)))
            if problem.kind == "missing" and verdict.first_seq is not None:
                for hint in history.missing_hints(verdict.first_seq, given=bool(files)):
                    click.echo(f"  {printable(hint)}")
        kinds = collections.Counter(p.kind for p in verdict.problems)
        listed = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
        many = len(verdict.problems)
        click.echo(f"FAILED: {many} problem{'s' * (many > 1)} ({listed}); {verdict.count} records read{span}"
                   f"{'' if head is not None else note}")
        if claims is not None:
            _check_claims(claims, "mcpd-access" if access else "mcpd-audit", lookup, start or 1)
        sys.exit(1)
    begin = ""
    if since_seq is not None and verdict.first_seq not in (None, 1):
        begin = f"; history begins at seq {verdict.first_seq}, as --since-seq {since_seq} allows"
    elif start not in (None, 1) and verdict.first_seq not in (None, 1):
        begin = f"; {history.retention_words()}"
    old = f"; {verdict.unchained} older records before the chain began" if verdict.unchained else ""
    click.echo(f"OK: {verdict.count} records, chain whole{span}{begin}{old}{note}")
    if claims is not None and not _check_claims(claims, "mcpd-access" if access else "mcpd-audit", lookup,
                                                start or 1):
        sys.exit(1)


def _read_claims(path: str) -> list[Claim]:
    """The checkpoints of ``path`` (:func:`~mcpd.admin.audit.checkpoints.read_checkpoints`); exit 2
    naming the line when it is malformed, 1 when it cannot be read."""
    try:
        return read_checkpoints(path)
    except CheckpointFileError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:
        click.echo(f"error: {printable(path)}: {printable(exc.strerror or str(exc))}", err=True)
        sys.exit(1)


def _check_claims(claims: list[Claim], log: str, lookup: Lookup, start: int) -> bool:
    """Print how the log compares with the checkpoints of ``log`` in ``claims``; whether it matches all."""
    out = compare(claims, log, lookup, start)
    other = f"; {out.skipped} of other logs not checked" if out.skipped else ""
    older = f"; {out.older} before the history kept (seq {start}) not checked" if out.older else ""
    if out.failures:
        click.echo(out.failures[0])
        more = f" (and {len(out.failures) - 1} more)" if len(out.failures) > 1 else ""
        click.echo(f"FAILED: checkpoints: the log does not match {len(out.failures)} of the checkpoints of {log}"
                   f"{more}; {out.checked} match{other}{older}")
        return False
    if not out.checked:
        click.echo(f"FAILED: checkpoints: none of {log} to check{other}{older}")
        return False
    tail = lookup.last_seq - out.last
    after = f"; the {tail} records after it have no checkpoint yet" if tail > 0 else ""
    click.echo(f"OK: checkpoints: {out.checked} of {log} match the log, the last covering seq {out.last}"
               f"{after}{other}{older}")
    return True


def _head_of(cfg: Any, paths: list[str]) -> tuple[Head | None, str]:
    """The audit log writer's head state (``helper_state_dir``), when ``paths`` end with the
    configured audit log, and what to add to the verdict about it."""
    live = os.path.abspath(cfg.audit_log)
    if os.path.abspath(paths[-1]) != live:
        return None, ""
    unknown = "a cut-off end cannot be ruled out"
    try:
        head = read_head_at(cfg.helper_state_dir)
    except (OSError, ValueError) as exc:
        return None, f"; its writer's head state is unreadable ({printable(str(exc))}): {unknown}"
    if head is None:
        return None, f"; no head state of its writer in {printable(cfg.helper_state_dir)}: {unknown}"
    if head.log != live:
        return None, f"; its writer's head state is for another log ({printable(head.log)}): {unknown}"
    return head, f"; its end is where its writer left it (seq {head.seq})"


#: the reasons of calls the grants themselves refused; any other refusal of a call with a path came
#: after the grants allowed it (``reauthentication required``, refused at open, not your worker)
GRANT_REFUSALS = frozenset({NO_GRANT, DENIED, SECRET})


def replay_diffs(policy: Any, lines: Any, flt: Filter, now: datetime.datetime | None = None,
                 order: Order | None = None) -> Iterator[tuple[dict[str, Any], Any]]:
    """Past privileged calls (``accept``/``reject`` records with a tool and a requested path) that
    ``policy`` at ``now`` would decide otherwise: served then and refused by the grants now, or
    refused by the grants then and allowed now; each with today's decision.

    Each call is judged as if its login were fresh now: replay compares what the grants cover,
    not when the caller last typed a password. So a call refused for anything but the grants
    (:data:`GRANT_REFUSALS`): only for freshness (``reauthentication required``), or at open
    although the grants allowed it (root's opener: a symlink in the path, several hard links),
    counts as covered by the grants then; and a call refused then that would be refused now is no
    difference, whatever the reasons. Calls
    refused before any grant was looked at (invalid token, unknown tool, malformed path) are
    skipped.
    """
    now = now or utcnow()
    groups: dict[str, frozenset[str]] = {}
    for line, rec in records(lines):
        if order is not None:
            order.see(line.where.rsplit(":", 1)[0], rec)
        if rec.get("event") not in ("accept", "reject") or rec.get("tool") not in TOOLS:
            continue
        if not rec.get("os_user") or not isinstance(rec.get("requested_path"), str) or not flt.match(rec):
            continue
        if rec["event"] == "reject" and rec.get("resolved_path") is None:
            continue
        user = rec["os_user"]
        member = groups.setdefault(user, os_groups(user))
        served = rec["event"] == "accept"
        covered = served or rec.get("decision") == REFUSED_AT_OPEN or rec.get("reason") not in GRANT_REFUSALS
        today = decide(policy, user, member, rec["tool"], rec["requested_path"], now, login_time=now)
        if today.allowed != covered and (served or today.allowed):
            yield rec, today


def _then(rec: dict[str, Any]) -> str:
    if rec["event"] == "accept":
        return "allowed"
    return f"refused ({printable(str(rec.get('reason') or '-'))})"


@audit.command()
@_since
@click.option("--user", default=None, help="Only this principal or OS account")
@click.option("--log", "log_files", multiple=True, type=click.Path(dir_okay=False),
              help="Audit log file(s), oldest first (default: the audit log and its rotated files)")
@_file_option
@_config_option
@_any_owner_option
def replay(since: datetime.datetime | None, user: str | None, log_files: tuple[str, ...], grants_file: str | None,
           config_path: str | None, any_owner: bool) -> None:
    """Re-decide past privileged calls against today's grants; list those that would now differ."""
    policy = _load(grants_file, config_path, any_owner)
    paths = list(log_files) or rotated_set(_defaults(config_path).audit_log)
    flt = Filter(user=user, since=since)
    found = 0
    order = Order()
    try:
        for rec, today in replay_diffs(policy, read_lines(paths), flt, order=order):
            found += 1
            now = "allowed" if today.allowed else "refused"
            click.echo(f"{human(rec)}\n    was {_then(rec)}, now {now}: {printable(today.reason)}; "
                       f"rule: {printable(today.rule or '(no grant)')}{'; ' + printable(today.note) if today.note else ''}")
    except (OSError, EOFError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(f"{found} past privileged call{'s' * (found != 1)} would be decided differently today")
    if (warning := order.warning("the audit log")) is not None:
        click.echo(warning, err=True)


@click.command("at")
@click.argument("when_text", metavar="TIME")
@click.option("--log", "log_files", multiple=True, type=click.Path(dir_okay=False),
              help="Audit log file(s), oldest first (default: the audit log and its rotated files)")
@click.option("--changes", "show_changes", is_flag=True, help="Also list what that load changed")
@_config_option
def grants_at(when_text: str, log_files: tuple[str, ...], show_changes: bool, config_path: str | None) -> None:
    """Print the grants file in force at TIME (ISO 8601 UTC, or 90s, 15m, 2h, 3d ago), rebuilt from
    the audit log: the text of the last load at or before TIME (every start and reload records the
    whole file, its SHA-256 and every change), exactly as loaded on standard output (its line
    numbers are the ones the records name), and on standard error comment lines saying when it was
    loaded and until when it stayed in force. Exit 1 when the log holds no whole load before TIME.
    The fixed deny of the daemon's own secrets comes from mcpd.yaml, not this file."""
    try:
        when = parse_time(when_text)
    except ValueError:
        raise click.BadParameter("an ISO 8601 time (2026-12-01T06:00Z) or a span back (90s, 15m, 2h, 3d)",
                                 param_hint="TIME") from None
    paths = list(log_files) or rotated_set(_defaults(config_path).audit_log)
    in_force: Load | None = None
    until: Load | None = None
    oldest: Load | None = None
    try:
        for load in loads(read_lines(paths)):
            if load.time is None:
                continue
            oldest = oldest or load
            if load.time <= when:
                in_force = load
            elif until is None:
                until = load
                break
    except (OSError, EOFError) as exc:
        click.echo(f"error: {printable(str(exc))}", err=True)
        sys.exit(1)
    if in_force is None:
        since = f" (the oldest load recorded is at {oldest.time:%Y-%m-%dT%H:%M:%SZ})" if oldest and oldest.time else ""
        click.echo(f"error: no load of the grants file at or before {when:%Y-%m-%dT%H:%M:%SZ} in "
                   f"{printable(', '.join(paths) or '(no audit log)')}{since}", err=True)
        sys.exit(1)
    if in_force.problem is not None:
        click.echo(f"error: the load in force then ({printable(in_force.where)}) is not whole: {in_force.problem}",
                   err=True)
        sys.exit(1)
    assert in_force.time is not None
    end = f"until {until.time:%Y-%m-%dT%H:%M:%SZ}" if until is not None and until.time else "still the last load recorded"
    click.echo(f"# {printable(in_force.grants_file)} in force at {when:%Y-%m-%dT%H:%M:%SZ}: "
               f"loaded {in_force.time:%Y-%m-%dT%H:%M:%SZ} (seq {in_force.first}, {printable(in_force.where)}), {end}",
               err=True)
    click.echo(f"# sha256 {in_force.sha256} (the text on standard output matches it); {len(in_force.changes)} "
               "changes at that load", err=True)
    if show_changes:
        for change in in_force.changes:
            click.echo(f"#   {change}", err=True)  # (written escaped)
    click.echo(in_force.text, nl=not in_force.text.endswith("\n") and bool(in_force.text))
