"""Where the client connects and whom it trusts: the server's ``/mcp`` and ``/sse`` URLs, the
verifying TLS context, and an httpx transport failure as :class:`~mcpd.client.errors.ConnectError`.

Shared by the MCP client (:mod:`mcpd.client.session`) and the login client
(:mod:`mcpd.client.login`); it sends nothing itself.
"""

from __future__ import annotations

import ssl

import httpx

from mcpd.client.errors import ConnectError, UsageError


def endpoints(url: str) -> tuple[str, str, str | None]:
    """``(mcp_url, sse_url, named)`` for a server URL: ``https://host:9091`` (plus any base path),
    or one already ending in ``/mcp`` or ``/sse``; ``named`` is ``"http"``/``"sse"`` for such an
    ending, else ``None``.

    Raises:
        UsageError: not an ``https`` URL with a host.
    """
    try:
        u = httpx.URL(url.strip())
    except (httpx.InvalidURL, TypeError) as exc:
        raise UsageError(f"invalid server URL: {exc}") from exc
    if u.scheme != "https" or not u.host:
        raise UsageError("server URL must look like https://HOST:PORT (TLS is required)")
    path, named = u.path.rstrip("/"), None
    for suffix, transport in (("/sse", "sse"), ("/mcp", "http")):
        if path.endswith(suffix):
            path, named = path[: -len(suffix)], transport
    return (str(u.copy_with(path=path + "/mcp", query=None, fragment=None)),
            str(u.copy_with(path=path + "/sse", query=None, fragment=None)), named)


def sse_url(url: str) -> str:
    """The ``/sse`` URL for a server base URL (``https://host:9091`` or one already ending in ``/sse``).

    Raises:
        UsageError: not an ``https`` URL with a host.
    """
    return endpoints(url)[1]


def ssl_context(cafile: str | None) -> ssl.SSLContext:
    """A verifying TLS ≥ 1.2 context trusting ``cafile`` (PEM), or the system store when ``None``.

    Raises:
        UsageError: ``cafile`` cannot be read or holds no certificate.
    """
    try:
        ctx = ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"cannot load CA file {cafile}: {exc}") from exc
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def transport_error(exc: Exception) -> ConnectError:
    """The :class:`ConnectError` for an httpx transport failure, naming the server it was for."""
    text = str(exc) or type(exc).__name__
    try:
        url = exc.request.url  # type: ignore[attr-defined]
        where = f" {url.scheme}://{url.netloc.decode('ascii', 'replace')}"
    except (AttributeError, RuntimeError):  # (httpx raises RuntimeError for an error without a request)
        where = ""
    if "CERTIFICATE_VERIFY_FAILED" in text or isinstance(exc.__context__, ssl.SSLCertVerificationError):
        return ConnectError(f"server{where} certificate not trusted: {text}", "TLS_ERROR")
    return ConnectError(f"cannot reach server{where}: {text}")
