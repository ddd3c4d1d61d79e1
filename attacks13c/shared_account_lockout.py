"""Reproducer: principals sharing one OS account lock out another principal of it (run as root).

Starts the privilege-separated daemon (tests/integration/privsep_fixture.py), binds five new
principals to alice's account, has four of them make 4 reads at once (each gets per_account
workers, which the front keeps idle), then has the fifth read once and prints its answer. Before
the fix: HELPER_UNAVAILABLE "this account has too many workers" (the policy process counted the
account's workers, 4 x per_account, across principals), for as long as the front runs.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

from tests.integration.privsep_fixture import start_privsep, stop_privsep
from tests.integration.test_attack13c import PER_ACCOUNT, parallel_reads, share_account
from tests.osaccounts import AccountFactory


def main() -> None:
    factory = AccountFactory()
    d = start_privsep(factory, workers={"per_account": PER_ACCOUNT, "timeout_seconds": 20})
    try:
        folder = Path(tempfile.mkdtemp(prefix="mcpd-13c-", dir="/tmp"))
        folder.chmod(0o755)
        target = folder / "f.txt"
        target.write_text("line\n" * 10)
        target.chmod(0o644)
        names = [f"share{i}" for i in range(5)]
        tokens = share_account(d, names, d.accounts["alice"].name)
        for name in names[:4]:
            asyncio.run(parallel_reads(d, tokens[name], target, PER_ACCOUNT))
        print(json.dumps(asyncio.run(parallel_reads(d, tokens[names[4]], target, 1))[0], indent=1))
    finally:
        stop_privsep(d)
        factory.cleanup()


if __name__ == "__main__":
    main()
