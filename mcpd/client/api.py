"""An async MCP client over Streamable HTTP or HTTP+SSE (SPEC §1, §2), used by ``linuxctl`` and tests.

Usage::

    async with Client("https://127.0.0.1:9091", token, cafile="ca.crt", transport="auto") as c:
        tools = await c.list_tools()
        result = await c.call_tool("files/read", {"path": "/etc/hosts"})

``transport``:

- ``"sse"`` (the default): entering the context opens ``GET /sse`` with the bearer token, waits for
  the ``endpoint`` event, then sends ``initialize`` and ``notifications/initialized``. A reader
  task dispatches every ``message`` event to the future of the request with the same ``id``, so
  concurrent requests on one client are matched by id in any order (SPEC §1.5).
- ``"http"``: Streamable HTTP at ``/mcp`` in the session era: ``initialize`` is POSTed, its
  ``Mcp-Session-Id`` goes with every later POST, each POST's answer (JSON, or an event stream with
  the call's progress and then its reply) is dispatched the same way, and closing sends ``DELETE``.
- ``"auto"``: ``"http"``, falling back to ``"sse"`` when the ``initialize`` POST answers ``400``,
  ``404`` or ``405``, as the specification's backwards-compatibility section describes (an mcpd
  without ``/mcp``, or a server speaking only the old transport). A URL ending in ``/sse`` or
  ``/mcp`` names the transport itself.

Failures are one exception family whose ``exit_code`` is the ``linuxctl`` exit status (SPEC §6):
:class:`ToolFailed` 1, :class:`RPCError` 1, :class:`ProtocolError` 1, :class:`UsageError` 2,
:class:`AuthError` 3, :class:`ConnectError` 4 (refused, DNS, TLS verification, lost stream, no
answer in time).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
from httpx_sse import EventSource, SSEError, aconnect_sse

from mcpd.common.version import version

PROTOCOL_VERSION = "2025-06-18"
CLIENT_NAME = "mcpd-client"
TRANSPORTS = ("auto", "http", "sse")
FALLBACK_STATUSES = frozenset({400, 404, 405})  # a POST to /mcp answered so: try the old transport
T = TypeVar("T")


def client_info() -> dict[str, str]:
    """The ``clientInfo`` sent in ``initialize``: this client's name and the package's version."""
    return {"name": CLIENT_NAME, "version": version()}


ProgressHandler = Callable[[float, "float | None", "str | None"], None]


class MCPClientError(Exception):
    """Base of the client's errors; ``code`` is a short stable word, ``exit_code`` the SPEC §6 status."""

    exit_code = 1
    default_code = "CLIENT_ERROR"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code


class ToolFailed(MCPClientError):
    """A tool result with ``isError: true`` (SPEC §2.5); ``code`` is its error code, exit 1.

    Attributes:
        details: the ``structuredContent.error.details`` mapping (empty if absent).
        result: the whole ``CallToolResult``.
    """

    exit_code = 1
    default_code = "TOOL_ERROR"

    def __init__(self, code: str, message: str, details: dict[str, Any], result: dict[str, Any]) -> None:
        super().__init__(message, code)
        self.details = details
        self.result = result


class RPCError(MCPClientError):
    """A JSON-RPC error response (SPEC §2.3), exit 1; ``rpc_code`` is the integer code, ``data`` its data."""

    exit_code = 1
    default_code = "RPC_ERROR"

    def __init__(self, rpc_code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} ({rpc_code})")
        self.rpc_code = rpc_code
        self.data = data


class ResourceFailed(ToolFailed):
    """A ``resources/read`` JSON-RPC error carrying a SPEC §2.5 code in ``data.code`` (exit 1);
    ``rpc_code`` is the JSON-RPC code (``-32002`` for ``FILE_NOT_FOUND``)."""

    def __init__(self, rpc_code: int, code: str, message: str, details: dict[str, Any]) -> None:
        super().__init__(code, message, details, {})
        self.rpc_code = rpc_code


class ProtocolError(MCPClientError):
    """The server answered something this client cannot use (unexpected status or message), exit 1."""

    default_code = "PROTOCOL_ERROR"


