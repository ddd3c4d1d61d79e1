"""Server-Sent Events encoding: a JSON-RPC message as one ``message`` event, the ``endpoint``
event of ``GET /sse``, the keep-alive comment, and a large event cut into pieces for writing.

Every event is encoded once, as bytes, and never copied into a string again. Writing events to a
stream is ``mcpd.front.sessions.session`` (a session's GET stream) and
``mcpd.front.transport.answers`` (a ``POST /mcp`` answered as an event stream).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sse_starlette import ServerSentEvent

from mcpd.common import wirejson
from mcpd.front.connections.handover import PIECE

#: The headers of every event-stream response: no cache or proxy may hold the events back.
STREAM_HEADERS = {"Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"}

#: A keep-alive comment, encoded.
PING = ServerSentEvent(comment="ping", sep="\n").encode()


def encode_message(message: Any) -> bytes:
    """One JSON-RPC message (object or array) as compact UTF-8 JSON on one line: U+0085, U+2028
    and U+2029, where line readers built on ``str.splitlines`` (httpx's among them) would break
    it, are escaped (:func:`mcpd.common.wirejson.dumps_line`)."""
    return wirejson.dumps_line(message)


def message_event(message: Any) -> bytes:
    """One JSON-RPC message as a whole SSE ``message`` event, ready to send: encoded once, and
    never split or copied into a string again (what ``ServerSentEvent`` would do with its data)."""
    return event_of(encode_message(message))


def event_of(data: bytes) -> bytes:
    """An SSE ``message`` event around one message already encoded by :func:`encode_message`."""
    return b"event: message\ndata: " + data + b"\n\n"


#: What :func:`event_of` puts after an event's data, and before it: a large event is written as
#: the head, its data a piece at a time (:func:`pieces`), then the end.
EVENT_END = b"\n\n"
EVENT_HEAD = event_of(b"")[:-len(EVENT_END)]


def endpoint_event(url: str) -> bytes:
    """The ``endpoint`` event that opens a ``GET /sse`` stream: ``url`` is where its client POSTs."""
    return ServerSentEvent(event="endpoint", data=url, sep="\n").encode()


def pieces(data: bytes) -> Iterator[bytes]:
    """``data`` in pieces of at most :data:`~mcpd.front.connections.handover.PIECE` bytes, in order, each
    made when asked for (an event written a piece at a time, each once the transport takes more:
    a client that stops reading then leaves at most about a piece in the transport, not the event)."""
    for start in range(0, len(data), PIECE):
        yield data[start:start + PIECE]
