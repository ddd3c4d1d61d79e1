"""The confirmation page (``GET``/``POST {base}/confirm/<id>``, docs/REFERENCE.md §4.7); the
input-required answer and the elicitation that point to it are :mod:`mcpd.front.mcp.confirm`.

The page is the front's own, over its own TLS: one HTML document, no script at all, no resource
from anywhere (``Content-Security-Policy: default-src 'none'``, its one inline style allowed by
hash, ``form-action 'self'``, ``frame-ancestors 'none'``), ``no-store``, no referrer to other sites (``same-origin``: with ``no-referrer`` a browser sends ``Origin: null``). Its form
carries the record's CSRF token; a ``POST`` is taken only with that token and, when the browser
sends an ``Origin``, only from this page's own origin. The password goes to the policy process
(root's PAM) and is never logged. What the policy process says is shown; nothing is decided here.
"""

from __future__ import annotations

import base64
import hashlib
import html
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from mcpd.common import frames
from mcpd.common.inflight import InFlight
from mcpd.common.printable import printable
from mcpd.front.login import LoginUnavailable, PolicyLogin
from mcpd.front.mcp.confirm import ID, PREFIX
from mcpd.front.transport.body import BodyRefused, read_capped

FORM_CAP = 8192

STYLE = ("body{font-family:sans-serif;max-width:34em;margin:3em auto;padding:0 1em;color:#222}"
         "h1{font-size:1.4em}dl{display:grid;grid-template-columns:auto 1fr;gap:.3em 1em}"
         "dt{font-weight:bold}dd{margin:0;word-break:break-all}label{display:block;margin:.6em 0}"
         "input[type=text],input[type=password]{width:100%;padding:.4em}"
         "button{margin:.8em .6em 0 0;padding:.5em 1.2em}.note{color:#555}.err{color:#a00}")
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
CSP = (f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; form-action 'self'; frame-ancestors 'none'; "
       "base-uri 'none'")
HEADERS = {"Content-Security-Policy": CSP, "Cache-Control": "no-store", "Referrer-Policy": "same-origin",
           "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff"}


# ---------------------------------------------------------------- the page


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    doc = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
           f"<meta name=\"viewport\" content=\"width=device-width\"><style>{STYLE}</style></head>"
           f"<body><h1>{html.escape(title)}</h1>{body}</body></html>")
    return HTMLResponse(doc, status_code=status, headers=HEADERS)


def _facts(view: dict[str, Any]) -> str:
    rows = [("Who asks", f"{view['principal']} (account {view['os_user']})"), ("Tool", view["op"]),
            ("Path", view["path"])]
    if view.get("resolves_to") and view["resolves_to"] != view["path"]:  # through a symlink: what is read
        rows.append(("Resolves to", view["resolves_to"]))
    if view.get("why"):
        rows.append(("Stated reason", view["why"]))
    rows.append(("Expires in", f"{view['expires_in']} s"))
    # the agent chose the path and the reason: controls, bidirectional overrides and invisible
    # characters are shown as escapes, so what the approver reads is what is asked
    return "<dl>" + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(printable(str(v)))}</dd>"
                            for k, v in rows) + "</dl>"


def _form(action: str, view: dict[str, Any], error: str = "") -> str:
    signin = view["kind"] == "signin"
    intro = (f"Sign in as <b>{html.escape(view['os_user'])}</b> to allow this one call."
             if signin else "Sign in as an approver, then approve or deny this call.")
    buttons = ('<button type="submit" name="decision" value="signin">Sign in</button>' if signin else
               '<button type="submit" name="decision" value="approve">Approve</button>'
               '<button type="submit" name="decision" value="deny">Deny</button>')
    user = html.escape(view["os_user"]) if signin else ""
    err = f'<p class="err">{html.escape(error)}</p>' if error else ""
    return (f"{_facts(view)}<p>{intro}</p>{err}<form method=\"post\" action=\"{html.escape(action)}\">"
            f"<input type=\"hidden\" name=\"csrf\" value=\"{html.escape(view['csrf'])}\">"
            f"<label>Account <input type=\"text\" name=\"user\" value=\"{user}\" autocomplete=\"username\" "
            f"required></label><label>Password <input type=\"password\" name=\"password\" "
            f"autocomplete=\"current-password\" required></label>{buttons}</form>"
            "<p class=\"note\">This page is for one call only and expires soon.</p>")


GONE = "This link is unknown, used or expired."


