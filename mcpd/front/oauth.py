"""The front's side of OAuth (docs/REFERENCE.md §5.4): protected-resource metadata, challenges, scopes.

With ``oauth`` configured the front serves the RFC 9728 metadata document at
``/.well-known/oauth-protected-resource`` and at its path-inserted forms (for ``/mcp``, for
``<base_path>/mcp`` and for the path of ``oauth.resource``), at the root and under
``base_path``; every ``401`` names it in ``WWW-Authenticate`` (``resource_metadata``, ``scope``),
and a token lacking a scope the request needs gets ``403`` ``insufficient_scope`` naming every
scope that request needs (:func:`needed_scopes`): ``files:read`` for anything, ``files:privileged``
too for a privileged call. The front verifies no token itself: the policy process does.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from mcpd.common.config import Config
from mcpd.common.identity import Principal
from mcpd.common.oauthconfig import SCOPE_PRIVILEGED, SCOPE_READ, OAuth

METADATA_PATH = "/.well-known/oauth-protected-resource"


def metadata_url(oauth: OAuth) -> str:
    """Where the metadata of ``oauth.resource`` is (RFC 9728 §3.1: the well-known path inserted
    between the host and the resource's path)."""
    parts = urlsplit(oauth.resource)
    path = parts.path.rstrip("/")
    return f"{parts.scheme}://{parts.netloc}{METADATA_PATH}{path}"


def metadata(oauth: OAuth) -> dict[str, Any]:
    """The protected-resource metadata document (RFC 9728 §2)."""
    return {"resource": oauth.resource, "authorization_servers": [i.issuer for i in oauth.issuers],
            "scopes_supported": list(oauth.scopes_supported), "bearer_methods_supported": ["header"]}


def metadata_paths(cfg: Config) -> list[str]:
    """Every path the metadata is served at (at the root and under ``base_path``)."""
    suffixes = {"", "/mcp", f"{cfg.base_path}/mcp", urlsplit(cfg.oauth.resource).path.rstrip("/")}
    return sorted({f"{prefix}{METADATA_PATH}{s}" for prefix in {"", cfg.base_path} for s in suffixes})


def routes(cfg: Config) -> list[Route]:
    """The metadata routes (``GET``), none when OAuth is off (``/.well-known/`` is then all ``404``)."""
    if not cfg.oauth.enabled:
        return []
    body = metadata(cfg.oauth)

    async def serve(request: Request) -> Response:
        return JSONResponse(body, headers={"Cache-Control": "max-age=3600"})

    return [Route(path, serve, methods=["GET"]) for path in metadata_paths(cfg)]


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def challenge(oauth: OAuth, error: str | None = None, description: str | None = None,
              scopes: tuple[str, ...] = (SCOPE_READ,)) -> str:
    """A ``WWW-Authenticate`` value (RFC 6750 §3, RFC 9728 §5.1): ``Bearer``, its ``error`` and
    ``error_description`` when given, then ``resource_metadata`` and ``scope``."""
    params = []
    if error is not None:
        params.append(f"error={_quoted(error)}")
    if description is not None:
        params.append(f"error_description={_quoted(description)}")
    params += [f"resource_metadata={_quoted(metadata_url(oauth))}", f"scope={_quoted(' '.join(scopes))}"]
    return "Bearer " + ", ".join(params)


def _privileged(member: Any) -> bool:
    if not isinstance(member, dict) or not isinstance(member.get("params"), dict):
        return False
    params = member["params"]
    if member.get("method") == "tools/call":
        args = params.get("arguments")
        return isinstance(args, dict) and bool(args.get("privileged"))
    if member.get("method") == "resources/read":
        uri = params.get("uri")
        return bool(params.get("privileged")) or (isinstance(uri, str) and "privileged=" in uri)
    return False


def needed_scopes(payload: Any) -> tuple[str, ...]:
    """The scopes a JSON-RPC message (or batch) needs: ``files:read``, and ``files:privileged`` when
    one of its members is a privileged call (``tools/call`` with ``privileged``, or a privileged
    ``resources/read``)."""
    members = payload if isinstance(payload, list) else [payload]
    return (SCOPE_READ, SCOPE_PRIVILEGED) if any(map(_privileged, members)) else (SCOPE_READ,)


def scope_refusal(oauth: OAuth, principal: Principal, needed: tuple[str, ...]) -> Response | None:
    """The ``403 insufficient_scope`` for an OAuth token lacking one of ``needed`` (static and
    login tokens have every scope), else ``None``."""
    if principal.scopes is None or set(needed) <= set(principal.scopes):
        return None
    header = challenge(oauth, "insufficient_scope", None, needed)
    return PlainTextResponse(f"insufficient scope: this request needs {' '.join(needed)}", status_code=403,
                             headers={"WWW-Authenticate": header})
