"""Golden tests of grants policies, like sudo's ``testsudoers`` (SPEC §4.1–4.3, §4.5).

Each folder of ``tests/unit/golden/`` holds ``policy.yaml``, ``requests.txt`` (one request a line:
``user groups tool path [now]``, groups comma-separated or ``-``) and ``expected.txt``: either the
load errors or one decision line per request. An optional ``secrets.txt`` (one entry a line) is the
fixed deny of the daemon's own secrets (SPEC §4.5a), as ``secret_paths`` gives it. Regenerate after a deliberate change with
``UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_grants_golden.py`` and review the diff.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest

from mcpd.policy.grants import PolicyError, decide, parse_policy

GOLDEN = Path(__file__).parent / "golden"
DEFAULT_NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.timezone.utc)
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "policy.yaml").exists())


def run_case(folder: Path) -> str:
    """Load the folder's policy and judge its requests; the text ``expected.txt`` must equal."""
    try:
        secrets = (folder / "secrets.txt").read_text().split() if (folder / "secrets.txt").exists() else []
        policy = parse_policy((folder / "policy.yaml").read_text(), "policy.yaml", tuple(secrets))
    except PolicyError as exc:
        return "".join(f"error: {line}\n" for line in exc.errors)
    out: list[str] = []
    for raw in (folder / "requests.txt").read_text().splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        fields = raw.split()
        user, groups_text, tool, path = fields[:4]
        now = datetime.datetime.fromisoformat(fields[4]) if len(fields) > 4 else DEFAULT_NOW
        groups = frozenset() if groups_text == "-" else frozenset(groups_text.split(","))
        d = decide(policy, user, groups, tool, path, now)
        line = f"{raw}\n  => {'ALLOW' if d.allowed else 'DENY'} ({d.reason}) path={d.resolved_path} rule={d.rule}"
        if d.covers_root:
            line += " follow_symlinks"
        if d.note:
            line += f"\n     note: {d.note}"
        out.append(line + "\n")
    return "".join(out)


@pytest.mark.parametrize("case", CASES)
def test_grants_golden(case: str) -> None:
    folder = GOLDEN / case
    got = run_case(folder)
    expected_file = folder / "expected.txt"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        expected_file.write_text(got)
    assert got == expected_file.read_text()


def test_golden_cases_exist() -> None:
    assert len(CASES) >= 6
