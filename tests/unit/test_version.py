"""`--version` on `mcpd` and `linuxctl`, and the server's and client's reported versions, all come from
the package metadata; pyproject.toml is the one place the version is written (issue 14)."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from mcpd.common.version import version

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_metadata_version_is_the_pyproject_one() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert importlib.metadata.version("mcpd") == declared == version()


@pytest.mark.parametrize("command", ["mcpd", "linuxctl"])
def test_version_option(command: str) -> None:
    res = subprocess.run([str(BIN / command), "--version"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"{command} {importlib.metadata.version('mcpd')}\n"


def test_version_written_nowhere_else() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    literal = re.compile(r"""["']""" + re.escape(declared) + r"""["']""")
    hits = [str(p.relative_to(ROOT)) for p in (ROOT / "mcpd").rglob("*.py") if literal.search(p.read_text())]
    assert hits == []
