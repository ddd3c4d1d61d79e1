"""``linuxctl``: the command-line client of mcpd.

    linuxctl get files PATH [--start-line N] [--end-line N] [--offset N] [--limit N] [--max-bytes N]
                            [--encoding E] [--privileged]
    linuxctl list files DIR [--limit N] [--json] [--privileged]
    linuxctl find files ROOT [--name GLOB] [--type T] [--max-depth N] [--max-results N]
                             [--time-budget S] [--progress] [--json | -0] [--privileged]
    linuxctl get filetype PATH [--json] [--privileged]
    linuxctl read URI [--start-line N] [--end-line N] [--encoding E] [--metadata] [--privileged]
    linuxctl tools [--json]
    linuxctl call TOOL ['{"json": "object"}'] [--arg key=value ...]
    linuxctl login [--user U] [--password-stdin]     # prints export MCP_TOKEN=...
    linuxctl logout                                  # revokes the login token in use
    linuxctl contexts                                # the config file's contexts

The server, token and CA come from flags, the environment and the config file with its contexts
(:mod:`mcpd.client.config`). ``--transport`` (``MCPD_TRANSPORT``): ``auto`` (default) speaks
Streamable HTTP at ``/mcp`` and falls back to ``/sse`` when the server has no ``/mcp``; ``http`` or
``sse`` forces one. Errors go to stderr as ``CODE: message``. Exit status: 0 ok, 1 tool error,
2 usage error, 3 authentication failure, 4 server unreachable or not trusted.

Readable output never prints text the server or a file's owner controls (names, paths, messages)
as it is: it goes through :func:`mcpd.common.printable.printable`, so a file name holding a
newline, a terminal escape or a bidirectional override is shown escaped and cannot forge lines.
``--json`` is JSON (which escapes control characters itself); ``find files -0`` writes the raw
bytes of each path, NUL-terminated, for scripts.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import click

from mcpd.client import pager
from mcpd.client.api import TRANSPORTS, Client, MCPClientError, text_of, tool_failure
from mcpd.client.config import Settings, config_path, load_config_file, resolve
from mcpd.common.listing import entry_line
from mcpd.common.printable import printable

T = TypeVar("T")


def fail(exc: MCPClientError) -> NoReturn:
    """Print ``CODE: message`` (escaped: it may name a path) on stderr and exit with the error's
    status (1 to 4)."""
    click.echo(printable(f"{exc.code}: {exc.message}"), err=True)
    sys.exit(exc.exit_code)


def run(settings: Settings, fn: Callable[[Client], Awaitable[T]]) -> T:
    """Connect with ``settings``, run ``await fn(client)`` and return its value; errors exit via :func:`fail`."""

    async def go() -> T:
        url, token, cacert = resolve(settings)
        async with Client(url, token, cacert, settings.timeout, transport=settings.transport) as client:
            return await fn(client)

    try:
        return asyncio.run(go())
    except MCPClientError as exc:
        fail(exc)


def write_out(data: bytes) -> None:
    """Write ``data`` to stdout exactly (no added newline); a closed pipe ends quietly."""
    out = sys.stdout.buffer
    try:
        out.write(data)
        out.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(0)


HELP = """Read files on an mcpd server: whole files, ranges, listings, searches.

\b
Where the server, token and CA come from, first match wins:
  --url / --token / --cacert flags
  with --context NAME (or MCPD_CONTEXT): that context of the config file
  MCPD_URL / MCP_TOKEN / MCPD_CACERT
  without --context: the config file's current-context
  the config file's top-level url / token / cacert

\b
The config file is ~/.config/linuxctl/config.yaml ($XDG_CONFIG_HOME/linuxctl/config.yaml),
one context per server, like kubectl's:
  current-context: prod
  contexts:
    prod:    {url: "https://files.example.com:9091", cacert: /etc/ssl/prod-ca.crt}
    staging: {url: "https://staging:9091", cacert: /etc/ssl/staging-ca.crt, token: mcpd_...}
A file holding a token must be readable by its owner only (chmod 600).

\b
Shell completion (bash; zsh and fish likewise with zsh_source / fish_source):
  eval "$(_LINUXCTL_COMPLETE=bash_source linuxctl)"

