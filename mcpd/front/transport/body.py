"""Reading a request body without ever buffering past a cap (SPEC §1.3: 413, never buffered)."""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request


class BodyRefused(Exception):
    """The body was not read: ``status`` is 413 (over the cap) or 400 (bad ``Content-Length`` or
    the client went away); ``reason`` is a short text for the response."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


async def read_capped(request: Request, cap: int) -> bytes:
    """The request body, at most ``cap`` bytes.

    A declared ``Content-Length`` over ``cap`` is refused before reading anything; otherwise the
    stream is read chunk by chunk and abandoned as soon as it passes ``cap``.

    Raises:
        BodyRefused: 413 over the cap; 400 for a malformed ``Content-Length`` or a disconnect.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BodyRefused(400, "bad content-length")
        if int(declared) > cap:
            raise BodyRefused(413, "body too large")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise BodyRefused(413, "body too large")
            chunks.append(chunk)
    except ClientDisconnect:
        raise BodyRefused(400, "client disconnected") from None
    return b"".join(chunks)
