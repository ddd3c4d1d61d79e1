"""The docs are true to the tree, and the repository stands on its own.

- docs/INTERNALS.md is exactly what ``scripts/modulemap.py`` makes of the tree today;
- every repository path a doc names (``mcpd/...``, ``tests/...``, ``docs/...``, ``scripts/...``,
  ``etc/...``, ``systemd/...``) exists; paths on an installed host (``/etc/mcpd/...``) are not
  repository paths;
- every section of docs/REFERENCE.md that something cites (``docs/REFERENCE.md §4.4, §5.1``)
  is a numbered heading there;
- nothing in the code, the tests, ``pyproject.toml`` or the docs cites a file outside the
  repository (the old behaviour contract's sections, its design notes, a sibling folder).
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Files outside the repository: the old behaviour contract (its sections or its name), its design
# notes (any revision), a sibling folder. Written in pieces so that this file does not match.
OUTSIDE = re.compile("SPEC" + " §" + r"|\bSPEC\.md|DESIGN[\w-]*\.md|\.\./" + "shared")

# A repository-relative path: not part of a longer path or word (so /etc/mcpd/x is no match).
REPO_PATH = re.compile(r"(?<![\w/.~$-])((?:mcpd|tests|docs|scripts|etc|systemd)/[\w.*<>{}+/-]*)")


def docs() -> list[Path]:
    """Every file whose text is documentation: docs/, the top-level Markdown, etc/ and systemd/."""
    found = sorted((REPO / "docs").glob("*.md")) + sorted(REPO.glob("*.md"))
    for folder in ("etc", "systemd"):
        found += sorted(p for p in (REPO / folder).rglob("*") if p.is_file())
    return found


def named_paths(text: str) -> list[str]:
    """The repository paths ``text`` names, trailing punctuation cut."""
    paths = []
    for m in REPO_PATH.finditer(text):
        paths.append(m.group(1).rstrip(".,:;"))
    return paths


def exists(path: str) -> bool:
    """Whether ``path`` names a file or folder of the repository (``*`` and ``<name>`` as globs)."""
    pattern = re.sub(r"<[^>]*>|\{[^}]*\}", "*", path).rstrip("/")
    if "*" in pattern:
        return any(REPO.glob(pattern))
    return (REPO / pattern).exists()


def test_internals_is_the_generated_module_map() -> None:
    spec = importlib.util.spec_from_file_location("modulemap", REPO / "scripts" / "modulemap.py")
    assert spec and spec.loader
    modulemap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(modulemap)
    want = modulemap.generate()
    have = (REPO / "docs" / "INTERNALS.md").read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(have.splitlines(keepends=True), want.splitlines(keepends=True),
                                        "docs/INTERNALS.md", "scripts/modulemap.py"))
    assert have == want, "docs/INTERNALS.md is stale: run  python scripts/modulemap.py > docs/INTERNALS.md\n" + diff


def test_every_path_a_doc_names_exists() -> None:
    missing = []
    checked = 0
    for doc in docs():
        for lineno, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for path in named_paths(line):
                checked += 1
                if not exists(path):
                    missing.append(f"{doc.relative_to(REPO)}:{lineno}: {path}")
    assert checked > 100
    assert not missing, "paths named in the docs that the repository does not have:\n" + "\n".join(missing)


def test_outside_references_are_recognised() -> None:
    spec, design, shared = "SPEC" + " §", "DESIGN" + ".md", ".." + "/shared"
    old_name, old_notes = "SPEC" + ".md", "DESIGN" + "-v2.md"
    text = f"{spec}4.4, see {old_name} and {old_notes}, {design}; {shared}; docs/SPEC-NOTES.md"
    assert [m.group(0) for m in OUTSIDE.finditer(text)] == [spec, old_name, old_notes, design, shared]


def test_host_paths_are_not_repository_paths() -> None:
    assert named_paths("`/etc/mcpd/mcpd.yaml`, /usr/local/share/doc/mcpd/PRIVSEP.md, ~/docs/x") == []
    assert named_paths("see `docs/REFERENCE.md` and tests/unit/test_docs.py.") == [
        "docs/REFERENCE.md", "tests/unit/test_docs.py"]


def searched_files() -> list[Path]:
    """The code, the tests, ``pyproject.toml`` and the docs, as text files."""
    found = [REPO / "pyproject.toml", *sorted(REPO.glob("*.md")), *sorted((REPO / "docs").rglob("*.md"))]
    for folder in ("mcpd", "tests"):
        found += sorted(p for p in (REPO / folder).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    return found


# A citation of the reference: its name, then one or more section numbers (§4.4, §1.2–§1.5).
CITATION = re.compile(r"REFERENCE\.md,? (§ ?\d[\w.]*(?:(?:, | and |–|-| to )§ ?\d[\w.]*)*)")


def reference_sections() -> set[str]:
    """The numbers of docs/REFERENCE.md's headings (``1``, ``1.7``, ``4.5a``)."""
    text = (REPO / "docs" / "REFERENCE.md").read_text(encoding="utf-8")
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+[a-z]?)?)\.? ", text, re.MULTILINE))


def test_cited_reference_sections_exist() -> None:
    sections = reference_sections()
    assert {"1.7", "4.5a", "7.2"} <= sections
    unknown, cited = [], 0
    for path in searched_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in CITATION.finditer(line):
                for number in re.findall(r"§ ?(\d[\w.]*)", m.group(1)):
                    cited += 1
                    if number.rstrip(".") not in sections:
                        unknown.append(f"{path.relative_to(REPO)}:{lineno}: §{number}")
    assert cited > 50
    assert not unknown, "sections of docs/REFERENCE.md cited but not there:\n" + "\n".join(unknown)


def test_nothing_refers_outside_the_repository() -> None:
    hits = []
    for path in searched_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in OUTSIDE.finditer(line):
                hits.append(f"{path.relative_to(REPO)}:{lineno}: {m.group(0)}")
    assert not hits, (f"{len(hits)} references to files outside the repository (cite docs/REFERENCE.md §N.M "
                      "or docs/PRIVSEP.md instead):\n" + "\n".join(hits[:50]))


def test_install_systemd_ships_every_doc() -> None:
    """``mcpd install-systemd`` puts every document of docs/ beside the others on the host."""
    from mcpd.admin.install import PLACES

    shipped = {place.source for place in PLACES if place.target.startswith("usr/local/share/doc/mcpd/")}
    assert {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")} | {"README.md"} <= shipped
