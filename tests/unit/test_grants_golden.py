"""Golden tests of grants policies, like sudo's ``testsudoers`` (docs/REFERENCE.md §4.1–4.3, §4.5).

Each folder of ``tests/unit/golden/`` holds ``policy.yaml`` and one or both of:

* ``requests.txt`` (one request a line: ``user groups tool path [now] [login=AGE[,used]]``,
  groups comma-separated or ``-``; ``login=10m`` judges a token of a password login that long
  before ``now``, ``,used`` one whose single ``reauth_after: 0`` call was made; without it, a
  static ``users.yaml`` token) and ``expected.txt``: either the load errors or one decision line
  per request. An optional ``secrets.txt`` (one entry a line) is the fixed deny of the daemon's
  own secrets (docs/REFERENCE.md §4.5a), as ``secret_paths`` gives it.
* ``commands.txt`` (one ``mcpd grants`` command line a line, without ``mcpd grants``; each is run
  with ``--config`` the folder's ``mcpd.yaml``, whose ``grants_file`` is ``policy.yaml``, and
  ``--any-owner``) and ``expected-cli.txt``: each command, what it printed (stdout and stderr as
  a terminal shows them, the folder's path left out) and its exit status.

Regenerate after a deliberate change with
``UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_grants_golden.py`` and review the diff.
"""

from __future__ import annotations

import datetime
import os
import shlex
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from mcpd.admin.grants_cli import grants
from mcpd.common.grantmatch import decide
from mcpd.policy.grants import PolicyError, parse_duration, parse_policy

GOLDEN = Path(__file__).resolve().parent / "golden"
DEFAULT_NOW = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "requests.txt").exists())
CLI_CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "commands.txt").exists())


def _login(fields: list[str], now: datetime.datetime) -> tuple[datetime.datetime | None, bool]:
    """The ``login=AGE[,used]`` field of a request: (login time, used), or a static token's."""
    for field in fields:
        if field.startswith("login="):
            age, _, used = field[len("login="):].partition(",")
            seconds = parse_duration(age)
            assert seconds is not None and used in ("", "used"), field
            return now - datetime.timedelta(seconds=seconds), used == "used"
    return None, False


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
        extra = [f for f in fields[4:] if not f.startswith("login=")]
        now = datetime.datetime.fromisoformat(extra[0]) if extra else DEFAULT_NOW
        login_time, used = _login(fields[4:], now)
        groups = frozenset() if groups_text == "-" else frozenset(groups_text.split(","))
        d = decide(policy, user, groups, tool, path, now, login_time=login_time, login_used=used)
        line = f"{raw}\n  => {'ALLOW' if d.allowed else 'DENY'} ({d.reason}) path={d.resolved_path} rule={d.rule}"
        if d.covers_root:
            line += " follow_symlinks"
        if d.reauth_after is not None:
            line += f" reauth_after={d.reauth_after:g}s"
        if d.note:
            line += f"\n     note: {d.note}"
        out.append(line + "\n")
    return "".join(out)


def run_cli_case(folder: Path) -> str:
    """Run the folder's ``mcpd grants`` commands; the text ``expected-cli.txt`` must equal.

    They run on copies in a new folder under ``/tmp`` (0600, owned by this user), so the fixed
    deny, which names the files' folder, sorts the same wherever the repository is."""
    out: list[str] = []
    runner = CliRunner()
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="mcpd-golden-") as tmp:
        for name in ("policy.yaml", "mcpd.yaml"):
            shutil.copyfile(folder / name, Path(tmp) / name)
            os.chmod(Path(tmp) / name, 0o600)
        for raw in (folder / "commands.txt").read_text().splitlines():
            if not raw.strip() or raw.startswith("#"):
                continue
            args = [*shlex.split(raw), "--config", f"{tmp}/mcpd.yaml", "--any-owner"]
            result = runner.invoke(grants, args)
            assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
            shown = result.output.replace(f"{tmp}/", "")
            out.append(f"$ mcpd grants {raw}\n{shown}[exit {result.exit_code}]\n\n")
    return "".join(out)


def _compare(got: str, expected_file: Path) -> None:
    if os.environ.get("UPDATE_GOLDEN") == "1":
        expected_file.write_text(got)
    assert got == expected_file.read_text()


@pytest.mark.parametrize("case", CASES)
def test_grants_golden(case: str) -> None:
    _compare(run_case(GOLDEN / case), GOLDEN / case / "expected.txt")


@pytest.mark.parametrize("case", CLI_CASES)
def test_grants_cli_golden(case: str) -> None:
    """``mcpd grants check/list/test/export`` print every rule kind the daemon enforces."""
    _compare(run_cli_case(GOLDEN / case), GOLDEN / case / "expected-cli.txt")


def test_golden_cases_exist() -> None:
    assert len(CASES) >= 7 and len(CLI_CASES) >= 3
