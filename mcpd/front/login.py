"""``POST /login`` and ``POST /logout`` on the front (docs/REFERENCE.md §5.2).

``POST {base}/login`` takes ``{"user": ..., "password": ...}`` (JSON, at most
:data:`LOGIN_BODY_CAP` bytes, no bearer needed) and forwards it as ``pam_login`` to the policy
process, which applies the lockout, has root run PAM and issues the token. The answer is ``200
{"token", "expires", "user"}`` with the token shown this once, ``401 {"error": "authentication
failed"}`` for every kind of refusal, or ``503`` when nobody can check the password: with
``Retry-After`` when the policy process is not reachable now (the helper unit is restarted),
without it when there is no helper unit at all (development mode: PAM runs only in the root
helper, so retrying cannot help). Logins in flight are bounded, in total (``login.in_flight``) and
per client address (``login.in_flight_per_address``); beyond that, or when the policy process's
login capacity is full, the answer is ``429`` with ``Retry-After`` at once, so a login flood never
holds more than its share of the policy process (docs/REFERENCE.md §5.3). ``POST {base}/logout``
with the bearer revokes that login token (``200``), or answers ``400`` for a static ``users.yaml``
token (rotate those with ``mcpd users rotate``).

The password lives in this process for one request; it is never logged.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mcpd.common import frames
from mcpd.common.config import Login as LoginConfig
from mcpd.common.inflight import InFlight
from mcpd.front import metrics
from mcpd.front.access import AccessLog
from mcpd.front.auth import CHECKER_DOWN_RETRY
from mcpd.front.policy_client.channel import PolicyChannel, PolicyUnavailable
from mcpd.front.transport.body import BodyRefused, read_capped

LOGIN_BODY_CAP = 8192
#: within the policy process's pam_login schema: a longer field would be an alert there
FIELD_CAPS = {"user": 64, "password": 1024}
GENERIC = "authentication failed"
POLICY_BUSY = "the policy process's login capacity is full"
NO_HELPER_UNIT = ("password login needs the helper unit (PAM runs in the root helper only); "
                  "this daemon runs without one")


class LoginUnavailable(Exception):
    """No helper unit to run PAM (development mode), or the policy process is not reachable.

    Args:
        message: the answer's ``error`` text.
        retry_after: seconds for the ``503``'s ``Retry-After`` when the policy process may be back soon;
            ``None`` when it never will (no helper unit).
    """

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def response(self) -> JSONResponse:
        """The ``503`` answer: ``{"error": message}``, with ``Retry-After`` when there is one."""
        headers = {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}
        return JSONResponse({"error": str(self)}, status_code=503, headers=headers)


class LoginBusy(Exception):
    """The policy process's login capacity is full: try again later."""


class LoginBackend(Protocol):
    """Where logins and logouts go (the policy process in production)."""

    async def login(self, user: str, password: str, peer: str) -> dict[str, Any] | None:
        """``{"token", "expires", "os_user"}`` on success, ``None`` on any refusal.

        Raises:
            LoginUnavailable: nobody can check passwords now.
            LoginBusy: too many logins in flight at the policy process.
        """
        ...

    async def revoke(self, token: str) -> bool:
        """Revoke a login token; ``False`` when it is not one (a static token)."""
        ...


class NoLogin:
    """The backend of a front without a helper unit: every login answers 503."""

    async def login(self, user: str, password: str, peer: str) -> dict[str, Any] | None:
        """Always raises :class:`LoginUnavailable`."""
        raise LoginUnavailable(NO_HELPER_UNIT)

    async def revoke(self, token: str) -> bool:
        """Always raises :class:`LoginUnavailable`."""
        raise LoginUnavailable(NO_HELPER_UNIT)