\b
Exit status: 0 ok, 1 tool error (its code on stderr, e.g. FILE_NOT_FOUND), 2 usage error,
3 authentication failure, 4 server unreachable or certificate not trusted.
"""

ENV_OPTIONS = {"url": "MCPD_URL", "token": "MCP_TOKEN", "cacert": "MCPD_CACERT"}


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, help=HELP)
@click.version_option(package_name="mcpd", prog_name="linuxctl", message="%(prog)s %(version)s")
@click.option("--url", envvar="MCPD_URL", help="Server base URL, e.g. https://127.0.0.1:9091 [MCPD_URL]")
@click.option("--token", envvar="MCP_TOKEN",
              help="Bearer token [MCP_TOKEN]; on the command line it shows in ps: prefer --token-file")
@click.option("--token-file", type=click.File("r"), default=None,
              help="Read the bearer token from this file, or from stdin with '-'")
@click.option("--cacert", envvar="MCPD_CACERT", help="PEM file of the CA to trust [MCPD_CACERT]")
@click.option("--context", "context_name", envvar="MCPD_CONTEXT", metavar="NAME",
              help="Use this context of the config file [MCPD_CONTEXT]")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds to wait for the server")
@click.option("--transport", envvar="MCPD_TRANSPORT", type=click.Choice(TRANSPORTS), default="auto",
              show_default=True,
              help="http: Streamable HTTP (/mcp); sse: the older HTTP+SSE (/sse); auto: http, else sse [MCPD_TRANSPORT]")
@click.pass_context
def main(ctx: click.Context, url: str | None, token: str | None, token_file: Any, cacert: str | None,
         context_name: str | None, timeout: float, transport: str) -> None:
    from_env = frozenset(name for name in ENV_OPTIONS
                         if ctx.get_parameter_source(name) == click.core.ParameterSource.ENVIRONMENT)
    if token_file is not None:
        if ctx.get_parameter_source("token") == click.core.ParameterSource.COMMANDLINE:
            raise click.UsageError("give --token or --token-file, not both")
        token = token_file.readline(4096).strip() or None
        from_env = from_env - {"token"}  # a file given on the command line is as explicit as a flag
        if token is None:
            raise click.UsageError("--token-file: no token in the first line")
    elif token and ctx.get_parameter_source("token") == click.core.ParameterSource.COMMANDLINE:
        click.echo("warning: --token on the command line is visible to other users in ps; "
                   "use --token-file, MCP_TOKEN or the config file", err=True)
    ctx.obj = Settings(url=url, token=token, cacert=cacert, timeout=timeout, context=context_name or None,
                       from_env=from_env, transport=transport)


@main.command("contexts")
def contexts_cmd() -> None:
    """List the config file's contexts (* marks current-context) with their URLs."""
    try:
        file = load_config_file(config_path())
    except MCPClientError as exc:
        fail(exc)
    if not file.contexts:
        click.echo(f"no contexts in {config_path()}", err=True)
        return
    for name in sorted(file.contexts):
        mark = "*" if name == file.current else " "
        click.echo(f"{mark} {name}\t{file.contexts[name].get('url', file.top.get('url', ''))}")


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
                                     "server is asked for paths as UTF-8 text, and cannot be asked for this one")
        raise click.BadParameter("holds a lone surrogate: the server is asked for paths as UTF-8 text") from None
    return value


@main.group()
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
@click.option("--encoding", default="utf-8", show_default=True,
              help="How the server decodes the file (utf-8, ascii, latin-1, cp1252, utf-16 or auto); "
                   "the output is still the file's own bytes")
@click.pass_obj
def get_files(settings: Settings, path: str, start_line: int | None, end_line: int | None,
              offset: int | None, limit: int | None, max_bytes: int, privileged: bool, encoding: str) -> None:
    """Print the file PATH byte for byte (no newline added), however long.

    The file is read in pages of 1 MiB up to the size it had when reading began, so a file that
    grows meanwhile still ends. With --offset/--limit only that byte range is printed; with
    --start-line/--end-line, those lines (one answer, so at most the server's response cap).
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
                                            privileged=privileged, max_bytes=max_bytes, on_progress=show):
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


def print_text(result: dict[str, Any]) -> None:
    """Print a listing-style result's text, escaped line by line, with exactly one final newline."""
    text = "\n".join(printable(line) for line in text_of(result).removesuffix("\n").split("\n"))
    write_out((text + "\n").encode("utf-8"))


