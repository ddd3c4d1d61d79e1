"""The oauth block of mcpd.yaml (docs/REFERENCE.md §5.4) is validated when the daemon starts:
an issuer the policy process could not check tokens of safely stops it there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mcpd.common import config

OAUTH_OK: dict[str, Any] = {
    "resource": "https://files.example.com:9091/mcp",
    "issuers": [{"name": "corp", "issuer": "https://idp.example.com", "jwks_file": "/var/lib/mcpd/jwks/corp.json",
                 "audiences": ["https://files.example.com:9091/mcp"], "accounts": ["*"]}],
}


def _oauth(**issuer: Any) -> dict[str, Any]:
    return {"oauth": {**OAUTH_OK, "issuers": [{**OAUTH_OK["issuers"][0], **issuer}]}}


@pytest.mark.parametrize("change, message", [
    ({"algorithms": ["HS256"]}, "algorithms"),
    ({"algorithms": ["none"]}, "algorithms"),
    ({"algorithms": []}, "algorithms"),
    ({"audiences": []}, "audiences"),
    ({"accounts": []}, "accounts"),
    ({"name": "Corp"}, "name"),
    ({"name": "login"}, "name"),
    ({"name": "a:b"}, "name"),
    ({"issuer": ""}, "issuer"),
    ({"jwks_file": ""}, "jwks_file"),
    ({"jwks_uri": "http://idp.example.com/certs"}, "jwks_uri"),
    ({"principal_claim": "a b"}, "principal_claim"),
    ({"unknown": 1}, "unknown key"),
])
def test_oauth_issuer_is_validated(change: dict[str, Any], message: str) -> None:
    """docs/REFERENCE.md §5.4: an issuer must be usable and safe; HS* and none are never allowed."""
    with pytest.raises(config.ConfigError, match=message):
        config.from_dict(_oauth(**change))


def test_oauth_block_rules() -> None:
    """The block as a whole: https resource, known scopes, bounded leeway, unique issuers; absent = off."""
    assert config.from_dict(_oauth()).oauth.enabled
    assert not config.from_dict({}).oauth.enabled
    for bad, message in [({**OAUTH_OK, "resource": "http://x/mcp"}, "resource"),
                         ({**OAUTH_OK, "scopes_supported": ["admin"]}, "scopes_supported"),
                         ({**OAUTH_OK, "leeway_seconds": 3600}, "leeway_seconds"),
                         ({"resource": "https://x/mcp"}, "issuers"),
                         ({**OAUTH_OK, "issuers": OAUTH_OK["issuers"] * 2}, "name")]:
        with pytest.raises(config.ConfigError, match=message):
            config.from_dict({"oauth": bad})


def test_oauth_jwks_file_is_resolved_against_the_config_folder(tmp_path: Path) -> None:
    """A relative jwks_file is taken from the configuration file's folder, like every path."""
    cfg_file = tmp_path / "mcpd.yaml"
    cfg_file.write_text(yaml.safe_dump(_oauth(jwks_file="jwks/corp.json")), encoding="utf-8")
    assert config.load(cfg_file).oauth.issuers[0].jwks_file == str(tmp_path / "jwks/corp.json")


def test_oauth_needs_the_policy_process() -> None:
    """Without a helper unit nothing could verify an access token: such a configuration stops the daemon."""
    with pytest.raises(config.ConfigError, match="helper"):
        config.from_dict({**_oauth(), "helper_socket": ""})
