"""The front's side of the root helper socket (SPEC §4.1, §5.1; docs/PRIVSEP.md).

The front never decides anything privileged. It forwards: token checks
(:class:`HelperAuthenticator`), worker spawning for OS accounts (:class:`HelperSpawner`), and
privileged calls (:class:`HelperBackend`). Each request uses its own short connection, so a helper
that dies or restarts fails only the requests in flight: they answer ``HELPER_UNAVAILABLE``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import socket
import time
from typing import Any

from mcpd.common import frames
from mcpd.common.errors import HELPER_UNAVAILABLE, INTERNAL_ERROR, ToolError
from mcpd.common.identity import Principal
from mcpd.front.limits import CAP_KEY
from mcpd.core.tools import DEADLINE_MARGIN, deadline_seconds

log = logging.getLogger("mcpd.front.helper_client")

_UNAVAILABLE = "privileged reads are unavailable: the root helper is not running"


class HelperUnavailable(Exception):
    """The helper socket is missing, refused, or closed before answering."""


class HelperClient:
    """Sends one request frame per connection to the helper at ``path`` and reads the reply.

    Args:
        path: the helper's Unix socket (``helper_socket`` in mcpd.yaml).
        reply_cap: the largest reply frame accepted, in bytes.
        connect_timeout: seconds to wait for the connection.
    """

    def __init__(self, path: str, reply_cap: int, connect_timeout: float = 5.0) -> None:
        self.path = path
        self.reply_cap = reply_cap
        self.connect_timeout = connect_timeout
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="helper-fd")

    async def request(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send ``req`` and return the reply object.

        Raises:
            HelperUnavailable: no helper, or it closed the connection without a reply.
            TimeoutError: no reply within ``timeout`` seconds.
        """
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_unix_connection(self.path, limit=2**20)
        except (OSError, TimeoutError) as exc:
            raise HelperUnavailable(str(exc)) from None
        try:
            await frames.write_frame(writer, req)
            async with asyncio.timeout(timeout):
                reply = await frames.read_frame(reader, self.reply_cap)
        except (OSError, frames.FrameError) as exc:
            raise HelperUnavailable(str(exc)) from None
        finally:
            writer.close()
        if reply is None:
            raise HelperUnavailable("the helper closed the connection")
        return reply

    def _spawn_blocking(self, os_user: str) -> tuple[socket.socket, int]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            try:
                s.connect(self.path)
                frames.send_frame(s, {"type": "spawn_worker", "os_user": os_user})
                data, fds, _flags, _addr = socket.recv_fds(s, frames.HELPER_REQUEST_CAP, 1)
            except OSError as exc:
                raise HelperUnavailable(str(exc)) from None
            sockets = [socket.socket(fileno=fd) for fd in fds]
            try:
                if len(data) < frames.HEADER.size:
                    raise HelperUnavailable("the helper closed the connection")
                (length,) = frames.HEADER.unpack(data[: frames.HEADER.size])
                frames.check_length(length, frames.HELPER_REQUEST_CAP)
                body = data[frames.HEADER.size :]
                while len(body) < length:
                    chunk = s.recv(length - len(body))
                    if not chunk:
                        raise HelperUnavailable("the helper closed the connection")
                    body += chunk
                reply = frames.decode_body(body)
            except BaseException:
                for sock in sockets:
                    sock.close()
                raise
        if not reply.get("ok"):
            for sock in sockets:
                sock.close()
            raise ToolError.from_dict(reply.get("error"))
        pid = reply.get("pid")
        if len(sockets) != 1 or not isinstance(pid, int):
            for sock in sockets:
                sock.close()
            raise ToolError(INTERNAL_ERROR, "internal error")
        return sockets[0], pid

    async def spawn_worker(self, os_user: str) -> tuple[socket.socket, int]:
        """Ask the helper for a worker running as ``os_user``; its socket arrives by SCM_RIGHTS."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, self._spawn_blocking, os_user)


class HelperSpawner:
    """A :class:`mcpd.front.pool.Spawner` whose workers the root helper starts with the account's
    uid, gid and groups (DESIGN.md "worker")."""

    def __init__(self, client: HelperClient) -> None:
        self._client = client

    async def spawn(self, os_user: str) -> tuple[socket.socket, int]:
        """Start one worker for ``os_user``.

        Raises:
            ToolError: ``HELPER_UNAVAILABLE`` when the helper is down, or its refusal
                (e.g. ``PERMISSION_DENIED`` for an account no principal maps to).
        """
        try:
            return await self._client.spawn_worker(os_user)
        except HelperUnavailable:
            raise ToolError(HELPER_UNAVAILABLE, "cannot start a worker: the root helper is not running") from None

    async def kill(self, pid: int) -> None:
        """Ask the helper to SIGKILL and reap worker ``pid``; a down helper is logged, not raised."""
        try:
            await self._client.request({"type": "kill_worker", "pid": pid}, timeout=10)
        except (HelperUnavailable, TimeoutError):
            log.warning("could not kill worker %d: the root helper is not reachable", pid)


class HelperAuthenticator:
    """An :class:`mcpd.front.auth.Authenticator` that asks the helper (which alone reads ``users.yaml``).

    Args:
        client: the helper connection factory.
        cache_seconds: while the helper is unreachable, a token it verified within this many
            seconds is still accepted, so sessions go on during a helper restart. The cache key is
            a SHA-256 of the token; the token itself is never kept. A token the helper refuses is
            dropped from the cache at once.
    """

    def __init__(self, client: HelperClient, cache_seconds: float) -> None:
        self._client = client
        self._cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, Principal]] = {}

    async def authenticate(self, token: str) -> Principal | None:
        """The token's principal, or ``None`` (the front answers 401)."""
        key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        try:
            reply = await self._client.request({"type": "authenticate", "token": token}, timeout=10)
        except (HelperUnavailable, TimeoutError):
            cached = self._cache.get(key)
            if cached and time.monotonic() - cached[0] <= self._cache_seconds:
                return cached[1]
            return None
        p = reply.get("principal")
        if not reply.get("ok") or not isinstance(p, dict):
            self._cache.pop(key, None)
            return None
        try:
            principal = Principal(name=str(p["name"]), os_user=str(p["os_user"]), token_id=str(p["token_id"]))
        except KeyError:
            return None
        if len(self._cache) > 10000:
            self._cache.clear()
        self._cache[key] = (time.monotonic(), principal)
        return principal


