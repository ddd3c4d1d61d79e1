"""files/grep runs with the caller's own account on the ordinary route: what the account may not
read is skipped (``permission``), a file named alone is ``PERMISSION_DENIED``, and nothing of it is
answered; and a privileged files/grep without a grant for files/grep is refused, with its audit
record, even where the account has grants for the other tools."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from mcpd.client.api import Client
from tests.support.privsep_fixture import SECRET_TEXT, PrivsepDaemon, privsep_daemon  # noqa: F401

pytestmark = pytest.mark.root


def grep(d: PrivsepDaemon, **args: Any) -> dict[str, Any]:
    async def go() -> Any:
        async with Client(d.url, d.tokens["alice"], d.cacert, timeout=60) as c:
            return await c.call_tool("files/grep", args, check=False)

    return dict(asyncio.run(go())["structuredContent"])


def test_what_the_account_cannot_read_is_skipped_not_answered(privsep_daemon: PrivsepDaemon) -> None:  # noqa: F811
    d = privsep_daemon
    public = d.srv / "public.txt"
    public.write_text("root secret: this one is public\n")
    os.chmod(public, 0o644)
    try:
        out = grep(d, pattern="root secret", path=str(d.srv))
        assert [m["path"] for m in out["matches"]] == [str(public)]
        assert out["files_skipped"]["permission"] >= 3  # app/, app-evil/ (folders) and secret (a file)
        assert {"path": str(d.secret), "reason": "permission"} in out["skipped"]
        assert SECRET_TEXT.strip() not in repr(out)
        alone = grep(d, pattern="root", path=str(d.secret))
        assert alone["error"]["code"] == "PERMISSION_DENIED"
    finally:
        public.unlink()


def test_privileged_grep_without_its_grant_is_refused_and_recorded(privsep_daemon: PrivsepDaemon) -> None:  # noqa: F811
    d = privsep_daemon  # (alice may read and list app: a grant of those tools is none for files/grep)
    out = grep(d, pattern="app", path=str(d.app), privileged=True)
    assert out["error"]["code"] == "PERMISSION_DENIED"
    assert out["error"]["details"]["reason"] == "no grant covers this path"
    assert "app log line" not in repr(out)
    rec = [r for r in d.audit() if r.get("tool") == "files/grep"][-1]
    assert rec["decision"] == "reject" and rec["route"] == "privileged" and "pattern_sha256" in rec
