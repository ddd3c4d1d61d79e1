"""``linuxctl``: the command-line client of mcpd (SPEC §6).

    linuxctl get files PATH [--start-line N] [--end-line N] [--offset N] [--limit N] [--privileged]
    linuxctl list files DIR [--limit N] [--privileged]
    linuxctl find files ROOT [--name GLOB] [--type T] [--max-depth N] [--max-results N]
                             [--time-budget S] [--progress] [--privileged]
    linuxctl get filetype PATH [--privileged]
    linuxctl read URI [--start-line N] [--end-line N] [--encoding E] [--metadata] [--privileged]
    linuxctl tools [--json]
    linuxctl call TOOL ['{"json": "object"}'] [--arg key=value ...]
    linuxctl login [--user U] [--password-stdin]     # prints export MCP_TOKEN=... (SPEC §5.2)
    linuxctl logout                                  # revokes the login token in use

The server, token and CA come from ``--url/--token/--cacert``, else ``MCPD_URL``/``MCP_TOKEN``/
``MCPD_CACERT``, else the config file ``$XDG_CONFIG_HOME/linuxctl/config.yaml`` (default
``~/.config/linuxctl/config.yaml``; keys ``url``, ``token``, ``cacert``; a file holding a token must
not be readable by group or others). ``--transport`` (``MCPD_TRANSPORT``): ``auto`` (default) speaks
Streamable HTTP at ``/mcp`` and falls back to ``/sse`` when the server has no ``/mcp``; ``http`` or
``sse`` forces one. Errors go to stderr as ``CODE: message``. Exit status: 0 ok,
1 tool error, 2 usage error, 3 authentication failure, 4 server unreachable or not trusted.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from mcpd.client.api import TRANSPORTS, Client, MCPClientError, UsageError, text_of, tool_failure
from mcpd.common.strictyaml import ConfigFileError, parse_strict_yaml

T = TypeVar("T")
CONFIG_KEYS = frozenset({"url", "token", "cacert"})


@dataclass
class Settings:
    """Connection settings as given on the command line or in the environment (may be incomplete)."""

    url: str | None
    token: str | None
    cacert: str | None
    timeout: float
    transport: str = "auto"


def config_path() -> Path:
    """The config file path: ``$XDG_CONFIG_HOME/linuxctl/config.yaml`` or ``~/.config/...``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "linuxctl" / "config.yaml"


def load_config_file(path: Path) -> dict[str, str]:
    """Read the optional config file (SPEC §6); a missing file is empty.

    Raises:
        UsageError: unreadable, not a mapping of the known string keys, or holding a token while
            readable by group/others.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from exc
    with os.fdopen(fd, encoding="utf-8") as f:
        mode = os.fstat(f.fileno()).st_mode
        try:
            data = parse_strict_yaml(f.read(), str(path))
        except (ConfigFileError, UnicodeDecodeError) as exc:
            raise UsageError(f"{path}: not valid YAML") from exc
    if data is None:
        return {}
    if not isinstance(data, dict) or set(data) - CONFIG_KEYS:
        raise UsageError(f"{path}: expected a mapping with only the keys url, token, cacert")
    if not all(isinstance(v, str) for v in data.values()):
        raise UsageError(f"{path}: url, token and cacert must be strings")
    if "token" in data and mode & 0o077:
        raise UsageError(f"{path}: holds a token but is readable by others (chmod 600 it)")
    return dict(data)


def resolve(settings: Settings) -> tuple[str, str, str | None]:
    """Fill missing settings from the config file; return ``(url, token, cacert)``.

    Raises:
        UsageError: no URL or no token anywhere.
    """
    url, token, cacert = settings.url, settings.token, settings.cacert
    if not (url and token and cacert):
        file = load_config_file(config_path())
        url, token, cacert = url or file.get("url"), token or file.get("token"), cacert or file.get("cacert")
    if not url:
        raise UsageError("no server URL: use --url, MCPD_URL or the config file")
    if not token:
        raise UsageError("no token: use --token, MCP_TOKEN or the config file")
    return url, token, cacert or None


def fail(exc: MCPClientError) -> NoReturn:
    """Print ``CODE: message`` on stderr and exit with the error's SPEC §6 status."""
    click.echo(f"{exc.code}: {exc.message}", err=True)
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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", envvar="MCPD_URL", help="Server base URL, e.g. https://127.0.0.1:9091 [MCPD_URL]")
@click.option("--token", envvar="MCP_TOKEN", help="Bearer token [MCP_TOKEN]")
@click.option("--cacert", envvar="MCPD_CACERT", help="PEM file of the CA to trust [MCPD_CACERT]")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds to wait for the server")
@click.option("--transport", envvar="MCPD_TRANSPORT", type=click.Choice(TRANSPORTS), default="auto",
              show_default=True,
              help="http: Streamable HTTP (/mcp); sse: the older HTTP+SSE (/sse); auto: http, else sse [MCPD_TRANSPORT]")
