"""PAM for the root helper: authentication and account management of one OS account (docs/REFERENCE.md §5.2)."""

from __future__ import annotations

import pam


def pam_check(service: str, user: str, password: str) -> tuple[bool, int, str]:
    """PAM authentication and account management (``service``'s auth and account stacks, so
    locked and expired accounts fail) for ``user``: ``(ok, PAM code, reason)``. A fresh
    authenticator per call, so calls from several threads are safe. Must run as root."""
    auth = pam.PamAuthenticator()
    try:
        ok = auth.authenticate(user, password, service=service, resetcreds=False)
    except ValueError:  # a NUL byte in the user or password
        return False, 4, "malformed credentials"
    return bool(ok), int(auth.code), str(auth.reason)
