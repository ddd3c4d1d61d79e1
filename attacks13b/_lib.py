"""Shared bits of the attacks13b reproducers: the real privsep daemon (the tests' fixture) and
code run as the service user ``mcpd`` (a compromised front) against the helper socket, with the
helpers of ``tests/integration/test_attack13b.py`` (``PRELUDE``: ``conn``, ``send``, ``recv``).

Run each reproducer as root from the worktree: ``.venv/bin/python attacks13b/NAME.py``; it exits 0
when the flaw shows, 1 when it does not.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.integration.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep  # noqa: E402
from tests.integration.test_attack13b import as_front  # noqa: E402,F401
from tests.osaccounts import AccountFactory  # noqa: E402


def daemon(**overrides: Any) -> tuple[PrivsepDaemon, AccountFactory]:
    factory = AccountFactory()
    return start_privsep(factory, **overrides), factory


def stop(d: PrivsepDaemon, factory: AccountFactory) -> None:
    stop_privsep(d)
    factory.cleanup()


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)


def with_fast_pam(main: Any) -> None:
    """Exit with ``main(service)``, ``service`` a PAM service with a short failure delay installed
    for the run (the one of ``tests/integration/test_login_attacks.py``)."""
    import tempfile

    from tests.integration.test_login_attacks import FAST_PAM
    from tests.osaccounts import pam_service

    fast = Path(tempfile.mkdtemp()) / "fast"
    fast.write_text(FAST_PAM)
    with pam_service(fast) as service:
        sys.exit(main(service))