class HelperBackend:
    """The :class:`mcpd.front.privileged.PrivilegedBackend` that forwards to the root helper (SPEC §4.1).

    Args:
        client: the helper connection factory.
        timeout: seconds to wait for the helper's answer (its own child deadline plus margin);
            a call with ``time_budget_seconds`` (files/find) waits that budget plus two margins.
    """

    def __init__(self, client: HelperClient, timeout: float) -> None:
        self._client = client
        self._timeout = timeout

    async def call(
        self, token: str, principal: Principal, session_id: str, peer: str, op: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        """Forward one privileged call; return the op's result dict.

        Raises:
            ToolError: the helper's refusal or failure; ``HELPER_UNAVAILABLE`` when it is down
                or dies mid-request.
        """
        args = dict(args)
        cap = args.pop(CAP_KEY, None)  # the principal's max_file_bytes (mcpd/limits.py) travels apart
        req = {"type": "privileged_call", "token": token, "session": session_id, "peer": peer, "op": op, "args": args}
        if cap is not None:
            req["cap"] = cap
        try:
            timeout = max(self._timeout, deadline_seconds(args, 0.0) + DEADLINE_MARGIN)
            reply = await self._client.request(req, timeout=timeout)
        except HelperUnavailable:
            raise ToolError(HELPER_UNAVAILABLE, _UNAVAILABLE) from None
        except TimeoutError:
            raise ToolError(HELPER_UNAVAILABLE, "the root helper did not answer in time") from None
        if reply.get("ok"):
            result = reply.get("result")
            if not isinstance(result, dict):
                raise ToolError(INTERNAL_ERROR, "internal error")
            return result
        raise ToolError.from_dict(reply.get("error"))