@click.pass_context
def main(ctx: click.Context, url: str | None, token: str | None, cacert: str | None, timeout: float,
         transport: str) -> None:
    """Read files on an mcpd server (SPEC §6)."""
    ctx.obj = Settings(url=url, token=token, cacert=cacert, timeout=timeout, transport=transport)


@main.group()
def get() -> None:
    """Fetch things from the server."""


@get.command("files")
@click.argument("path")
@click.option("--start-line", type=click.IntRange(min=1), help="First line (1-based)")
@click.option("--end-line", type=click.IntRange(min=1), help="Last line (inclusive)")
@click.option("--offset", type=click.IntRange(min=0), help="Byte offset")
@click.option("--limit", type=click.IntRange(min=1), help="Byte count")
@click.option("--privileged", is_flag=True, help="Read through a sudo-style grant (SPEC §4)")
@click.option("--encoding", help="Requested text encoding")
@click.pass_obj
def get_files(settings: Settings, path: str, start_line: int | None, end_line: int | None,
              offset: int | None, limit: int | None, privileged: bool, encoding: str | None) -> None:
    """Print the file PATH exactly as the files/read tool returns it (SPEC §3)."""
    args: dict[str, Any] = {"path": path}
    for key, value in (("start_line", start_line), ("end_line", end_line), ("offset", offset),
                       ("limit", limit), ("encoding", encoding)):
        if value is not None:
            args[key] = value
    if privileged:
        args["privileged"] = True
    result = run(settings, lambda c: c.call_tool("files/read", args))
    write_out(text_of(result).encode("utf-8"))


def print_text(result: dict[str, Any]) -> None:
    """Print a listing-style result's text with exactly one final newline."""
    text = text_of(result)
    write_out((text if text.endswith("\n") else text + "\n").encode("utf-8"))


@get.command("filetype")
@click.argument("path")
@click.option("--privileged", is_flag=True, help="Look through a sudo-style grant (SPEC §4)")
@click.pass_obj
def get_filetype(settings: Settings, path: str, privileged: bool) -> None:
    """Print what the files/filetype tool says about PATH (MIME type, encoding, line endings)."""
    args: dict[str, Any] = {"path": path, "privileged": privileged}
    print_text(run(settings, lambda c: c.call_tool("files/filetype", args)))


@main.group("list")
def list_group() -> None:
    """List things on the server."""


@list_group.command("files")
@click.argument("directory")
@click.option("--limit", type=click.IntRange(min=1), help="At most this many entries")
@click.option("--privileged", is_flag=True, help="List through a sudo-style grant (SPEC §4)")
@click.pass_obj
def list_files(settings: Settings, directory: str, limit: int | None, privileged: bool) -> None:
    """Print DIRECTORY's entries as the files/list tool returns them (hidden ones included)."""
    args: dict[str, Any] = {"path": directory, "privileged": privileged}
    if limit is not None:
        args["limit"] = limit
    print_text(run(settings, lambda c: c.call_tool("files/list", args)))


@main.group("find")
def find_group() -> None:
    """Search the server."""


