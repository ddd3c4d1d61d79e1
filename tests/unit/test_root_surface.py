"""The root surface: what the root helper loads, and how much of it is mcpd's own.

The helper's entry point is ``python -I -m mcpd.helper`` (console script ``mcpd-helper``), whose
``__main__`` calls :func:`mcpd.helper.main.main`. ``mcpd.helper.main`` imports at its top level
everything the root side ever runs, so a fresh isolated interpreter that imports it holds the
whole root surface in ``sys.modules``: it must hold nothing of mcpd outside root's folder
``mcpd/helper/`` (root's code and the wire layer). The budget counts the code lines
(:mod:`tests.support.codelines`) of every module in that folder, loaded or not. The tests also fail when a
parser or web-stack package is loaded, or when a loaded mcpd module imports inside a function
something the count would miss.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from tests.support.codelines import code_lines, folder_code_lines

REPO = Path(__file__).resolve().parents[2]
ENTRY_MODULE = "mcpd.helper.main"
MAIN_FILE = ("mcpd.helper.__main__", "mcpd/helper/__main__.py")  # run by `python -m mcpd.helper`
FOLDER = REPO / "mcpd/helper"  # root's folder: root's code and the wire layer (mcpd/helper/wire/)
BUDGET = 800  # code lines of every module in root's folder
FORBIDDEN = frozenset({
    "click", "cryptography", "charset_normalizer", "magic", "starlette", "uvicorn", "httpx",
    "sse_starlette", "anyio", "re2", "zstandard",
})

# Runs in a fresh interpreter with -I: no PYTHONPATH, no user site, no current folder on sys.path.
PROBE = f"""
import json, sys
import {ENTRY_MODULE}
mods = sorted(sys.modules)
files = {{n: getattr(sys.modules[n], "__file__", None) for n in mods if n == "mcpd" or n.startswith("mcpd.")}}
print(json.dumps({{"modules": mods, "files": files}}))
"""


def is_mcpd(name: str) -> bool:
    return name == "mcpd" or name.startswith("mcpd.")


def helper_surface() -> tuple[list[str], dict[str, str]]:
    """(every module name, {mcpd module: its source file}) after importing the entry module."""
    proc = subprocess.run(
        [sys.executable, "-I", "-c", PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, f"importing {ENTRY_MODULE} failed:\n{proc.stderr[-3000:]}"
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    files = {name: path for name, path in data["files"].items() if path}
    name, rel = MAIN_FILE
    files[name] = str(REPO / rel)
    return data["modules"], files


def lazy_imports(source: str) -> set[str]:
    """Modules imported inside a function body (absolute imports only; mcpd uses no others)."""
    found: set[str] = set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_code_line_counter() -> None:
    """Docstrings, comments, blank lines and indentation are not code; other strings are."""
    source = '''"""Module
docstring."""
import os  # a comment

# only a comment

class A:
    """Class docstring."""

    def f(self) -> str:
        """Function
        docstring."""
        return """a string
that is code"""


def g(): """one line: the def counts"""
'''
    assert code_lines(source) == 6  # import, class A, def f, the return and its string (2), def g


def folder_counts() -> dict[str, int]:
    """{path in the repository: code lines} of every module in root's folder, printed as a table."""
    counts = folder_code_lines(FOLDER, REPO)
    width = max(len(name) for name in counts)
    for name, count in counts.items():
        print(f"{name:<{width}} {count:5d}")
    print(f"{'total (' + str(len(counts)) + ' modules)':<{width}} {sum(counts.values()):5d}  budget {BUDGET}")
    return counts


def test_root_surface_loads_no_parser_or_web_stack_and_hides_no_import() -> None:
    """No parser or web stack is loaded as root, and no mcpd module the root side loads imports
    inside a function something the line count would miss."""
    modules, files = helper_surface()
    loaded = {m.split(".")[0] for m in modules}
    assert not loaded & FORBIDDEN, f"loaded as root: {sorted(loaded & FORBIDDEN)}"
    missed: list[str] = []
    for name, path in files.items():
        for target in lazy_imports(Path(path).read_text(encoding="utf-8")):
            top = target.split(".")[0]
            if top in FORBIDDEN or (is_mcpd(target) and target not in modules and target.rsplit(".", 1)[0] not in modules):
                missed.append(f"{name} imports {target} inside a function")
    assert not missed, "imports the count cannot see (import them at the top of the module):\n" + "\n".join(missed)


def test_root_loads_nothing_of_mcpd_outside_its_folder() -> None:
    """Every mcpd module root loads is a file in ``mcpd/helper/`` (so the budget counts it), but
    the package ``mcpd`` itself, which holds no code."""
    modules, files = helper_surface()
    outside = [name for name, path in files.items() if name != "mcpd" and not Path(path).resolve().is_relative_to(FOLDER)]
    assert not outside, f"loaded as root from outside {FOLDER}: {outside}"
    assert "mcpd.helper.wire.frames" in modules and code_lines(Path(files["mcpd"]).read_text(encoding="utf-8")) == 0


def test_root_folder_within_budget() -> None:
    """Root's folder (root's code and the wire layer) holds at most BUDGET code lines; everything
    else runs in the policy process or the other unprivileged ones."""
    total = sum(folder_counts().values())
    assert total <= BUDGET, f"{total} code lines in mcpd/helper/, budget {BUDGET}"


def test_root_never_loads_the_policy_the_front_or_the_content_readers() -> None:
    """Tokens, grants, logins, the audit writer, the front and the reading core stay out of root."""
    modules = set(helper_surface()[0])
    for name in ("mcpd.policy", "mcpd.policy.grants", "mcpd.policy.login", "mcpd.common.audit",
                 "mcpd.common.identity", "mcpd.common.config", "mcpd.front", "mcpd.core", "mcpd.worker"):
        assert name not in modules, f"{name} is loaded as root"