def print_split(body: str, notes: list[str]) -> None:
    """Print ``body`` (the data lines, already escaped) on stdout and the ``notes`` (summaries,
    warnings, already escaped) on stderr."""
    if body:
        write_out((body if body.endswith("\n") else body + "\n").encode("utf-8"))
    for note in notes:
        click.echo(note, err=True)


def escaped_lines(text: str, fragments: list[str]) -> list[str]:
    """``text`` split into lines, each through :func:`printable`, where each of ``fragments`` (a
    path the server names, which may hold a newline) stays whole on its line: the fragments are
    set aside before the split and put back escaped."""
    keep = sorted({f for f in fragments if f and printable(f) != f}, key=len, reverse=True)
    for i, fragment in enumerate(keep):
        text = text.replace(fragment, f"\0{i}\0")  # no name holds a NUL: the marks are unambiguous
    lines = [printable(line) for line in text.split("\n")]
    for i, fragment in enumerate(keep):
        mark, shown = printable(f"\0{i}\0"), printable(fragment)
        lines = [line.replace(mark, shown) for line in lines]
    return lines


def raw_path(path: str) -> bytes:
    """The bytes of a path as the server's file system holds them (a name that is not UTF-8
    arrives with its bytes as lone surrogates, ``os.fsdecode``'s convention)."""
    try:
        return os.fsencode(path)
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogatepass")


def print_json(result: dict[str, Any], notes: list[str]) -> None:
    """Print the result's ``structuredContent`` as one JSON document; ``notes`` go to stderr."""
    click.echo(json.dumps(result.get("structuredContent"), indent=2, ensure_ascii=False))
    for note in notes:
        click.echo(note, err=True)


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


@main.group("list")
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


@main.group("find")
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


@main.command("read")
@click.argument("uri", callback=utf8_text)
@click.option("--start-line", type=click.IntRange(min=1), help="First line (1-based)")
@click.option("--end-line", type=click.IntRange(min=1), help="Last line (inclusive)")
@click.option("--encoding", help="utf-8 (default), ascii, latin-1, cp1252, utf-16 or auto")
@click.option("--metadata", is_flag=True, help="Print one JSON object: uri, mimeType, text, metadata")
@click.option("--privileged", is_flag=True, help="Read through a sudo-style grant (mcp-sudo.yaml)")
@click.pass_obj
def read_uri(settings: Settings, uri: str, start_line: int | None, end_line: int | None, encoding: str | None,
             metadata: bool, privileged: bool) -> None:
    """Read the resource URI (file:///abs/path or file:relative/path in the workspace).

    Prints the text exactly (no extra newline); with --metadata, one JSON object instead. Without
    a line range the server sends at most its first window (10 KiB by default): a longer file is
    printed up to there and the command exits 1 with TRUNCATED on stderr.
    """
    line_range = (start_line, end_line) if start_line is not None or end_line is not None else None
    item = run(settings, lambda c: c.read_resource(uri, encoding=encoding, include_metadata=metadata,
                                                   line_range=line_range, privileged=privileged))
    raw = item.get("text")
    text = raw if isinstance(raw, str) else ""
    cut = pager.NOTICE.search(text) if line_range is None else None
    if metadata:
        out = {"uri": item.get("uri"), "mimeType": item.get("mimeType"), "text": text,
               "metadata": item.get("_meta")}
        click.echo(json.dumps(out, indent=2, ensure_ascii=False))
    else:
        write_out(text[: cut.start()].encode("utf-8") if cut else text.encode("utf-8"))
    if cut:
        click.echo(f"TRUNCATED: the server sent only bytes {cut.group(1)}-{cut.group(2)} of the file: "
                   "`linuxctl get files PATH` prints it whole, --start-line/--end-line choose lines", err=True)
        sys.exit(1)