@find_group.command("files")
@click.argument("root")
@click.option("--name", help="Glob on entry names (* ? [...])")
@click.option("--type", "kind", type=click.Choice(["file", "dir", "symlink", "fifo", "socket", "char", "block"]))
@click.option("--max-depth", type=click.IntRange(min=1), help="Levels below ROOT (1 = its own entries)")
@click.option("--max-results", type=click.IntRange(min=1, max=10000), help="Stop after this many matches")
@click.option("--time-budget", type=click.FloatRange(min=0.1, max=60), help="Seconds the search may take")
@click.option("--progress", is_flag=True, help="Show progress on stderr while the server walks")
@click.option("--privileged", is_flag=True, help="Search through a sudo-style grant (SPEC §4)")
@click.pass_obj
def find_files(settings: Settings, root: str, name: str | None, kind: str | None, max_depth: int | None,
               max_results: int | None, time_budget: float | None, progress: bool, privileged: bool) -> None:
    """Print the paths below ROOT that match, one per line, then a summary line."""
    args: dict[str, Any] = {"root": root, "privileged": privileged}
    for key, value in (("name", name), ("type", kind), ("max_depth", max_depth), ("max_results", max_results),
                       ("time_budget_seconds", time_budget)):
        if value is not None:
            args[key] = value
    wait = max(settings.timeout, (time_budget or 10.0) + 15.0)  # the server may use the whole budget

    def show(done: float, total: float | None, message: str | None) -> None:
        click.echo(f"progress: {message or int(done)}", err=True)

    print_text(run(settings, lambda c: c.call_tool("files/find", args, timeout=wait,
                                                   on_progress=show if progress else None)))


@main.command("read")
@click.argument("uri")
@click.option("--start-line", type=click.IntRange(min=1), help="First line (1-based)")
@click.option("--end-line", type=click.IntRange(min=1), help="Last line (inclusive)")
@click.option("--encoding", help="utf-8 (default), ascii, latin-1, cp1252, utf-16 or auto")
@click.option("--metadata", is_flag=True, help="Print one JSON object: uri, mimeType, text, metadata")
@click.option("--privileged", is_flag=True, help="Read through a sudo-style grant (SPEC §4)")
@click.pass_obj
def read_uri(settings: Settings, uri: str, start_line: int | None, end_line: int | None, encoding: str | None,
             metadata: bool, privileged: bool) -> None:
    """Read the resource URI (file:///abs/path or file:relative/path in the workspace).

    Prints the text exactly (no extra newline); with --metadata, one JSON object instead.
    """
    line_range = (start_line, end_line) if start_line is not None or end_line is not None else None
    item = run(settings, lambda c: c.read_resource(uri, encoding=encoding, include_metadata=metadata,
                                                   line_range=line_range, privileged=privileged))
    if metadata:
        out = {"uri": item.get("uri"), "mimeType": item.get("mimeType"), "text": item.get("text"),
               "metadata": item.get("_meta")}
        click.echo(json.dumps(out, indent=2, ensure_ascii=False))
        return
    text = item.get("text")
    write_out((text if isinstance(text, str) else "").encode("utf-8"))


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



# --- login / logout (SPEC §5.2, issue 5); code in mcpd/login_client.py ---------------------------


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
    else:
        password = getpass.getpass(f"password for {name}: ")
    try:
        url, cacert = _server(settings)
        answer = login_client.login(url, name, password, cacert, timeout=max(settings.timeout, 60.0))
    except MCPClientError as exc:
        fail(exc)
    click.echo(f"export MCP_TOKEN={answer['token']}")
    click.echo(f"logged in as {answer.get('user')}; token expires at UNIX time {int(answer.get('expires') or 0)}",
               err=True)


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
    """``(url, cacert)`` from the options, environment or config file (no token needed)."""
    url, cacert = settings.url, settings.cacert
    if not (url and cacert):
        file = load_config_file(config_path())
        url, cacert = url or file.get("url"), cacert or file.get("cacert")
    if not url:
        raise UsageError("no server URL: use --url, MCPD_URL or the config file")
    return url, cacert or None


if __name__ == "__main__":  # pragma: no cover
    main()
