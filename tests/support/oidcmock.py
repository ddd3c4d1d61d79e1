"""A real OpenID provider on loopback for tests: ``oidc-provider-mock`` (PyPI) in a subprocess.

:func:`running_provider` starts ``python -m oidc_provider_mock`` on a free 127.0.0.1 port and
stops it; :func:`id_token` runs the authorization-code flow against it (the approval form posted
as a user would, then the code exchanged at its token endpoint) and returns the signed JWT it
issues; :func:`fetch_jwks` writes its published key set to a file as ``mcpd jwks fetch`` would.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from tests.support.net import free_port

START_SECONDS = 20.0


@contextlib.contextmanager
def running_provider() -> Iterator[str]:
    """The provider's base URL (its issuer) while the block runs."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "oidc_provider_mock", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                if httpx.get(url + "/.well-known/openid-configuration", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("oidc-provider-mock did not start")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def set_user(url: str, sub: str, claims: dict[str, Any]) -> None:
    """Give the provider's user ``sub`` these claims (they go into its tokens)."""
    httpx.put(f"{url}/users/{sub}", json=claims, timeout=10).raise_for_status()


def id_token(url: str, client_id: str, sub: str) -> str:
    """The authorization-code flow for ``sub``, approved: the ID token (a JWT signed by the provider)."""
    redirect = "http://127.0.0.1:1/callback"
    params = {"client_id": client_id, "redirect_uri": redirect, "response_type": "code", "scope": "openid",
              "state": "s1", "nonce": "n1"}
    with httpx.Client(timeout=10) as c:
        r = c.post(f"{url}/oauth2/authorize", params=params, data={"sub": sub, "action": "allow"})
        assert r.status_code in (302, 303), r.text
        code = parse_qs(urlsplit(r.headers["location"]).query)["code"][0]
        t = c.post(f"{url}/oauth2/token", data={"grant_type": "authorization_code", "code": code,
                                                "redirect_uri": redirect, "client_id": client_id,
                                                "client_secret": "any"})
        t.raise_for_status()
        return str(t.json()["id_token"])


def fetch_jwks(url: str, path: Path) -> None:
    """Write the provider's JWK Set to ``path`` (0644), atomically."""
    data = httpx.get(url + "/jwks", timeout=10).json()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
