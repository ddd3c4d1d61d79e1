"""Whether an OS account may still use its login tokens, from ``/etc/shadow`` (docs/REFERENCE.md §5.3)."""

from __future__ import annotations

import pwd
import time

SHADOW = "/etc/shadow"


def usable(os_user: str, path: str = SHADOW) -> bool:
    """``True`` while ``os_user`` may use its login tokens: it exists, is not root, and where
    ``path`` (shadow(5)) has it, its password is not locked (``usermod -L``) and it has not
    expired (``chage -E``). The file is read at every check (a lock ends the account's logins at
    its next token check); an unreadable file refuses every account. Accounts that PAM finds
    elsewhere (LDAP, SSSD) are checked for existence only. Root only."""
    try:
        if pwd.getpwnam(os_user).pw_uid == 0:
            return False
        with open(path, encoding="utf-8", errors="replace") as f:
            for parts in (line.rstrip("\n").split(":") for line in f):
                if parts[0] == os_user and len(parts) >= 8:
                    expires = int(parts[7]) if parts[7].isdigit() else None
                    return not parts[1].startswith(("!", "*")) and (expires is None or time.time() // 86400 < expires)
    except (KeyError, OSError):
        return False
    return True
