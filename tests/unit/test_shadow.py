"""Whether an account may still use its login tokens, read from a shadow(5) file (docs/REFERENCE.md §5.3)."""

from __future__ import annotations

import time
from pathlib import Path

from mcpd.helper.shadow import usable

TODAY = int(time.time() // 86400)


def shadow(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "shadow"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_locked_expired_and_usable_accounts(tmp_path: Path) -> None:
    path = shadow(tmp_path, f"nobody:$y$hash:{TODAY}:0:99999:7:::")
    assert usable("nobody", path)
    assert not usable("nobody", shadow(tmp_path, f"nobody:!$y$hash:{TODAY}:0:99999:7:::"))  # usermod -L
    assert not usable("nobody", shadow(tmp_path, "nobody:*:19000:0:99999:7:::"))  # no password at all
    assert not usable("nobody", shadow(tmp_path, f"nobody:$y$hash:{TODAY}:0:99999:7::{TODAY}:"))  # chage -E today
    assert usable("nobody", shadow(tmp_path, f"nobody:$y$hash:{TODAY}:0:99999:7::{TODAY + 1}:"))


def test_root_unknown_and_unreadable_are_refused_and_unlisted_accounts_only_need_to_exist(tmp_path: Path) -> None:
    path = shadow(tmp_path, f"root:$y$hash:{TODAY}:0:99999:7:::")
    assert not usable("root", path)
    assert not usable("mcpd-no-such-account", path)
    assert not usable("nobody", str(tmp_path / "missing"))  # fail closed
    assert usable("nobody", path)  # not in the file (LDAP, SSSD): it exists, that is all