@main.command("tools")
@click.option("--json", "as_json", is_flag=True, help="Print the full tools/list answer as JSON")
@click.pass_obj
def tools(settings: Settings, as_json: bool) -> None:
    """List the server's tools (name and first line of the description)."""
    listed = run(settings, lambda c: c.list_tools())
    if as_json:
        click.echo(json.dumps(listed, indent=2, ensure_ascii=False))
        return
    for tool in listed:
        desc = str(tool.get("description") or "").strip().splitlines()
        click.echo(f"{tool.get('name')}\t{desc[0] if desc else ''}")


def parse_value(text: str) -> Any:
    """A ``--arg`` value: JSON when it parses (``5``, ``true``, ``[1]``), else the string itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def build_arguments(arguments_json: str | None, pairs: tuple[str, ...]) -> dict[str, Any]:
    """Merge the optional JSON object and ``key=value`` pairs (pairs win).

    Raises:
        click.UsageError: the JSON is not an object, or a pair has no ``=`` or an empty key (exit 2).
    """
    args: dict[str, Any] = {}
    if arguments_json is not None:
        try:
            parsed = json.loads(arguments_json)
        except ValueError as exc:
            raise click.UsageError(f"ARGUMENTS is not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise click.UsageError("ARGUMENTS must be a JSON object")
        args.update(parsed)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.UsageError(f"--arg expects key=value, got {pair!r}")
        args[key] = parse_value(value)
    return args


@main.command("call")
@click.argument("tool")
@click.argument("arguments_json", metavar="[ARGUMENTS]", required=False)
@click.option("--arg", "pairs", multiple=True, metavar="KEY=VALUE", help="One argument (repeatable)")
@click.pass_obj
def call(settings: Settings, tool: str, arguments_json: str | None, pairs: tuple[str, ...]) -> None:
    """Call TOOL and print its result as JSON; a tool error also prints CODE: message and exits 1."""
    args = build_arguments(arguments_json, pairs)
    result = run(settings, lambda c: c.call_tool(tool, args, check=False))
    click.echo(json.dumps(result, indent=2, ensure_ascii=False))
    if result.get("isError"):
        fail(tool_failure(result))



# --- login / logout (issue 5); the HTTP side is mcpd/client/login.py ----------------------------


@main.command("login")
@click.option("--user", "user", help="OS account to log in as [default: the current user]")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input (first line)")
@click.pass_obj
def login_cmd(settings: Settings, user: str | None, password_stdin: bool) -> None:
    """Log in with your OS password; prints `export MCP_TOKEN=...` (use: eval "$(linuxctl login)").

    The token expires (8 h by default) and is printed only, never written to disk by linuxctl.
    """
    import getpass

    from mcpd.client import login as login_client

    name = user or getpass.getuser()
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    elif not sys.stdin.isatty():
        raise click.UsageError("no terminal to ask for the password on: "
                               "give it on standard input with --password-stdin")
    else:
        password = getpass.getpass(f"password for {name}: ")
    try:
        url, cacert = _server(settings)
        answer = login_client.login(url, name, password, cacert, timeout=max(settings.timeout, 60.0))
    except MCPClientError as exc:
        fail(exc)
    click.echo(f"export MCP_TOKEN={answer['token']}")
    expires = datetime.datetime.fromtimestamp(int(answer.get("expires") or 0)).astimezone()
    click.echo(f"logged in as {answer.get('user')}; token expires {expires:%Y-%m-%d %H:%M:%S %Z}", err=True)


@main.command("logout")
@click.pass_obj
def logout_cmd(settings: Settings) -> None:
    """Revoke the login token in use (MCP_TOKEN, --token or the config file)."""
    from mcpd.client import login as login_client

    try:
        url, token, cacert = resolve(settings)
        login_client.logout(url, token, cacert, timeout=settings.timeout)
    except MCPClientError as exc:
        fail(exc)
    click.echo("logged out", err=True)


def _server(settings: Settings) -> tuple[str, str | None]:
    """``(url, cacert)`` from the flags, environment or config file (no token needed)."""
    url, _token, cacert = resolve(settings, need_token=False)
    return url, cacert


if __name__ == "__main__":  # pragma: no cover
    main()
