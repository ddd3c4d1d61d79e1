"""Running the linuxctl client against a test daemon."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

LINUXCTL = str(Path(sys.executable).parent / "linuxctl")


def linuxctl(*args: str, env: dict[str, str] | None = None, home: Path | None = None,
             token_flag: bool = False) -> subprocess.CompletedProcess[bytes]:
    """Run the real `linuxctl` with a clean environment (no MCPD_* variables, empty config folder).
    A ``--token T`` pair among ``args`` is passed as ``MCP_TOKEN`` instead (a token on the command
    line shows in ps, and linuxctl warns about it), unless ``token_flag``."""
    args_list = list(args)
    if not token_flag and "--token" in args_list:
        i = args_list.index("--token")
        env = dict(env or {}, MCP_TOKEN=args_list[i + 1])
        del args_list[i:i + 2]
    args = tuple(args_list)
    base = {k: v for k, v in os.environ.items()
            if k not in ("MCPD_URL", "MCP_TOKEN", "MCPD_CACERT", "MCPD_CONTEXT", "MCPD_TRANSPORT")}
    base["XDG_CONFIG_HOME"] = str(home or Path("/nonexistent-linuxctl-config"))
    base.update(env or {})
    return subprocess.run([LINUXCTL, *args], capture_output=True, env=base, timeout=60)


def flags(daemon: Any, token: str | None = None) -> list[str]:
    """Connection options for ``daemon``, the token passed in a 0600 file (``--token-file``)."""
    token = token or daemon.token
    path = Path(daemon.state_dir) / f"linuxctl-token-{hashlib.sha256(token.encode()).hexdigest()[:16]}"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    return ["--url", daemon.url, "--token-file", str(path), "--cacert", str(daemon.cacert)]


def make_file(tmp_path: Path, name: str, data: bytes) -> Path:
    for p in (tmp_path, *tmp_path.parents):  # let a worker running as another account reach it
        if p == Path("/tmp") or p == Path("/"):
            break
        os.chmod(p, 0o755)
    path = tmp_path / name
    path.write_bytes(data)
    os.chmod(path, 0o644)
    return path
