"""``linuxctl grep``: ``files/grep`` printed like ``grep -rn`` (``path:line:text``), with grep's exit status.

Exit 0 when a line was selected, 1 when none was, 2 on any error (a usage error, a tool error, a
refused token, an unreachable server: its ``CODE: message`` on stderr), as grep(1) does. The
lines are escaped (:func:`mcpd.common.printable.printable`; a line's tabs and backslashes stay as
grep prints them): a file's text cannot drive the terminal. When the server stops at its match or answer limit, the next page is asked for with
its cursor, until ``--max-count`` lines are printed or nothing is left; when it stops at its
time or byte limit, that is said on stderr with the cursor, and the exit status follows the
lines printed.
"""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import click

from mcpd.client.api import Client
from mcpd.client.config import Settings
from mcpd.client.errors import MCPClientError
from mcpd.client.linuxctl.calls import run
from mcpd.client.linuxctl.files import utf8_text
from mcpd.client.linuxctl.output import write_out
from mcpd.common.greplines import grep_lines
from mcpd.common.printable import printable

PAGE = 1000  # the tool's largest max_matches


@click.command("grep", context_settings={"ignore_unknown_options": False})
@click.argument("pattern", callback=utf8_text)
@click.argument("path", callback=utf8_text)
@click.option("-r", "--recursive", is_flag=True, help="Search the folder PATH and every folder below it")
@click.option("-i", "--ignore-case", is_flag=True, help="Ignore case")
@click.option("-w", "--word-regexp", "word", is_flag=True, help="Match whole words only")
@click.option("-v", "--invert-match", "invert", is_flag=True, help="Select the lines that do not match")
@click.option("-F", "--fixed-strings", "fixed", is_flag=True, help="PATTERN is a string, not a regular expression")
@click.option("-C", "--context", type=click.IntRange(0, 10), default=0, help="Lines of context around each line")
@click.option("--include", multiple=True, callback=lambda c, p, v: [utf8_text(c, p, x) for x in v],
              help="Search only files whose name matches this glob (repeatable)")
@click.option("--exclude", multiple=True, callback=lambda c, p, v: [utf8_text(c, p, x) for x in v],
              help="Skip files whose name matches this glob (repeatable)")
@click.option("-m", "--max-count", type=click.IntRange(min=1), help="Stop after this many selected lines")
@click.option("--time-budget", type=click.FloatRange(min=0.1, max=60), help="Seconds the server may search")
@click.option("--privileged", is_flag=True, help="Search through a sudo-style grant (mcp-sudo.yaml)")
@click.pass_obj
def grep(settings: Settings, pattern: str, path: str, recursive: bool, ignore_case: bool, word: bool, invert: bool,
         fixed: bool, context: int, include: list[str], exclude: list[str], max_count: int | None,
         time_budget: float | None, privileged: bool) -> None:
    """Print the lines of PATH (a file, or with -r a folder) that match PATTERN (RE2 syntax).

    Without -r a folder's own files are searched, not its subfolders. .gz, .xz, .bz2 and .zst
    files are searched decompressed; binary files are skipped (the count goes to stderr).
    """
    args: dict[str, Any] = {"pattern": pattern, "path": path, "ignore_case": ignore_case, "word": word,
                            "invert": invert, "fixed_string": fixed, "context": context, "privileged": privileged}
    if not recursive:
        args["max_depth"] = 1
    for key, value in (("include", include), ("exclude", exclude), ("time_budget_seconds", time_budget)):
        if value:
            args[key] = list(value) if isinstance(value, list) else value
    wait = max(settings.timeout, (time_budget or 10.0) + 15.0)

    async def pages(client: Client) -> tuple[int, list[str]]:
        printed, notes, cursor = 0, [], None
        while True:
            want = PAGE if max_count is None else min(PAGE, max_count - printed)
            page = dict(args, max_matches=want, **({"cursor": cursor} if cursor else {}))
            data = (await client.call_tool("files/grep", page, timeout=wait)).get("structuredContent") or {}
            matches = [m for m in data.get("matches") or [] if isinstance(m, dict)]
            lines = grep_lines(matches, printable, lambda text: printable(text, line=True))
            if lines:
                write_out(("\n".join(lines) + "\n").encode("utf-8"))
            printed += len(matches)
            skipped = data.get("files_skipped") or {}
            if skipped:
                notes.append(printable("linuxctl grep: skipped " + ", ".join(f"{v} {k}" for k, v in skipped.items())))
            cursor, stopped = data.get("next_cursor"), data.get("stopped")
            if not cursor or (max_count is not None and printed >= max_count):
                return printed, notes
            if stopped not in ("max_matches", "answer_size"):
                notes.append(printable(f"linuxctl grep: stopped early ({stopped}); the rest: "
                                       f"linuxctl call files/grep {json.dumps(dict(args, cursor=cursor))}"))
                return printed, notes

    printed, notes = run(settings, pages, on_error=_fail)
    for note in notes:
        click.echo(note, err=True)
    sys.exit(0 if printed else 1)


def _fail(exc: MCPClientError) -> NoReturn:
    click.echo(printable(f"linuxctl grep: {exc.code}: {exc.message}"), err=True)
    sys.exit(2)