class HTTPRefused(ProtocolError):
    """The server refused a request by its HTTP status (not ``401``), exit 1; ``code`` is
    ``HTTP_<status>`` and the message carries the server's own explanation and, when it sent one,
    its ``Retry-After``.

    Attributes:
        status: the HTTP status.
        retry_after: the ``Retry-After`` seconds (``503`` while the server's root helper is
            restarting, ``429``), or ``None`` when none came in seconds.
    """

    def __init__(self, what: str, status: int, body: bytes, headers: httpx.Headers) -> None:
        self.status = status
        self.retry_after = retry_after(headers)
        text = f"{what} answered {status}"
        if self.retry_after is not None:
            text += f" (retry after {self.retry_after} s)"
        said = server_message(body)
        super().__init__(f"{text}: {said}" if said else text, f"HTTP_{status}")


#: the most of a refusal's body the client reads and shows (a server's explanation is one line)
REFUSAL_TEXT_CAP = 300


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


async def _refusal(what: str, resp: httpx.Response) -> HTTPRefused:
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


class UsageError(MCPClientError):
    """The caller's input is unusable (missing URL or token, malformed argument), exit 2."""

    exit_code = 2
    default_code = "USAGE_ERROR"


class AuthError(MCPClientError):
    """The server answered ``401``: no, wrong or expired token (SPEC §1.3), exit 3."""

    exit_code = 3
    default_code = "AUTH_FAILED"


class ConnectError(MCPClientError):
    """The server cannot be reached, its certificate is not trusted, or it stopped answering, exit 4."""

    exit_code = 4
    default_code = "CONNECT_FAILED"


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
        UsageError: not an ``http``/``https`` URL with a host.
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


def _transport_error(exc: Exception) -> ConnectError:
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


