"""One MCP session as a client sees it, over either transport: JSON-RPC requests matched by id.

- ``"sse"`` (the default): ``GET /sse`` with the bearer token, then the ``endpoint`` event; a
  reader task hands every ``message`` event to the future of the request with the same ``id``,
  so concurrent requests are matched in any order (docs/REFERENCE.md §1.5).
- ``"http"``: Streamable HTTP at ``/mcp``: ``initialize`` is POSTed, its ``Mcp-Session-Id`` goes
  with every later POST, each POST's answer (JSON, or an event stream with the call's progress
  and then its reply) is dispatched the same way, and closing sends ``DELETE``.
- ``"auto"``: ``"http"``, falling back to ``"sse"`` when the ``initialize`` POST answers ``400``,
  ``404`` or ``405`` (the specification's backwards compatibility). A URL ending in ``/sse`` or
  ``/mcp`` names the transport itself.

MCP's own requests (tools, resources) are :class:`mcpd.client.api.Client`'s; errors are
:mod:`mcpd.client.errors`', a refusal by HTTP status :class:`~mcpd.client.refusal.HTTPRefused`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Callable
from typing import Any, Self

import httpx
from httpx_sse import EventSource, SSEError, aconnect_sse

from mcpd.client.endpoints import endpoints, ssl_context, transport_error
from mcpd.client.errors import AuthError, ConnectError, MCPClientError, ProtocolError, RPCError, UsageError
from mcpd.client.refusal import HTTPRefused, read_refusal
from mcpd.common.version import version

PROTOCOL_VERSION = "2025-06-18"
CLIENT_NAME = "mcpd-client"
TRANSPORTS = ("auto", "http", "sse")
FALLBACK_STATUSES = frozenset({400, 404, 405})  # a POST to /mcp answered so: try the old transport


def client_info() -> dict[str, str]:
    """The ``clientInfo`` sent in ``initialize``: this client's name and the package's version."""
    return {"name": CLIENT_NAME, "version": version()}


ProgressHandler = Callable[[float, "float | None", "str | None"], None]


class Session:
    """One MCP session over Streamable HTTP or SSE (docs/REFERENCE.md §1, §2): the handshake,
    requests and notifications matched by id, and the close; an async context manager.
    :class:`mcpd.client.api.Client` adds MCP's tool and resource requests.

    Args:
        url: server base URL (``https://127.0.0.1:9091``, ``/mcp`` or ``/sse`` appended).
        token: the bearer token (never logged, never put in a URL).
        cafile: PEM file of the CA to trust; ``None`` uses the system trust store.
        timeout: seconds to wait for connecting, each POST, and each response.
        auto_initialize: run the handshake on entry (Streamable HTTP always does).
        protocol_version: the version requested in ``initialize`` (docs/REFERENCE.md §2.1).
        transport: ``"sse"``, ``"http"`` or ``"auto"`` (the module docstring); a URL ending in
            ``/mcp`` or ``/sse`` overrides ``"auto"``; :attr:`transport` is the one in use.

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

    async def __aenter__(self) -> Self:
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
        and wait (``timeout`` s) for the ``endpoint`` event (docs/REFERENCE.md §1.2)."""
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
            raise transport_error(exc) from None
        status = source.response.status_code
        if status == 401:
            raise AuthError("authentication failed (401): check the token")
        if status != 200:
            raise await read_refusal(f"GET {self.url}", source.response)
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
            reason = transport_error(exc)
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
            raise transport_error(exc) from None
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
            raise transport_error(exc) from None
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
        """Send a JSON-RPC notification (no reply, docs/REFERENCE.md §2.3)."""
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        await self._post(msg)

    async def request(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """Send one JSON-RPC request and wait for its response on the stream.

        Args:
            method: e.g. ``tools/list``. params: the ``params`` object, omitted when ``None``.
            timeout: seconds to wait for the answer (default: the client's ``timeout``); on
                expiry or cancellation ``notifications/cancelled`` is sent (docs/REFERENCE.md §2.3).

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
        """Run the MCP handshake once (docs/REFERENCE.md §2.1); later calls return the first result."""
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

    async def close(self) -> None:
        """Close the stream (the server ends the session, docs/REFERENCE.md §1.4), or ``DELETE`` the
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
