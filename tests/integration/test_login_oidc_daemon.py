"""The whole OAuth chain on one host, nothing stood in: a real OpenID provider (NanoIDP over TLS on
loopback), the real daemon (root helper, policy process, front), `mcpd jwks fetch` writing the
provider's keys into the file the policy process trusts, and `linuxctl login --oidc` finding the
resource and issuer in the front's protected-resource metadata, getting a token by the device
grant, then reading a file of the person's own OS account with it (docs/OAUTH.md)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.nanoidp import CLIENT_ID, Idp, nanoidp, user_code_of
from tests.support.net import free_port
from tests.support.osaccounts import Account, AccountFactory
from tests.support.privsep_fixture import PrivsepDaemon, start_privsep, stop_privsep

pytestmark = pytest.mark.root

BIN = Path(sys.executable).parent


@dataclass
class Chain:
    d: PrivsepDaemon
    idp: Idp
    person: Account
    jwks_file: Path


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    if os.geteuid() != 0:
        pytest.skip("needs root: root helper and OS accounts")
    factory = AccountFactory()
    person = factory.user(password=secrets.token_urlsafe(12))  # an account without one is locked in shadow
    port = free_port()
    resource = f"https://127.0.0.1:{port}/mcp"
    jwks_dir = Path(f"/tmp/mcpd-jwks-{secrets.token_hex(4)}")  # root's, 0755: as /var/lib/mcpd-jwks is mcpd-jwks's
    jwks_dir.mkdir(mode=0o755)
    d: PrivsepDaemon | None = None
    try:
        with nanoidp(tmp_path_factory.mktemp("idp"), user=person.name, audience=resource) as idp:
            oauth = {"resource": resource, "issuers": [
                {"name": "corp", "issuer": idp.issuer, "jwks_uri": idp.issuer + "/.well-known/jwks.json",
                 "jwks_file": str(jwks_dir / "corp.json"), "audiences": [resource], "principal_claim": "sub",
                 "account_claim": "sub", "accounts": [person.name], "client_id": CLIENT_ID}]}
            d = start_privsep(factory, listen={"host": "127.0.0.1", "port": port}, oauth=oauth)
            yield Chain(d, idp, person, jwks_dir / "corp.json")
    finally:
        if d is not None:
            stop_privsep(d)
        shutil.rmtree(jwks_dir, ignore_errors=True)
        factory.cleanup()


def fetch_keys(chain: Chain) -> str:
    fetched = subprocess.run([str(BIN / "mcpd"), "jwks", "fetch", "--config", str(chain.d.config_path), "--cafile",
                              chain.idp.cafile], capture_output=True, text=True, timeout=60, check=False)
    assert fetched.returncode == 0, fetched.stderr
    assert chain.jwks_file.stat().st_mode & 0o777 == 0o644
    return fetched.stdout


def login(chain: Chain, home: Path, *extra: str) -> dict[str, str]:
    """`linuxctl login --oidc` with only the server's URL and the client id (the resource and the
    issuer come from the front's metadata), approved on the provider's page; the environment that
    uses the stored token."""
    d, idp = chain.d, chain.idp
    env = {**os.environ, "XDG_CONFIG_HOME": str(home), "HOME": str(home)}
    env.pop("MCP_TOKEN", None)
    args = [str(BIN / "linuxctl"), "--url", d.url, "--cacert", d.cacert, "login", "--oidc", "--client-id",
            CLIENT_ID, "--idp-cacert", idp.cafile, *extra]
    seen = []
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stderr is not None and proc.stdout is not None
        for line in proc.stderr:
            seen.append(line)
            code = user_code_of(line)
            if code:
                idp.decide(code)
        out = proc.stdout.read()
        assert proc.wait(60) == 0, "".join(seen)
    assert out == ""  # the token is never printed
    return env


def read(chain: Chain, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`linuxctl get files ARGS` with the stored token, retried while the key set is not loaded yet
    (the policy process re-reads it when it changes)."""
    command = [str(BIN / "linuxctl"), "--url", chain.d.url, "--cacert", chain.d.cacert, "get", "files", *args]
    deadline = time.monotonic() + 20
    while True:
        got = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)
        if got.returncode != 3 or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def test_device_grant_token_reads_the_persons_own_file(chain: Chain, tmp_path: Path) -> None:
    assert "corp: wrote" in fetch_keys(chain)
    env = login(chain, tmp_path)
    secret = Path(chain.person.home) / f"oauth-{secrets.token_hex(3)}.txt"
    secret.write_text("only its owner reads this\n", encoding="utf-8")
    os.chown(secret, chain.person.uid, chain.person.gid)
    secret.chmod(0o600)
    got = read(chain, env, str(secret))
    assert got.returncode == 0, got.stderr + chain.d.log("helper.log")[-3000:]
    assert got.stdout == "only its owner reads this\n"


def test_privileged_call_steps_up_to_files_privileged(chain: Chain, tmp_path: Path) -> None:
    """A token with files:read only is refused a privileged read with 403 insufficient_scope, and
    linuxctl says how to get the scope; after `login --oidc --privileged` the grant decides, and
    the person's grant allows it."""
    d = chain.d
    grants = d.default_grants()
    grants["users"][chain.person.name] = grants["users"][d.accounts["alice"].name]
    d.write_grants(grants)
    fetch_keys(chain)
    env = login(chain, tmp_path)
    refused = read(chain, env, "--privileged", str(d.log_file))
    assert refused.returncode == 1, refused.stderr
    assert "HTTP_403" in refused.stderr and "files:privileged" in refused.stderr
    assert "linuxctl login --oidc --privileged" in refused.stderr
    env = login(chain, tmp_path, "--privileged")
    deadline = time.monotonic() + 20  # the policy process re-reads the grants file when it changes
    while True:
        got = read(chain, env, "--privileged", str(d.log_file))
        if got.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert got.returncode == 0, got.stderr
    assert got.stdout == d.log_file.read_text(encoding="utf-8")
