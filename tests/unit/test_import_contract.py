"""The import contract: who may import whom.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``) and are checked by import-linter's
``lint-imports``, which follows chains as well as direct imports. In short: the root helper imports
only ``mcpd.helper`` (its own code and the wire layer ``mcpd.helper.wire``; never the policy, no
parser or web stack); the wire layer nothing of mcpd outside it; the policy process only
``mcpd.common`` and the wire layer; the walker of privileged list/find (``mcpd.walker``) only
``mcpd.common``, the wire layer (the opener among it), ``mcpd.core.walk`` and the grant matcher;
``core`` imports only ``common``; ``common`` imports none of the others;
``worker`` only ``common`` and ``core``; the front and the client never import root-side code, and the front loads no content parser
(libmagic, charset-normalizer) and no PAM, nor does the policy process load PAM;
``mcpd dev``'s modules import one way (devmode, devroot, devsupervisor, devstate and devstop);
and no import cycle anywhere: among the packages, or the modules or subpackages of one package
(an import inside a function counts; one under ``TYPE_CHECKING`` never runs and does not).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.modgraph import modgraph

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``lint-imports`` on the package and ``pyproject.toml`` found in ``cwd``."""
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} missing: install the test extras (pip install -e '.[test]')")
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
    )


def lint_with(tmp_path: Path, added: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on a copy of the package in ``tmp_path`` with ``added`` (path in the
    repository -> text) appended to those files (the copy comes first on sys.path: lint-imports
    adds its cwd)."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(REPO / "mcpd", tmp_path / "mcpd", ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in added.items():
        with open(tmp_path / path, "a", encoding="utf-8") as f:
            f.write(text)
    return lint_imports(tmp_path)


def test_import_contracts_are_kept() -> None:
    """Every contract in pyproject.toml is kept (lint-imports exits 0)."""
    proc = lint_imports(REPO)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_contract_that_keeps_out_root_code_keeps_out_all_of_it() -> None:
    """A contract naming one of root's own modules (``mcpd/helper/*.py``, the wire layer aside)
    names every one of them, so a module added to root is kept from the others too."""
    root_only = {f"mcpd.helper.{p.stem}" for p in (REPO / "mcpd/helper").glob("*.py")} - {
        "mcpd.helper.__init__", "mcpd.helper.__main__"}
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    for contract in contracts:
        forbidden = set(contract.get("forbidden_modules", ()))
        if forbidden & root_only:
            assert root_only <= forbidden, f"{contract['id']} misses {sorted(root_only - forbidden)}"


def test_import_contract_catches_a_forbidden_import(tmp_path: Path) -> None:
    """The check is not vacuous: the policy reaching the front, root reaching the policy, the walker reaching any policy
    module, or a core reader or libmagic reached through core.walk breaks it."""
    proc = lint_with(tmp_path, {"mcpd/policy/login.py": "\nimport mcpd.front.limits\n",
                                "mcpd/helper/monitor.py": "\nimport mcpd.policy.grants\n",
                                "mcpd/core/walk.py": "\nimport mcpd.core.textread\n",
                                "mcpd/walker/main.py": "\nimport mcpd.policy.grants\n"})
    assert proc.returncode != 0, proc.stdout
    assert "mcpd.policy.login -> mcpd.front.limits" in proc.stdout, proc.stdout
    assert "mcpd.helper.monitor -> mcpd.policy.grants" in proc.stdout, proc.stdout
    assert "mcpd.core.walk -> mcpd.core.textread" in proc.stdout, proc.stdout
    assert "mcpd.walker.main -> mcpd.policy.grants" in proc.stdout, proc.stdout
    assert "mcpd.core.walk is not allowed to import charset_normalizer" in proc.stdout, proc.stdout


def test_import_contract_catches_a_dev_mode_cycle(tmp_path: Path) -> None:
    """`mcpd dev`'s modules import one way: devroot importing devmode back (a cycle) breaks it."""
    proc = lint_with(tmp_path, {"mcpd/admin/devroot.py": "\nimport mcpd.admin.devmode\n"})
    assert proc.returncode != 0, proc.stdout
    assert "mcpd.admin.devroot is not allowed to import mcpd.admin.devmode" in proc.stdout, proc.stdout


def test_no_module_imports_itself_back_at_run_time() -> None:
    """No cycle among mcpd's modules as they run: imports inside functions count, those under
    ``TYPE_CHECKING`` do not; and every import the acyclic contract ignores is such a type-only
    one (so the contract ignores nothing that runs)."""
    graph = modgraph()
    mods = graph.load(REPO)
    runtime = {name: {target for target, _ in mod.runtime} for name, mod in mods.items()}
    assert graph.cycles(runtime) == []
    contract = next(c for c in tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
                    ["tool"]["importlinter"]["contracts"] if c["id"] == "acyclic")
    for line in contract["ignore_imports"]:
        importer, imported = (part.strip() for part in line.split("->"))
        assert imported in {t for t, _ in mods[importer].typing_only}, f"{line}: not a type-only import"
        assert imported not in runtime[importer], f"{line}: imported at run time too"


def test_import_contract_catches_a_cycle(tmp_path: Path) -> None:
    """A cycle breaks the acyclic contract: between two modules of the policy process through an
    import inside a function, and between two subpackages of the front."""
    proc = lint_with(tmp_path, {"mcpd/policy/grepcall.py": "\n\ndef _back() -> None:\n    import mcpd.policy.calls\n",
                                "mcpd/front/connections/handover.py": "\nimport mcpd.front.sessions.table\n"})
    assert proc.returncode != 0, proc.stdout
    assert "No cycles are allowed in mcpd.policy." in proc.stdout, proc.stdout
    assert "No cycles are allowed in mcpd.front." in proc.stdout, proc.stdout
    graph = modgraph()
    runtime = {name: {t for t, _ in mod.runtime} for name, mod in graph.load(tmp_path).items()}
    assert ["mcpd.policy.calls", "mcpd.policy.grepcall"] in graph.cycles(runtime)
