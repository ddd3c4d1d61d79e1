"""``linuxctl``: the command-line client of mcpd (its commands, exit statuses, settings and
output rules: docs/REFERENCE.md §6).

This module holds the ``linuxctl`` group and its connection options (``--url``, ``--token``,
``--token-file``, ``--cacert``, ``--context``, ``--timeout``, ``--transport``), which become the
:class:`~mcpd.client.config.Settings` every command receives, and registers the commands, which
live by family: :mod:`.files` (get, list, find, read), :mod:`.tools` (tools, call) and
:mod:`.credentials` (login, logout, contexts). Running a call and its errors are :mod:`.calls`';
what reaches the terminal, escaped, is :mod:`.output`'s.
"""

from __future__ import annotations

from typing import Any

import click

from mcpd.client.api import TRANSPORTS
from mcpd.client.config import Settings
from mcpd.client.linuxctl import credentials, files, grep, tools

HELP = """Read files on an mcpd server: whole files, ranges, listings, searches.

\b
Where the server, token and CA come from, first match wins:
  --url / --token / --cacert flags
  with --context NAME (or MCPD_CONTEXT): that context of the config file
  MCPD_URL / MCP_TOKEN / MCPD_CACERT
  without --context: the config file's current-context
  the config file's top-level url / token / cacert
  and for the token last: the context's token from `linuxctl login --oidc` (for its server only)

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


main.add_command(files.get)
main.add_command(files.list_group)
main.add_command(files.find_group)
main.add_command(files.read_uri)
main.add_command(grep.grep)
main.add_command(tools.tools)
main.add_command(tools.call)
main.add_command(credentials.login_cmd)
main.add_command(credentials.logout_cmd)
main.add_command(credentials.approve_cmd)
main.add_command(credentials.contexts_cmd)
