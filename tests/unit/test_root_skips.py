"""Root-only tests run, or fail, as root (the rule of ``tests/conftest.py``'s report hook).

Not root, a root-only test skips. As root (CI's run), its skip is reported as a failure: a
missing tool or a fixture that could not start must not hide a test that did not run. Root-only:
marked ``root``, using a root fixture (``privsep_daemon``, ``os_accounts``), or skipped from the
root fixtures' files. ``root_may_skip(reason)`` lets a test skip even as root. A prerequisite
checked with ``tests.support.rootonly.root_prerequisite`` fails as root and skips otherwise,
marked or not.

Each case runs the suite's own conftest in a separate pytest process whose ``os.geteuid`` says
0 or 1000 (the hook asks it; nothing else there needs the real one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]

CASES = '''
import pytest

@pytest.fixture
def os_accounts():
    pytest.skip("useradd is absent")

@pytest.mark.root
def test_root_marked():
    pytest.skip("a tool is absent")

@pytest.mark.root
@pytest.mark.skipif(True, reason="systemd-analyze is absent")
def test_root_marked_skipif():
    pass

def test_root_fixture(os_accounts):
    pass

def test_root_fixture_file():
    import helper
    helper.skip_here()

def test_plain():
    pytest.skip("npm is absent")

@pytest.mark.root
@pytest.mark.root_may_skip("needs what an earlier test of its module made")
def test_opted_out():
    pytest.skip("nothing to work on")

@pytest.mark.root
@pytest.mark.xfail(reason="a known flaw", strict=True)
def test_root_xfail():
    assert False

@pytest.mark.root
def test_root_passes():
    pass

def test_prerequisite_missing():
    from tests.support.rootonly import root_prerequisite
    root_prerequisite(False, "a tool is absent")

def test_prerequisite_present():
    from tests.support.rootonly import root_prerequisite
    root_prerequisite(True, "a tool is absent")
'''

CONFTEST = '''
import json, os
from pathlib import Path

import tests.conftest as suite
from tests.conftest import pytest_collection_modifyitems, pytest_runtest_makereport  # noqa: F401

os.geteuid = lambda: {euid}
suite.ROOT_FIXTURE_FILES = frozenset({{Path(__file__).parent / "helper.py"}})


def pytest_sessionfinish(session):
    (Path(__file__).parent / "outcomes.json").write_text(json.dumps(OUTCOMES))


OUTCOMES = {{}}


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        OUTCOMES.setdefault(report.nodeid.split("::")[-1], report.outcome)
'''

HELPER = '''
import pytest

def skip_here():
    pytest.skip("the root helper did not start")
'''

MARKERS = '''
[pytest]
markers =
    root: needs root
    root_may_skip(reason): skip right even as root
'''


def outcomes(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, euid: int) -> dict[str, str]:
    """Each case's outcome (``passed``, ``failed``, ``skipped``) in a run whose euid is ``euid``."""
    pytester.makeconftest(CONFTEST.format(euid=euid))
    pytester.makepyfile(test_cases=CASES, helper=HELPER)
    pytester.makeini(MARKERS)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--strict-markers", "-q")
    result: dict[str, str] = json.loads((pytester.path / "outcomes.json").read_text())
    return result


def test_as_root_a_root_only_test_that_skips_fails(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    assert outcomes(pytester, monkeypatch, 0) == {
        "test_root_marked": "failed", "test_root_marked_skipif": "failed", "test_root_fixture": "failed",
        "test_root_fixture_file": "failed", "test_plain": "skipped", "test_opted_out": "skipped",
        "test_root_xfail": "skipped", "test_root_passes": "passed",
        "test_prerequisite_missing": "failed", "test_prerequisite_present": "passed"}


def test_not_root_a_root_only_test_skips(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    assert outcomes(pytester, monkeypatch, 1000) == {
        "test_root_marked": "skipped", "test_root_marked_skipif": "skipped", "test_root_fixture": "skipped",
        "test_root_fixture_file": "skipped", "test_plain": "skipped", "test_opted_out": "skipped",
        "test_root_xfail": "skipped", "test_root_passes": "passed",
        "test_prerequisite_missing": "skipped", "test_prerequisite_present": "passed"}
