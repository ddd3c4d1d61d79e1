"""Where the front serves the protected-resource metadata and what its challenges say
(docs/REFERENCE.md §5.4, RFC 9728 §3.1 and §5.1), from the configuration alone."""

from __future__ import annotations

from typing import Any

from mcpd.common import config
from mcpd.front import oauth

OAUTH: dict[str, Any] = {"resource": "https://files.example.com:9091/files/mcp", "issuers": [
    {"name": "corp", "issuer": "https://idp.example.com", "jwks_file": "/j.json", "audiences": ["a"],
     "accounts": ["*"]}]}


def test_metadata_url_inserts_the_well_known_path_after_the_host() -> None:
    cfg = config.from_dict({"oauth": OAUTH, "base_path": "/files"})
    assert oauth.metadata_url(cfg.oauth) == \
        "https://files.example.com:9091/.well-known/oauth-protected-resource/files/mcp"
    paths = oauth.metadata_paths(cfg)
    for p in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp",
              "/.well-known/oauth-protected-resource/files/mcp", "/files/.well-known/oauth-protected-resource"):
        assert p in paths
    assert oauth.metadata(cfg.oauth)["authorization_servers"] == ["https://idp.example.com"]


def test_no_routes_without_oauth() -> None:
    assert oauth.routes(config.Config()) == []


def test_challenges_quote_and_name_scopes() -> None:
    o = config.from_dict({"oauth": OAUTH}).oauth
    assert oauth.challenge(o) == ('Bearer resource_metadata="https://files.example.com:9091/.well-known/'
                                  'oauth-protected-resource/files/mcp", scope="files:read"')
    assert oauth.challenge(o, "insufficient_scope", None, ("files:read", "files:privileged")).startswith(
        'Bearer error="insufficient_scope", resource_metadata=')


def test_needed_scopes() -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "files/read", "arguments": {"path": "/x", "privileged": True}}}
    assert oauth.needed_scopes(call) == ("files:read", "files:privileged")
    assert oauth.needed_scopes([{"method": "ping"}, call]) == ("files:read", "files:privileged")
    assert oauth.needed_scopes({"method": "tools/call", "params": {"arguments": {"privileged": False}}}) == \
        ("files:read",)
    assert oauth.needed_scopes({"method": "resources/read", "params": {"uri": "file:///x?privileged=true"}}) == \
        ("files:read", "files:privileged")