class ConfirmRoutes:
    """``GET`` and ``POST {base}/confirm/<id>`` over the policy process (through the login backend's
    channel: ``confirm_view``, ``confirm_answer``); no bearer token (the password is the credential)."""

    def __init__(self, login: Any, in_flight: InFlight) -> None:
        """``login``: the login backend; ``in_flight``: the count of password checks POST /login
        takes too (:attr:`mcpd.front.login.LoginRoutes.in_flight`), one limit for both."""
        self.login = login
        self._in_flight = in_flight
    def routes(self) -> list[Route]:
        """The page's two routes, and ``POST /approve/<id>`` (an approver's bearer token)."""
        return [Route(PREFIX + "{cid}", self.show, methods=["GET"]),
                Route(PREFIX + "{cid}", self.answer, methods=["POST"]),
                Route("/approve/{cid}", self.decide, methods=["POST"])]

    async def decide(self, request: Request) -> Response:
        """``POST {base}/approve/<id>`` with the approver's bearer token (checked by the middleware)
        and ``{"decision": "approve" | "deny"}`` (``linuxctl approve``): ``200 {message, view}``
        when decided, ``403 {error}`` when refused, ``404`` for an unknown, used or expired id."""
        cid = request.path_params["cid"]
        try:
            data = frames.loads(await read_capped(request, FORM_CAP))
        except (BodyRefused, frames.FrameError):
            data = None
        if not isinstance(data, dict) or data.get("decision") not in ("approve", "deny"):
            return JSONResponse({"error": 'expected {"decision": "approve" or "deny"}'}, status_code=400)
        if not ID.fullmatch(cid):
            return JSONResponse({"error": GONE}, status_code=404)
        peer = request.client.host if request.client else "unknown"
        reply = await self._ask({"type": "confirm_decide", "token": request.user.token, "cid": cid,
                                 "decision": data["decision"], "peer": peer})
        if reply is None:
            return JSONResponse({"error": "the policy process is not reachable"}, status_code=503,
                                headers={"Retry-After": "5"})
        if reply.get("ok"):
            return JSONResponse({"message": reply.get("message"), "view": reply.get("view")})
        message = str(reply.get("message") or (reply.get("error") or {}).get("message") or "refused")
        return JSONResponse({"error": message}, status_code=404 if message.startswith("this link") else 403)

    async def _ask(self, req: dict[str, Any]) -> dict[str, Any] | None:
        if not isinstance(self.login, PolicyLogin):
            return None
        try:
            return await self.login.ask(req)
        except LoginUnavailable:
            return None

    async def show(self, request: Request) -> Response:
        """The page: what is asked, by whom, and the form (or :data:`GONE`, ``404``)."""
        cid = request.path_params["cid"]
        reply = await self._ask({"type": "confirm_view", "cid": cid}) if ID.fullmatch(cid) else None
        if reply is None or not reply.get("ok") or not isinstance(reply.get("view"), dict):
            return _page("Confirmation", f"<p>{GONE}</p>", 404)
        view = reply["view"]
        title = "Sign in to allow a privileged read" if view["kind"] == "signin" else "Approve a privileged read"
        return _page(title, _form(request.url.path, view))

    async def answer(self, request: Request) -> Response:
        """The form's ``POST``: CSRF token and origin checked, then the policy process's answer
        shown; as many in flight as ``POST /login`` allows (in all, per address), else ``429``."""
        peer = request.client.host if request.client else "unknown"
        if self._in_flight.take(peer) is not None:
            return _page("Busy", "<p>Too many sign-ins in flight; try again in a moment.</p>", 429)
        try:
            return await self._answer(request, peer)
        finally:
            self._in_flight.release(peer)

    async def _answer(self, request: Request, peer: str) -> Response:
        cid = request.path_params["cid"]
        origin = request.headers.get("origin")
        own = f"https://{request.headers.get('host', '')}"
        if origin is not None and origin != own:
            return _page("Refused", "<p>This form may only be sent from its own page.</p>", 403)
        try:
            body = await read_capped(request, FORM_CAP)
        except BodyRefused:
            return _page("Refused", "<p>The form is too large.</p>", 413)
        try:
            form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace"), max_num_fields=8).items() if v}
        except ValueError:  # more fields than the form has
            return _page("Refused", "<p>The form has too many fields.</p>", 400)
        if not ID.fullmatch(cid):
            return _page("Confirmation", f"<p>{GONE}</p>", 404)
        fields = {k: form.get(k, "") for k in ("csrf", "user", "password", "decision")}
        if not fields["csrf"] or len(fields["csrf"]) > 64:  # the policy process records the refusal (no PAM)
            await self._ask({"type": "confirm_answer", "cid": cid, "peer": peer, "csrf": "", "user": "",
                             "password": "", "decision": ""})
            return _page("Refused", "<p>The form's token is missing: reload the page.</p>", 403)
        if not (0 < len(fields["user"]) <= 64 and 0 < len(fields["password"]) <= 1024 and len(fields["decision"]) <= 16):
            return _page("Refused", "<p>Account and password are required.</p>", 400)
        reply = await self._ask({"type": "confirm_answer", "cid": cid, "peer": peer, **fields})
        if reply is None:
            return _page("Unavailable", "<p>The policy process is not reachable; try again in a moment.</p>", 503)
        message = str(reply.get("message") or "")
        if reply.get("ok"):
            return _page("Done", f"<p>{html.escape(message)}</p><p class=\"note\">You may close this page.</p>")
        if message.startswith("this link"):
            return _page("Refused", f"<p class=\"err\">{html.escape(message)}</p>", 404)
        again = f'<p><a href="{html.escape(request.url.path)}">Try again</a></p>'
        return _page("Refused", f"<p class=\"err\">{html.escape(message)}</p>{again}", 403)
