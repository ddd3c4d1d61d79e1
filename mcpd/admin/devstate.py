"""What a ``mcpd dev`` run is and what it says about itself: the names it uses (the ``dev``
principal, its account as root, the service user), the records of what was made
(:class:`DevState` by :func:`mcpd.admin.devmode.prepare`, :class:`RootSetup` by
:func:`mcpd.admin.devroot.setup_root_state`), and the start-up lines printed from them.

Shared by :mod:`mcpd.admin.devmode`, :mod:`mcpd.admin.devroot` and
:mod:`mcpd.admin.devsupervisor`; it starts and changes nothing.
"""

from __future__ import annotations

import pwd
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

DEV_PRINCIPAL = "dev"
DEV_ACCOUNT = "mcpd-dev"  # as root, the unprivileged account the dev principal is bound to
SERVICE_USER = "mcpd"  # as root, the account the front runs as


class DevRootError(Exception):
    """An account could not be created, or the root helper did not start."""


@dataclass(frozen=True)
class DevState:
    """What :func:`mcpd.admin.devmode.prepare` made: absolute paths, the server URL and the fresh plain token."""

    state_dir: Path
    config_path: Path
    cacert: Path
    url: str
    token: str


@dataclass(frozen=True)
class RootSetup:
    """What :func:`mcpd.admin.devroot.setup_root_state` made (absolute paths)."""

    config_path: Path
    socket_path: Path
    helper_log: Path
    sample_file: Path
    service: pwd.struct_passwd
    dev_account: pwd.struct_passwd


def print_privileged(on: bool, state: DevState, out: TextIO) -> None:
    """Say whether privileged calls (``--privileged``) are on: as root, with the root helper, or off."""
    if on:
        out.write(f"# privileged calls: ON (running as root: the root helper decides them from "
                  f"{state.state_dir / 'mcp-sudo.yaml'}, and is restarted if it dies)\n")
    else:
        out.write("# privileged calls: OFF (not root: no root helper, so --privileged answers HELPER_UNAVAILABLE; "
                  "run `mcpd dev` as root to turn them on)\n")
    out.flush()


def print_exports(state: DevState, out: TextIO) -> None:
    """Print the three ``export`` lines and the one-line hint (the token is shown here only)."""
    out.write(f"export MCPD_URL={state.url}\n")
    out.write(f"export MCP_TOKEN={state.token}\n")
    out.write(f"export MCPD_CACERT={shlex.quote(str(state.cacert))}\n")
    out.write("# then try: linuxctl get files /etc/hosts\n")
    out.flush()


def print_routes(state: DevState, out: TextIO) -> None:
    """Print one line showing the ordinary and the privileged route to the example's sample file."""
    sample = state.state_dir / "root-only" / "secret.txt"
    out.write(f"# the dev token reads as OS account {DEV_ACCOUNT}; a root-only file shows both routes:\n"
              f"#   linuxctl get files {sample}               -> PERMISSION_DENIED\n"
              f"#   linuxctl get files --privileged {sample}  -> its content (grant in mcp-sudo.yaml, audited)\n")
    out.flush()
