"""``linuxctl``'s file commands: ``get files``, ``get filetype``, ``list files``, ``find files``
and ``read``; each is one tool call (``get files`` a series of pages, :mod:`mcpd.client.pager`)
whose result :mod:`.output` prints. Their paths, URIs and patterns must be UTF-8 text
(:func:`utf8_text`).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from mcpd.client import pager
from mcpd.client.api import Client, text_of
from mcpd.client.config import Settings
from mcpd.client.linuxctl.calls import run
from mcpd.client.linuxctl.output import escaped_lines, print_json, print_split, print_text, raw_path, write_out
from mcpd.common.listing import entry_line
from mcpd.common.printable import printable


def utf8_text(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback for arguments sent to the server (paths, URIs, patterns): JSON carries
    Unicode text only, so an argument that is not valid UTF-8 (the shell passed raw bytes, such
    as a name in Latin-1) is a usage error (exit 2) naming the first bad byte, not a traceback."""
    if value is None:
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raw = os.fsencode(value)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise click.BadParameter(f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}): the "
                                     "server is asked for paths as UTF-8 text, and cannot be asked for this one") from None
        raise click.BadParameter("holds a lone surrogate: the server is asked for paths as UTF-8 text") from None
    return value


@click.group()
def get() -> None:
    """Fetch things from the server."""


@get.command("files")
@click.argument("path", callback=utf8_text)
@click.option("--start-line", type=click.IntRange(min=1), help="First line (1-based)")
@click.option("--end-line", type=click.IntRange(min=1), help="Last line (inclusive)")
@click.option("--offset", type=click.IntRange(min=0), help="Byte offset to start at")
@click.option("--limit", type=click.IntRange(min=1), help="Bytes to print from --offset")
@click.option("--max-bytes", type=click.IntRange(min=1), default=pager.DEFAULT_MAX_BYTES, show_default=True,
              help="Refuse (exit 1) a file or range larger than this many bytes")
@click.option("--privileged", is_flag=True, help="Read through a sudo-style grant (mcp-sudo.yaml)")
@click.option("--decompress", is_flag=True, help="Print a .gz/.xz/.bz2/.zst file's decompressed text (as zcat)")
@click.option("--encoding", default="utf-8", show_default=True,
              help="How the server decodes the file (utf-8, ascii, latin-1, cp1252, utf-16 or auto); "
                   "the output is still the file's own bytes")
@click.pass_obj
def get_files(settings: Settings, path: str, start_line: int | None, end_line: int | None,
              offset: int | None, limit: int | None, max_bytes: int, privileged: bool, decompress: bool,
              encoding: str) -> None:
    """Print the file PATH byte for byte (no newline added), however long, binary or text.

    The file is read in pages of 1 MiB up to the size it had when reading began, so a file that
    grows meanwhile still ends. A file that is not text in --encoding (a binary, a Latin-1 file
    read as UTF-8) is read on as bytes (base64 pages), and a .gz/.xz/.bz2/.zst file is copied as
    its own bytes (--decompress: its decompressed text, --offset/--limit counting in it). With
    --offset/--limit only that byte range is printed; with
    --start-line/--end-line, those lines of the text (one answer, so at most the server's
    response cap; a compressed file's decompressed text).
    Progress goes to stderr when stderr is a terminal and the file is over 8 MiB.
    """
    if start_line is not None or end_line is not None:
        args: dict[str, Any] = {"path": path, "encoding": encoding}
        for key, value in (("start_line", start_line), ("end_line", end_line)):
            if value is not None:
                args[key] = value
        if privileged:
            args["privileged"] = True
        result = run(settings, lambda c: c.call_tool("files/read", args))
        write_out(text_of(result).encode("utf-8"))
        return
    show = _progress_printer() if sys.stderr.isatty() else None

    async def copy(client: Client) -> None:
        async for chunk in pager.read_pages(client, path, offset=offset or 0, limit=limit, encoding=encoding,
                                            privileged=privileged, max_bytes=max_bytes, on_progress=show,
                                            decompress=decompress):
            write_out(chunk)

    run(settings, copy)


def _progress_printer() -> Callable[[int, int], None]:
    """A progress line on stderr, rewritten in place, for a copy over 8 MiB (or of unknown size
    once it passes 8 MiB)."""
    shown = [False]

    def show(done: int, total: int) -> None:
        if not shown[0] and max(total, done) <= pager.PROGRESS_BYTES:
            return
        shown[0] = True
        pct = f" ({100 * done // total}%)" if total else ""
        click.echo(f"\r{done} of {total or '?'} bytes{pct}", err=True, nl=False)
        if total and done >= total:
            click.echo("", err=True)

    return show


