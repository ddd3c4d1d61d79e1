"""A real OpenID provider for the OAuth tests: NanoIDP (PyPI ``nanoidp``, a test identity provider
with the device authorization grant, PKCE, refresh tokens and resource indicators), run in its own
process on 127.0.0.1 over TLS with a certificate from a private CA, and scripted the way a person
would use its pages (the device page's form, approve or deny).

:func:`nanoidp` is a context manager yielding an :class:`Idp`; the process is stopped at the end.
"""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from mcpd.admin import certs
from tests.support.net import free_port

CLIENT_ID = "mcpd-cli"
USER, PASSWORD = "alice", "alice-password-1"
RESOURCE = "https://files.example.com:9091/mcp"
LAUNCH = """
import sys
from nanoidp.app import create_app
app = create_app(sys.argv[1])
app.run(host="127.0.0.1", port=int(sys.argv[2]), ssl_context=(sys.argv[3], sys.argv[4]), debug=False)
"""


@dataclass
class Idp:
    """The running provider: its ``issuer`` URL, the CA file trusting it, and its log."""

    issuer: str
    cafile: str
    log: Path
    user: str = USER
    password: str = PASSWORD

    def client(self) -> httpx.Client:
        return httpx.Client(verify=ssl.create_default_context(cafile=self.cafile), timeout=20)

    def decide(self, user_code: str, approve: bool = True) -> None:
        """Approve (or deny) ``user_code`` on the device page as :attr:`user`, as a person at a browser would."""
        with self.client() as c:
            page = c.get(f"{self.issuer}/device", params={"user_code": user_code})
            assert page.status_code == 200, page.text[:500]
            form = {"user_code": user_code, "action": "authorize" if approve else "deny"}
            if approve:
                form |= {"username": self.user, "password": self.password}
            answer = c.post(f"{self.issuer}/device", data=form)
            assert answer.status_code == 200, answer.text[:500]


def _configure(folder: Path, issuer: str, user: str, audience: str) -> None:
    settings_file = folder / "settings.yaml"
    settings = yaml.safe_load(settings_file.read_text(encoding="utf-8"))
    oauth = settings["oauth"]
    oauth["issuer"] = issuer
    oauth["audience"] = audience
    oauth["scopes_supported"] = ["openid", "files:read", "files:privileged", "offline_access"]
    oauth["clients"].append({"client_id": CLIENT_ID, "token_endpoint_auth_method": "none",
                             "allowed_scopes": ["openid", "files:read", "files:privileged", "offline_access"],
                             "redirect_uris": ["http://127.0.0.1/callback"]})
    settings_file.write_text(yaml.safe_dump(settings), encoding="utf-8")
    users_file = folder / "users.yaml"
    users = yaml.safe_load(users_file.read_text(encoding="utf-8"))
    users["users"][user] = {"password": PASSWORD, "email": "alice@example.org", "roles": ["USER"],
                            "groups": ["developers"], "tenant": "default"}
    users_file.write_text(yaml.safe_dump(users), encoding="utf-8")


@contextmanager
def nanoidp(folder: Path, user: str = USER, audience: str = RESOURCE) -> Iterator[Idp]:
    """Start NanoIDP over TLS on a free loopback port, with the person ``user`` (password
    :data:`PASSWORD`; the access tokens' ``sub``) and ``audience`` in its tokens' ``aud``; stop it
    when the block ends."""
    binary = Path(sys.executable).parent / "nanoidp"
    if not binary.exists() and shutil.which("nanoidp") is None:
        pytest.fail("nanoidp is missing: install the test extras (pip install -e '.[test]')")
    pki = certs.make_pki(folder / "pki", ["127.0.0.1"])
    port = free_port()
    issuer = f"https://127.0.0.1:{port}"
    config = folder / "config"
    subprocess.run([str(binary), "init", str(config)], check=True, capture_output=True, timeout=60)
    _configure(config, issuer, user, audience)
    log = folder / "nanoidp.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", LAUNCH, str(config), str(port), str(pki.server_cert),
                                 str(pki.server_key)], stdout=out, stderr=subprocess.STDOUT, cwd=folder)
    idp = Idp(issuer, str(pki.ca_cert), log, user)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with idp.client() as c:
                    if c.get(f"{issuer}/.well-known/openid-configuration").status_code == 200:
                        break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
            time.sleep(0.2)
        yield idp
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def user_code_of(stderr_line: str) -> str | None:
    """The user code in linuxctl's "enter the code XXXX" line, or None."""
    m = re.search(r"enter the code (\S+)", stderr_line)
    return m.group(1) if m else None
