"""Whether an OS account may still use its login tokens, from ``/etc/shadow`` (SPEC §5.3)."""

from __future__ import annotations

import pwd
import time

from mcpd.common.reload import Reloading

SHADOW = "/etc/shadow"


def parse_shadow(path: str) -> dict[str, tuple[bool, int | None]]:
    """``{account: (password locked or absent, expiry day or None)}`` from a shadow(5) file (days
    since 1970-01-01). Raises ``OSError`` when unreadable."""
    out: dict[str, tuple[bool, int | None]] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for parts in (line.rstrip("\n").split(":") for line in f):
            if len(parts) >= 8 and parts[0]:
                out[parts[0]] = (parts[1].startswith(("!", "*")), int(parts[7]) if parts[7].isdigit() else None)
    return out


class Accounts:
    """An account may use its login tokens while it exists, is not root, and, where
    ``/etc/shadow`` has it, its password is not locked (``usermod -L``) and it has not expired
    (``chage -E``). The file is re-read when it changes (one ``stat`` per check), so a lock ends
    the account's logins at its next token check; an unreadable file refuses every login token.
    Accounts that PAM finds elsewhere (LDAP, SSSD) are checked for existence only. Root only."""

    def __init__(self, path: str = SHADOW) -> None:
        self._shadow: Reloading[dict[str, tuple[bool, int | None]]] = Reloading(
            path, parse_shadow, empty={}, fail_closed=True)

    def usable(self, os_user: str) -> bool:
        """``True`` while ``os_user`` may use its login tokens."""
        self._shadow.refresh()
        entry = self._shadow.current.get(os_user)
        if self._shadow.last_errors:
            return False
        try:
            if pwd.getpwnam(os_user).pw_uid == 0:
                return False
        except KeyError:
            return False
        return entry is None or not entry[0] and (entry[1] is None or time.time() // 86400 < entry[1])