@get.command("filetype")
@click.argument("path", callback=utf8_text)
@click.option("--privileged", is_flag=True, help="Look through a sudo-style grant (mcp-sudo.yaml)")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as one JSON object")
@click.pass_obj
def get_filetype(settings: Settings, path: str, privileged: bool, as_json: bool) -> None:
    """Print what the files/filetype tool says about PATH (MIME type, encoding, line endings)."""
    args: dict[str, Any] = {"path": path, "privileged": privileged}
    result = run(settings, lambda c: c.call_tool("files/filetype", args))
    if as_json:
        print_json(result, [])
    else:
        print_text(result)


@click.group("list")
def list_group() -> None:
    """List things on the server."""


@list_group.command("files")
@click.argument("directory", callback=utf8_text)
@click.option("--limit", type=click.IntRange(min=1), help="At most this many entries")
@click.option("--privileged", is_flag=True, help="List through a sudo-style grant (mcp-sudo.yaml)")
@click.option("--json", "as_json", is_flag=True, help="Print the listing as one JSON object")
@click.pass_obj
def list_files(settings: Settings, directory: str, limit: int | None, privileged: bool, as_json: bool) -> None:
    """Print DIRECTORY's entries, one per line (hidden ones included), like ``ls -l``; names,
    link targets and account names are escaped (a newline shows as \\x0a).

    The summary line (how many entries) and any note (entries left out by --limit) go to stderr.
    """
    args: dict[str, Any] = {"path": directory, "privileged": privileged}
    if limit is not None:
        args["limit"] = limit
    result = run(settings, lambda c: c.call_tool("files/list", args))
    data = result.get("structuredContent") or {}
    note = data.get("note")
    if as_json:
        print_json(result, [printable(f"[NOTE: {note}]")] if note else [])
        return
    text = text_of(result)
    path = str(data.get("path", ""))
    head_end = text.find("\n", len(path)) if text.startswith(path) else -1
    head_end = head_end if head_end >= 0 else len(text)
    head = text[:head_end]  # "PATH: N entries"; then ls -l lines, written here from the entries
    raw = data.get("entries")
    entries = [e for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []
    try:
        body = "\n".join(entry_line(e, printable) for e in entries)
    except KeyError:  # not the entries this client knows: the server's own lines, escaped
        body = "\n".join(escaped_lines(text[head_end + 1:], [str(e.get("name", "")) for e in entries]))
    note_line = printable(f"[NOTE: {note}]") if note else ""
    print_split(body, [printable(head)] + ([note_line] if note_line else []))


@click.group("find")
def find_group() -> None:
    """Search the server."""


@find_group.command("files")
@click.argument("root", callback=utf8_text)
@click.option("--name", callback=utf8_text, help="Glob on entry names (* ? [...])")
@click.option("--type", "kind", type=click.Choice(["file", "dir", "symlink", "fifo", "socket", "char", "block"]))
@click.option("--max-depth", type=click.IntRange(min=1), help="Levels below ROOT (1 = its own entries)")
@click.option("--max-results", type=click.IntRange(min=1, max=10000), help="Stop after this many matches")
@click.option("--time-budget", type=click.FloatRange(min=0.1, max=60), help="Seconds the search may take")
@click.option("--progress", is_flag=True, help="Show progress on stderr while the server walks")
@click.option("--privileged", is_flag=True, help="Search through a sudo-style grant (mcp-sudo.yaml)")
@click.option("--json", "as_json", is_flag=True, help="Print matches, counts and errors as one JSON object")
@click.option("-0", "--print0", "print0", is_flag=True,
              help="Print each path's raw bytes followed by a NUL, nothing else, like find -print0 (for xargs -0)")
@click.pass_obj
def find_files(settings: Settings, root: str, name: str | None, kind: str | None, max_depth: int | None,
               max_results: int | None, time_budget: float | None, progress: bool, privileged: bool,
               as_json: bool, print0: bool) -> None:
    """Print the paths below ROOT that match, one per line (folders end in /), escaped.

    The summary (matches, entries scanned), notes (stopped early) and unreadable folders go to
    stderr. A name holding a newline or another control character is shown escaped (\\x0a), so
    scripts should use -0: each path exactly as the file system has it, NUL-terminated.
    """
    if as_json and print0:
        raise click.UsageError("give --json or -0, not both")
    args: dict[str, Any] = {"root": root, "privileged": privileged}
    for key, value in (("name", name), ("type", kind), ("max_depth", max_depth), ("max_results", max_results),
                       ("time_budget_seconds", time_budget)):
        if value is not None:
            args[key] = value
    wait = max(settings.timeout, (time_budget or 10.0) + 15.0)  # the server may use the whole budget

    def show(done: float, total: float | None, message: str | None) -> None:
        click.echo(printable(f"progress: {message or int(done)}"), err=True)

    result = run(settings, lambda c: c.call_tool("files/find", args, timeout=wait,
                                                 on_progress=show if progress else None))
    data = result.get("structuredContent") or {}
    raw = data.get("matches")
    matches: list[dict[str, Any]] = [m for m in raw if isinstance(m, dict)] if isinstance(raw, list) else []
    paths = [str(m.get("path", "")) for m in matches]
    body = "\n".join(f"{p}/" if m.get("type") == "dir" else p for p, m in zip(paths, matches))
    text = text_of(result)
    tail = text[len(body):].removeprefix("\n") if text.startswith(body) else None
    raw_errors = data.get("errors")
    errors = [e for e in raw_errors if isinstance(e, dict)] if isinstance(raw_errors, list) else []
    fragments = [f"[ERROR: {e.get('path')}: {e.get('reason')}]" for e in errors] + [str(data.get("root", ""))]
    notes = [] if not tail else escaped_lines(tail, fragments)
    if as_json:
        print_json(result, notes)
    elif print0:
        write_out(b"".join(raw_path(p) + b"\0" for p in paths))
        print_split("", notes)
    elif tail is None:
        print_text(result)
    else:
        shown = "\n".join(printable(f"{p}/" if m.get("type") == "dir" else p) for p, m in zip(paths, matches))
        print_split(shown, notes)


@click.command("read")
@click.argument("uri", callback=utf8_text)
@click.option("--start-line", type=click.IntRange(min=1), help="First line (1-based)")
@click.option("--end-line", type=click.IntRange(min=1), help="Last line (inclusive)")
@click.option("--encoding", help="utf-8 (default), ascii, latin-1, cp1252, utf-16, auto or base64 (a blob)")
@click.option("--metadata", is_flag=True, help="Print one JSON object: uri, mimeType, text, metadata")
@click.option("--privileged", is_flag=True, help="Read through a sudo-style grant (mcp-sudo.yaml)")
@click.pass_obj
def read_uri(settings: Settings, uri: str, start_line: int | None, end_line: int | None, encoding: str | None,
             metadata: bool, privileged: bool) -> None:
    """Read the resource URI (file:///abs/path or file:relative/path in the workspace).

    Prints the text exactly (no extra newline), or a binary file's bytes (the server's blob);
    with --metadata, one JSON object instead (``blob`` in place of ``text``). Without
    a line range the server sends at most its first window (10 KiB by default): a longer file is
    printed up to there and the command exits 1 with TRUNCATED on stderr.
    """
    line_range = (start_line, end_line) if start_line is not None or end_line is not None else None
    item = run(settings, lambda c: c.read_resource(uri, encoding=encoding, include_metadata=metadata,
                                                   line_range=line_range, privileged=privileged))
    raw = item.get("text")
    text = raw if isinstance(raw, str) else ""
    blob = item.get("blob")
    if isinstance(blob, str) and not metadata:  # a file that is not text: its bytes
        try:
            write_out(base64.b64decode(blob, validate=True))
        except (binascii.Error, ValueError):
            raise click.ClickException("the server's blob is not base64") from None
        return
    cut = pager.NOTICE.search(text) if line_range is None else None
    if metadata:
        out = {"uri": item.get("uri"), "mimeType": item.get("mimeType"), "text": text,
               "metadata": item.get("_meta")}
        if isinstance(blob, str):
            out = {**{k: v for k, v in out.items() if k != "text"}, "blob": blob}
        click.echo(json.dumps(out, indent=2, ensure_ascii=False))
    else:
        write_out(text[: cut.start()].encode("utf-8") if cut else text.encode("utf-8"))
    if cut:
        click.echo(f"TRUNCATED: the server sent only bytes {cut.group(1)}-{cut.group(2)} of the file: "
                   "`linuxctl get files PATH` prints it whole, --start-line/--end-line choose lines", err=True)
        sys.exit(1)
