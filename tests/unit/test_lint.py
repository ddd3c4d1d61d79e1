"""The code follows the project's lint rules: ``ruff check`` with the configuration in ``pyproject.toml``
(``[tool.ruff]``) finds nothing in ``mcpd/``, ``tests/`` and ``scripts/``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).parent / "ruff"


def test_ruff_finds_nothing() -> None:
    """``ruff check`` exits 0 on the package, the tests and the scripts."""
    if not RUFF.exists():
        pytest.fail(f"{RUFF} missing: install the test extras (pip install -e '.[test]')")
    proc = subprocess.run([str(RUFF), "check", "--no-cache", "mcpd", "tests", "scripts"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_configuration_catches_a_finding(tmp_path: Path) -> None:
    """The check is not vacuous: an unused import and unsorted imports in a module are findings
    under the project's configuration."""
    if not RUFF.exists():
        pytest.fail(f"{RUFF} missing: install the test extras (pip install -e '.[test]')")
    bad = tmp_path / "mcpd" / "bad.py"
    bad.parent.mkdir()
    bad.write_text("import sys\nimport os\n\nprint(os.sep)\n", encoding="utf-8")
    proc = subprocess.run([str(RUFF), "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), str(bad)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0, proc.stdout
    assert "F401" in proc.stdout and "I001" in proc.stdout, proc.stdout