class Client:
    """One MCP session over Streamable HTTP or SSE (SPEC §1, §2); an async context manager.

    Args:
        url: server base URL (``https://127.0.0.1:9091``); ``/mcp`` or ``/sse`` is appended
            unless present.
        token: the bearer token (never logged, never put in a URL).
        cafile: PEM file of the CA to trust; ``None`` uses the system trust store.
        timeout: seconds to wait for connecting, each POST, and each response.
        auto_initialize: send ``initialize`` + ``notifications/initialized`` on entry (Streamable
            HTTP always does: its session starts with it).
        protocol_version: the version requested in ``initialize`` (SPEC §2.1).
        transport: ``"sse"``, ``"http"`` or ``"auto"`` (see the module docstring); a URL ending in
            ``/mcp`` or ``/sse`` overrides ``"auto"``. :attr:`transport` tells which one is in use
            once connected.

    Raises (on entry): :class:`UsageError`, :class:`AuthError`, :class:`ConnectError`,
    :class:`ProtocolError`.
    """

    def __init__(
        self,
        url: str,
        token: str,
        cafile: str | None = None,
        timeout: float = 30.0,
        *,
        auto_initialize: bool = True,
        protocol_version: str = PROTOCOL_VERSION,
        transport: str = "sse",
    ) -> None:
        if not token:
            raise UsageError("no token given")
        if transport not in TRANSPORTS:
            raise UsageError(f"transport must be one of {', '.join(TRANSPORTS)}")
        self.mcp_url, self.url, named = endpoints(url)
        self.transport = named if named is not None and transport == "auto" else transport
        self.session_id: str | None = None  # Streamable HTTP: the server's Mcp-Session-Id
        self.timeout = timeout
        self.protocol_version = protocol_version
        self.auto_initialize = auto_initialize
        self.endpoint: str | None = None
        self.server_info: dict[str, Any] | None = None
        self._token = token
        self._ssl = ssl_context(cafile)
        self._ids = itertools.count(1)
        self._pending: dict[int | str, asyncio.Future[dict[str, Any]]] = {}
        self._progress: dict[str, ProgressHandler] = {}
        self._endpoint_ready: asyncio.Future[str] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._stack = contextlib.AsyncExitStack()
        self._http: httpx.AsyncClient | None = None
        self._closed_reason: MCPClientError | None = None

    @property
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"}

    async def __aenter__(self) -> "Client":
        try:
            await self.connect()
            if self.auto_initialize:
                await self.initialize()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect with :attr:`transport`: for ``"http"``/``"auto"`` POST ``initialize`` to
        ``/mcp`` (``"auto"`` falls back to SSE on ``400``/``404``/``405``); for SSE open the stream
        and wait (``timeout`` s) for the ``endpoint`` event (SPEC §1.2)."""
        self._http = await self._stack.enter_async_context(
            httpx.AsyncClient(verify=self._ssl, timeout=self.timeout, follow_redirects=False)
        )
        if self.transport in ("auto", "http"):
            refused = await self._start_streamable()
            if refused is None:
                return
            if self.transport == "http" or refused.status not in FALLBACK_STATUSES:
                raise refused
            self.transport = "sse"
        await self._connect_sse()

    async def _start_streamable(self) -> HTTPRefused | None:
        """POST ``initialize`` to ``/mcp``; ``None`` once the session is open, else the refusal by
        HTTP status (``401`` raises :class:`AuthError`)."""
        self.endpoint = self.mcp_url
        req_id = next(self._ids)
        msg = {"jsonrpc": "2.0", "id": req_id, "method": "initialize",
               "params": {"protocolVersion": self.protocol_version, "capabilities": {}, "clientInfo": client_info()}}
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = fut
        try:
            refused = await asyncio.wait_for(self._post_streamable(msg, probe=True), self.timeout)
        except TimeoutError:
            raise ConnectError("no answer to initialize in time", "TIMEOUT") from None
        finally:
            self._pending.pop(req_id, None)
        if refused is not None:
            return refused
        if not fut.done():
            raise ProtocolError("initialize got no answer")
        self.server_info = self._result_of(fut.result())
        if not isinstance(self.server_info, dict):
            raise ProtocolError("initialize returned no result object")
        self.transport = "http"
        await self.notify("notifications/initialized")
        return None

    async def _connect_sse(self) -> None:
        if self._http is None:
            raise ProtocolError("client is not connected")
        stream_timeout = httpx.Timeout(self.timeout, read=None)
        try:
            source = await self._stack.enter_async_context(
                aconnect_sse(self._http, "GET", self.url, headers=self._headers, timeout=stream_timeout)
            )
        except httpx.TransportError as exc:
            raise _transport_error(exc) from None
        status = source.response.status_code
        if status == 401:
            raise AuthError("authentication failed (401): check the token")
        if status != 200:
            raise await _refusal(f"GET {self.url}", source.response)
        loop = asyncio.get_running_loop()
        self._endpoint_ready = loop.create_future()
        self._reader = asyncio.create_task(self._read(source))
        try:
            endpoint = await asyncio.wait_for(asyncio.shield(self._endpoint_ready), self.timeout)
        except TimeoutError:
            raise ConnectError("no endpoint event from server in time") from None
        self.endpoint = self._resolve_endpoint(endpoint)

    def _resolve_endpoint(self, data: str) -> str:
        base = httpx.URL(self.url)
        target = base.join(data.strip())
        if (target.scheme, target.host, target.port) != (base.scheme, base.host, base.port):
            raise ProtocolError("endpoint event names another server; refusing to send the token there")
        return str(target)

    async def _read(self, source: EventSource) -> None:
        reason: MCPClientError = ConnectError("the server closed the event stream")
        try:
            async for event in source.aiter_sse():
                if event.event == "endpoint":
                    if self._endpoint_ready is not None and not self._endpoint_ready.done():
                        self._endpoint_ready.set_result(event.data)
                elif event.event == "message":
                    self._dispatch(event.data)
        except SSEError as exc:
            reason = ProtocolError(f"not an event stream: {exc}")
        except httpx.TransportError as exc:
            reason = _transport_error(exc)
        except asyncio.CancelledError:
            reason = ConnectError("client closed")
            raise
        finally:
            self._fail_all(reason)

    def _dispatch(self, data: str) -> None:
        try:
            msg = json.loads(data)
        except ValueError:
            return
        for item in msg if isinstance(msg, list) else [msg]:
            if isinstance(item, dict) and item.get("method") == "notifications/progress":
                self._on_progress(item.get("params"))
                continue
            if not isinstance(item, dict) or "method" in item:
                continue  # server-initiated requests and other notifications are not used by mcpd
            fut = self._pending.pop(item.get("id"), None)  # type: ignore[arg-type]
            if fut is not None and not fut.done():
                fut.set_result(item)

    def _on_progress(self, params: Any) -> None:
        if not isinstance(params, dict):
            return
        handler = self._progress.get(params.get("progressToken"))  # type: ignore[arg-type]
        if handler is not None:
            message = params.get("message")
            handler(params.get("progress", 0), params.get("total"), message if isinstance(message, str) else None)

    def _fail_all(self, reason: MCPClientError) -> None:
        if self._closed_reason is None:
            self._closed_reason = reason
        futures: list[asyncio.Future[Any]] = list(self._pending.values())
        if self._endpoint_ready is not None:
            futures.append(self._endpoint_ready)
        for fut in futures:
            if not fut.done():
                fut.set_exception(self._closed_reason)
                fut.exception()  # retrieved: nobody may be waiting any more, that is fine
        self._pending.clear()

    async def _post(self, message: dict[str, Any] | list[Any]) -> None:
        if self._http is None or self.endpoint is None:
            raise ProtocolError("client is not connected")
        if self._closed_reason is not None:
            raise self._closed_reason
        if self.transport == "http":
            await self._post_streamable(message)
            return
        try:
            resp = await self._http.post(self.endpoint, json=message, headers=self._headers)
        except httpx.TransportError as exc:
            raise _transport_error(exc) from None
        if resp.status_code == 401:
            raise AuthError("authentication failed (401): check the token")
        if resp.status_code not in (200, 202):
            raise HTTPRefused("POST", resp.status_code, resp.content, resp.headers)

    async def _post_streamable(self, message: dict[str, Any] | list[Any], probe: bool = False) -> HTTPRefused | None:
        """POST one message to ``/mcp`` and dispatch what comes back (the JSON reply, or the
        event stream's progress and reply). ``probe`` (the ``initialize``): a refusal by status
        is returned instead of raised, and the session id is taken from the answer."""
        if self._http is None:
            raise ProtocolError("client is not connected")
        headers = {**self._headers, "Accept": "application/json, text/event-stream"}
        if self.session_id is not None:
            headers["Mcp-Session-Id"] = self.session_id
            headers["MCP-Protocol-Version"] = str((self.server_info or {}).get("protocolVersion", self.protocol_version))
        try:
            async with self._http.stream("POST", self.mcp_url, json=message, headers=headers,
                                         timeout=httpx.Timeout(self.timeout, read=None)) as resp:
                if resp.status_code == 401:
                    raise AuthError("authentication failed (401): check the token")
                kind = resp.headers.get("content-type", "").split(";", 1)[0].strip().lower()
                if kind == "text/event-stream" and resp.status_code == 200:
                    async for event in EventSource(resp).aiter_sse():
                        if event.event == "message":
                            self._dispatch(event.data)
                else:
                    body = await resp.aread()
                    # (a refusal by status is the transport's, even when its JSON error carries the id)
                    answered = kind == "application/json" and resp.status_code in (200, 202) \
                        and self._dispatch_reply(body, message)
                    if not answered and resp.status_code not in (200, 202):
                        if probe:
                            return HTTPRefused(f"POST {self.mcp_url}", resp.status_code, body, resp.headers)
                        if resp.status_code == 404 and self.session_id is not None:
                            raise ProtocolError("the server ended this session", "SESSION_ENDED")
                        raise HTTPRefused("POST", resp.status_code, body, resp.headers)
                if probe and resp.status_code == 200:
                    self.session_id = resp.headers.get("mcp-session-id")
        except httpx.TransportError as exc:
            raise _transport_error(exc) from None
        except SSEError as exc:
            raise ProtocolError(f"not an event stream: {exc}") from None
        return None

    def _dispatch_reply(self, body: bytes, message: dict[str, Any] | list[Any]) -> bool:
        """Dispatch a JSON answer if it is the reply to one of ``message``'s requests."""
        try:
            reply = json.loads(body)
        except ValueError:
            return False
        ids = {m.get("id") for m in (message if isinstance(message, list) else [message]) if isinstance(m, dict)}
        items = reply if isinstance(reply, list) else [reply]
        if not any(isinstance(r, dict) and r.get("id") in ids and r.get("id") is not None for r in items):
            return False
        self._dispatch(body.decode("utf-8", "replace"))
        return True

    @staticmethod
    def _result_of(reply: dict[str, Any]) -> Any:
        """A reply's ``result``; :class:`RPCError` for an ``error`` reply."""
        if "error" in reply:
            err = reply["error"] if isinstance(reply["error"], dict) else {}
            code = err.get("code")
            raise RPCError(code if isinstance(code, int) else -32603, str(err.get("message", "error")), err.get("data"))
        return reply.get("result")

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        """Send a JSON-RPC notification (no reply, SPEC §2.3)."""
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        await self._post(msg)

    async def request(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """Send one JSON-RPC request and wait for its response on the stream.

        Args:
            method: e.g. ``tools/list``. params: the ``params`` object, omitted when ``None``.
            timeout: seconds to wait for the answer (default: the client's ``timeout``); on
                expiry or cancellation ``notifications/cancelled`` is sent (SPEC §2.3).

        Returns: the ``result`` member.
        Raises: :class:`RPCError` for an ``error`` response, and the transport errors above.
        """
        if self._closed_reason is not None:
            raise self._closed_reason
        req_id = next(self._ids)
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            msg["params"] = params
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = fut
        try:
            if self.transport == "http":  # the answer comes back on the POST itself, however long
                await asyncio.wait_for(self._post(msg), timeout or self.timeout)
            else:
                await self._post(msg)
            reply = await asyncio.wait_for(asyncio.shield(fut), timeout or self.timeout)
        except TimeoutError:
            await self._cancel(req_id)
            raise ConnectError(f"no answer to {method} within {timeout or self.timeout:g} s", "TIMEOUT") from None
        except asyncio.CancelledError:
            await self._cancel(req_id)
            raise
        finally:
            self._pending.pop(req_id, None)
        return self._result_of(reply)

    async def _cancel(self, req_id: int) -> None:
        with contextlib.suppress(MCPClientError):
            await asyncio.wait_for(
                self.notify("notifications/cancelled", {"requestId": req_id, "reason": "client gave up"}), 5.0
            )

    async def initialize(self) -> dict[str, Any]:
        """Run the MCP handshake once (SPEC §2.1); later calls return the first result."""
        if self.server_info is None:
            result = await self.request(
                "initialize",
                {"protocolVersion": self.protocol_version, "capabilities": {}, "clientInfo": client_info()},
            )
            if not isinstance(result, dict):
                raise ProtocolError("initialize returned no result object")
            self.server_info = result
            await self.notify("notifications/initialized")
        return self.server_info

    async def list_tools(self) -> list[dict[str, Any]]:
        """``tools/list``: the tool descriptions (name, description, inputSchema ...), SPEC §2.4."""
        result = await self.request("tools/list", {})
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            raise ProtocolError("tools/list returned no tool list")
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any], *, check: bool = True,
                        timeout: float | None = None, on_progress: ProgressHandler | None = None) -> dict[str, Any]:
        """``tools/call``; returns the ``CallToolResult`` mapping (SPEC §2.5).

        Args:
            check: raise :class:`ToolFailed` (code from ``structuredContent.error.code``) when the
                result has ``isError: true``; with ``False`` the error result is returned as is.
            timeout: seconds to wait for the answer (default: the client's).
            on_progress: called as ``(progress, total | None, message | None)`` for each
                ``notifications/progress`` of this call (a ``_meta.progressToken`` is sent).
        """
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        token = None
        if on_progress is not None:
            token = f"progress-{next(self._ids)}"
            self._progress[token] = on_progress
            params["_meta"] = {"progressToken": token}
        try:
            result = await self.request("tools/call", params, timeout)
        finally:
            if token is not None:
                self._progress.pop(token, None)
        if not isinstance(result, dict):
            raise ProtocolError("tools/call returned no result object")
        if check and result.get("isError"):
            raise tool_failure(result)
        return result

    async def read_resource(
        self, uri: str, encoding: str | None = None, include_metadata: bool = False,
        line_range: tuple[int | None, int | None] | None = None, privileged: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """``resources/read`` of a ``file:`` URI (issue 4); safe to run many at once
        (``asyncio.gather``) on one client: answers are matched by id.

        Args:
            uri: ``file:///abs/path`` (or ``file:relative/path`` inside the workspace); a query
                such as ``?start_line=5&end_line=9&encoding=latin-1`` also works.
            encoding: ``utf-8``, ``ascii``, ``latin-1``, ``cp1252``, ``utf-16`` or ``auto``.
            include_metadata: ask for ``_meta`` (size, lines, encoding, language, sha256 ...).
            line_range: ``(start, end)`` lines, 1-based and inclusive; ``None`` for an open end.
            privileged: read through an mcp-sudo.yaml grant (SPEC §4).

        Returns: the first ``contents`` item: ``{"uri", "mimeType", "text", "_meta"?}``.
        Raises: :class:`ResourceFailed` (``.code`` is the SPEC §2.5 code), :class:`RPCError`, and
            the transport errors.
        """
        params: dict[str, Any] = {"uri": uri, "includeMetadata": include_metadata}
        if encoding is not None:
            params["encoding"] = encoding
        if line_range is not None:
            start, end = line_range
            params["lineRange"] = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
        if privileged:
            params["privileged"] = True
        try:
            result = await self.request("resources/read", params, timeout)
        except RPCError as exc:
            data = exc.data if isinstance(exc.data, dict) else {}
            code, details = data.get("code"), data.get("details")
            if not isinstance(code, str):
                raise
            message = data.get("message")
            raise ResourceFailed(exc.rpc_code, code, message if isinstance(message, str) else exc.message,
                                 details if isinstance(details, dict) else {}) from None
        contents = result.get("contents") if isinstance(result, dict) else None
        if not isinstance(contents, list) or not contents or not isinstance(contents[0], dict):
            raise ProtocolError("resources/read returned no contents")
        item: dict[str, Any] = contents[0]
        return item

    async def list_resource_templates(self) -> list[dict[str, Any]]:
        """``resources/templates/list``: the ``resourceTemplates`` list."""
        result = await self.request("resources/templates/list", {})
        return list(result.get("resourceTemplates", [])) if isinstance(result, dict) else []

    async def close(self) -> None:
        """Close the stream (the server ends the session, SPEC §1.4), or ``DELETE`` the
        Streamable HTTP session, and fail pending requests."""
        if self.session_id is not None and self._http is not None:
            with contextlib.suppress(Exception):
                await self._http.delete(self.mcp_url, timeout=5.0,
                                        headers={**self._headers, "Mcp-Session-Id": self.session_id})
            self.session_id = None
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None
        self._fail_all(ConnectError("client closed"))
        with contextlib.suppress(Exception):
            await self._stack.aclose()


def tool_failure(result: dict[str, Any]) -> ToolFailed:
    """Build :class:`ToolFailed` from an ``isError`` result (code from ``structuredContent``)."""
    structured = result.get("structuredContent")
    err = structured.get("error") if isinstance(structured, dict) else None
    err = err if isinstance(err, dict) else {}
    message = err.get("message")
    if not isinstance(message, str):
        message = text_of(result) or "tool failed"
    raw_details = err.get("details")
    details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
    return ToolFailed(str(err.get("code") or "TOOL_ERROR"), message, details, result)


def text_of(result: dict[str, Any]) -> str:
    """The concatenated ``text`` of a result's text content items."""
    content = result.get("content")
    if not isinstance(content, list):
        return ""
    return "".join(c["text"] for c in content if isinstance(c, dict) and isinstance(c.get("text"), str))


def run_sync(url: str, token: str, cafile: str | None, fn: Callable[[Client], Awaitable[T]],
             timeout: float = 30.0) -> T:
    """Open a :class:`Client`, run ``await fn(client)``, close, and return its value (for scripts)."""

    async def go() -> T:
        async with Client(url, token, cafile, timeout) as c:
            return await fn(c)

    return asyncio.run(go())


def read_resource_sync(url: str, token: str, cafile: str | None, uri: str, timeout: float = 30.0,
                       **options: Any) -> dict[str, Any]:
    """Blocking :meth:`Client.read_resource` (``options``: its keyword arguments) for scripts."""
    return run_sync(url, token, cafile, lambda c: c.read_resource(uri, **options), timeout)


def call_tool_sync(url: str, token: str, cafile: str | None, name: str, arguments: dict[str, Any],
                   timeout: float = 30.0) -> dict[str, Any]:
    """Blocking :meth:`Client.call_tool` (raises :class:`ToolFailed` on a tool error)."""
    return run_sync(url, token, cafile, lambda c: c.call_tool(name, arguments), timeout)