class PolicyLogin:
    """Forwards ``pam_login`` and ``revoke`` to the policy process (which has root run PAM).

    Args:
        client: the channel to the policy process.
        timeout: seconds to wait for PAM (its own delays included).
    """

    def __init__(self, client: PolicyChannel, timeout: float = 60.0) -> None:
        self._client = client
        self._timeout = timeout

    async def _ask(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            reply, fds = await self._client.request(req, timeout=self._timeout)
        except (PolicyUnavailable, TimeoutError):
            raise LoginUnavailable("the policy process is not reachable; retry in a moment",
                                   CHECKER_DOWN_RETRY) from None
        for s in fds:
            s.close()
        return reply

    async def ask(self, req: dict[str, Any]) -> dict[str, Any]:
        """One request of the confirmation page (:mod:`mcpd.front.confirm`) to the policy process.

        Raises:
            LoginUnavailable: the policy process is not reachable.
        """
        return await self._ask(req)

    async def login(self, user: str, password: str, peer: str) -> dict[str, Any] | None:
        """See :class:`LoginBackend`."""
        reply = await self._ask({"type": "pam_login", "user": user, "password": password, "peer": peer})
        if (reply.get("error") or {}).get("details", {}).get("reason") == "busy":
            raise LoginBusy(POLICY_BUSY)
        if not reply.get("ok") or not isinstance(reply.get("token"), str):
            return None
        return {"token": reply["token"], "expires": reply.get("expires"), "os_user": reply.get("os_user")}

    async def revoke(self, token: str) -> bool:
        """See :class:`LoginBackend`."""
        reply = await self._ask({"type": "revoke", "token": token})
        return bool(reply.get("ok"))


async def _read_capped(request: Request, cap: int) -> bytes | None:
    try:
        return await read_capped(request, cap)
    except BodyRefused:
        return None


def _peer(request: Request) -> str:
    return request.client.host if request.client else "unknown"


class LoginRoutes:
    """The two routes over one :class:`LoginBackend`.

    Args:
        backend: where logins go.
        cfg: ``login`` of mcpd.yaml: ``in_flight``, ``in_flight_per_address`` (counts) and
            ``answer_seconds`` (the ``Retry-After`` of a ``429``, rounded up).
    """

    def __init__(self, backend: LoginBackend, cfg: LoginConfig) -> None:
        self.backend, self.cfg = backend, cfg
        self.access: AccessLog | None = None  # set by build_app: the logins refused here are recorded there
        #: password checks in flight, in all and per address: POST /login's and the confirmation page's together
        self.in_flight = InFlight(cfg.in_flight_per_address, cfg.in_flight)

    def routes(self) -> list[Route]:
        """``POST /login`` and ``POST /logout``."""
        return [Route("/login", self.login, methods=["POST"]), Route("/logout", self.logout, methods=["POST"])]

    async def login(self, request: Request) -> Response:
        """``POST /login``: see the module docstring."""
        peer = _peer(request)
        if self.in_flight.take(peer) is not None:
            self._refused(peer, None, 429, "too many logins in flight")
            return self._busy()
        try:
            return await self._login(request, peer)
        except LoginBusy:
            self._refused(peer, None, 429, POLICY_BUSY)
            return self._busy()
        finally:
            self.in_flight.release(peer)

    def _refused(self, peer: str, user: Any, status: int, reason: str) -> None:
        if self.access is not None:
            self.access.login_refused(peer, user, status, reason)

    def _busy(self) -> Response:
        metrics.LOGINS_REFUSED.labels("429").inc()
        metrics.limit_hit("logins_in_flight")
        return JSONResponse({"error": "too many logins in flight; try again later"}, status_code=429,
                            headers={"Retry-After": str(math.ceil(self.cfg.answer_seconds) + 1)})

    async def _login(self, request: Request, peer: str) -> Response:
        if (request.headers.get("content-type") or "").split(";")[0].strip().lower() != "application/json":
            self._refused(peer, None, 415, "content type must be application/json")
            return JSONResponse({"error": "content type must be application/json"}, status_code=415)
        body = await _read_capped(request, LOGIN_BODY_CAP)
        if body is None:
            metrics.limit_hit("body_bytes")
            self._refused(peer, None, 413, "body too large")
            return JSONResponse({"error": "body too large"}, status_code=413)
        try:
            data = frames.loads(body)
        except frames.FrameError:  # not JSON, or nested deeper than 64 levels
            data = None
        if not isinstance(data, dict) or set(data) != set(FIELD_CAPS) or not all(
            isinstance(v, str) and 0 < len(v) <= FIELD_CAPS[k] for k, v in data.items()
        ):
            self._refused(peer, data.get("user") if isinstance(data, dict) else None, 400, "malformed login request")
            return JSONResponse({"error": 'expected {"user": string (at most 64 characters), "password": string}'},
                                status_code=400)
        try:
            outcome = await self.backend.login(data["user"], data["password"], peer)
        except LoginUnavailable as exc:
            self._refused(peer, data["user"], 503, "no policy process to check passwords")
            return exc.response()
        if outcome is None:
            metrics.LOGINS_REFUSED.labels("401").inc()
            return JSONResponse({"error": GENERIC}, status_code=401)
        return JSONResponse({"token": outcome["token"], "expires": outcome["expires"], "user": outcome["os_user"]},
                            headers={"Cache-Control": "no-store"})

    async def logout(self, request: Request) -> Response:
        """``POST /logout`` with the bearer (checked by the middleware): revoke that login token."""
        token: str = request.user.token
        try:
            revoked = await self.backend.revoke(token)
        except LoginUnavailable as exc:
            return exc.response()
        if not revoked:
            return JSONResponse({"error": "not a login token; static tokens are changed with mcpd users rotate"},
                                status_code=400)
        return JSONResponse({"revoked": True})
