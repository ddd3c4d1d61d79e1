"""``linuxctl tools`` (the server's tool list) and ``linuxctl call`` (any tool, with arguments
given as one JSON object and ``--arg key=value`` pairs), printed as the server answered.
"""

from __future__ import annotations

import json
from typing import Any

import click

from mcpd.client.api import tool_failure
from mcpd.client.config import Settings
from mcpd.client.linuxctl.calls import fail, run


@click.command("tools")
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


@click.command("call")
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
