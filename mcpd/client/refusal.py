"""A refusal by HTTP status as the client reports it: :class:`HTTPRefused` carries the status,
the server's ``Retry-After`` and its own explanation (:func:`server_message`), read from at most a
bounded part of the body (:func:`read_refusal` for a streamed response).

Used by the MCP client (:mod:`mcpd.client.session`) and the login client
(:mod:`mcpd.client.login`). A ``401`` is not a refusal here: it is
:class:`~mcpd.client.errors.AuthError`.
"""

from __future__ import annotations

import json
import re

import httpx

from mcpd.client.errors import ProtocolError

#: the most of a refusal's body the client reads and shows (a server's explanation is one line)
REFUSAL_TEXT_CAP = 300


class HTTPRefused(ProtocolError):
    """The server refused a request by its HTTP status (not ``401``), exit 1; ``code`` is
    ``HTTP_<status>`` and the message carries the server's own explanation and, when it sent one,
    its ``Retry-After``.

    Attributes:
        status: the HTTP status.
        retry_after: the ``Retry-After`` seconds (``503`` while the server's policy process is
            restarting, ``429``), or ``None`` when none came in seconds.
    """

    def __init__(self, what: str, status: int, body: bytes, headers: httpx.Headers) -> None:
        self.status = status
        self.retry_after = retry_after(headers)
        text = f"{what} answered {status}"
        if self.retry_after is not None:
            text += f" (retry after {self.retry_after} s)"
        said = server_message(body)
        text = f"{text}: {said}" if said else text
        needed = insufficient_scope(headers) if status == 403 else None
        if needed is not None:
            hint = " --privileged" if "files:privileged" in needed.split() else ""
            text += f" (this call needs an OAuth token with the scopes {needed}; get one with `linuxctl login --oidc{hint}`)"
        super().__init__(text, f"HTTP_{status}")


_CHALLENGE_PARAM_RE = re.compile(r'([a-z_]+)="([^"\\]{0,200})"')


def insufficient_scope(headers: httpx.Headers) -> str | None:
    """The ``scope`` of a ``WWW-Authenticate: Bearer error="insufficient_scope"`` challenge (the
    scopes the refused request needs, space-separated), or ``None`` for any other answer."""
    params = dict(_CHALLENGE_PARAM_RE.findall(headers.get("www-authenticate", "")))
    if params.get("error") != "insufficient_scope":
        return None
    return " ".join(params.get("scope", "").split()) or None


def server_message(body: bytes) -> str:
    """The explanation in a refusal's body, for a person: a JSON ``{"error": "..."}`` (or a
    JSON-RPC error's ``message``) gives that text, anything else the body's text; whitespace runs
    become one space and it is cut at :data:`REFUSAL_TEXT_CAP` characters. It is the server's
    text: print it escaped."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        error = error["message"]
    text = error if isinstance(error, str) else body.decode("utf-8", "replace")
    return " ".join(text.split())[:REFUSAL_TEXT_CAP]


def retry_after(headers: httpx.Headers) -> int | None:
    """A response's ``Retry-After`` in seconds, or ``None`` when absent or not delta-seconds
    (RFC 9110 §10.2.3 also allows a date, which mcpd never sends)."""
    value = headers.get("retry-after", "").strip()
    return int(value) if value.isdigit() and len(value) <= 9 else None


async def read_refusal(what: str, resp: httpx.Response) -> HTTPRefused:
    """The :class:`HTTPRefused` of a streamed response, reading at most :data:`REFUSAL_TEXT_CAP`
    times 4 bytes of its body (a hostile server's endless body is not read)."""
    body = b""
    try:
        async for chunk in resp.aiter_bytes():
            body += chunk
            if len(body) >= 4 * REFUSAL_TEXT_CAP:
                break
    except httpx.HTTPError:
        pass  # the status alone still says what happened
    return HTTPRefused(what, resp.status_code, body[: 4 * REFUSAL_TEXT_CAP], resp.headers)
