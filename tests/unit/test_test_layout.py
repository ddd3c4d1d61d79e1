"""The test tree's own rules: no test module imports another (shared code lives in
``tests/support/``), and no top-level folder besides the product's, ``docs/``, ``scripts/`` and
``.ci/``."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOP_LEVEL = {"mcpd", "etc", "systemd", "certs", "tests", "docs", "scripts", ".ci"}


def test_no_test_module_imports_another() -> None:
    """An import of ``tests.<anything>.test_*`` (or a relative ``test_*``) from any module under
    ``tests/`` is a finding."""
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(part.startswith("test_") for name in names for part in name.split(".")):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found


def test_no_top_level_folder_but_the_known_ones() -> None:
    """The top level holds the product's folders, the docs, the scripts and CI only (build
    output and virtual environments, which git ignores, aside)."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=False).stdout
    if not tracked:  # not a git checkout (an unpacked sdist): nothing to check
        return
    folders = {line.split("/", 1)[0] for line in tracked.splitlines() if "/" in line}
    assert folders <= TOP_LEVEL, sorted(folders - TOP_LEVEL)
