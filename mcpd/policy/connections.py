"""The policy process's front connections and its accept loop.

The front keeps a few persistent connections and multiplexes requests on them by ``id``. Each
request is checked against the table (:mod:`mcpd.policy.requests`); a full capacity class
answers ``HELPER_UNAVAILABLE`` (reason ``busy``) at once; privileged calls run on their
connection's thread (:meth:`Connection.serve`). Anything malformed (a frame over the cap, a body
that is not one JSON object, an unknown type, a schema break, a frame not finished within
:data:`FRAME_SECONDS`) is an audit ``alert`` and ends that connection; it never kills a thread.
The accept loop (:func:`serve`) takes connections from the service user only and runs the
workers' sweep (:mod:`mcpd.policy.workers`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from mcpd.common import frames
from mcpd.helper.wire.errors import HELPER_UNAVAILABLE, INTERNAL_ERROR, ToolError
from mcpd.helper.wire.requests import Request
from mcpd.policy.requests import CLASSES, check_request
from mcpd.policy.state import Refused, State
from mcpd.policy.workers import REVOKE_SECONDS, end_revoked, reap, untaken

log = logging.getLogger("mcpd.policy")

FRAME_SECONDS = 5.0  # a frame whose first byte arrived must be complete within this many seconds
MAX_CONNECTIONS = 32  # the front's shared connections, one per privileged call in flight, and reconnects
_PEERCRED = struct.Struct("3i")
_ENDED = (errno.EAGAIN, errno.EPIPE, errno.ECONNRESET, errno.EBADF)  # a send error that ends a connection


class Connection:
    """One persistent front connection: a reader thread and replies sent under one lock, each
    send waiting at most :data:`~mcpd.helper.wire.frames.SEND_SECONDS` for the front to read."""

    def __init__(self, state: State, sock: socket.socket, peer: str,
                 pools: dict[str, tuple[concurrent.futures.ThreadPoolExecutor, threading.Semaphore]]) -> None:
        self.state, self.sock, self.peer, self.pools = state, sock, peer, pools
        self._send = threading.Lock()
        self._buf = bytearray()
        frames.limit_sends(sock, frames.SEND_SECONDS)

    def reply(self, rid: int, reply: dict[str, Any]) -> None:
        """Send one reply frame with the request's id; its descriptors (``reply["_fds"]``,
        sockets, closed here) travel with its first byte. ``reply["_sent"]``, when given, is
        called once with whether they reached the front: right after that byte, before the rest
        of the frame (so what it records is written before the front can act on the reply), or
        after the send failed. A send that fails, or that the front does not take within
        :data:`~mcpd.helper.wire.frames.SEND_SECONDS` (an alert), ends this connection: a front that
        stops reading holds no thread longer, and no reply is lost silently; except when only the
        descriptors could not be passed (``ETOOMANYREFS``: nothing was sent), when that request
        alone is answered ``INTERNAL_ERROR`` instead."""
        extra = reply.pop("_fds", [])
        sent: Callable[[bool], None] | None = reply.pop("_sent", None)
        data = frames.encode(dict(reply, id=rid, **({"fds": len(extra)} if extra else {})))
        delivered = False
        try:
            with self._send:
                if extra:
                    socket.send_fds(self.sock, [data[:1]], [s.fileno() for s in extra])
                    delivered = True
                    if sent is not None:
                        sent(True)
                self.sock.sendall(data[1:] if extra else data)
        except OSError as exc:
            if extra and not delivered and exc.errno not in _ENDED:  # (ETOOMANYREFS): nothing was sent
                failed = {"ok": False, "error": ToolError(INTERNAL_ERROR, "the reply's descriptors could not be sent "
                                                          f"({errno.errorcode.get(exc.errno or 0, exc.errno)})").to_dict()}
                for s in extra:
                    s.close()
                extra = []
                if sent is not None:
                    sent(False)
                    sent = None
                self.reply(rid, failed)  # that call fails, the connection goes on
                return
            self._end(exc)
        except Exception as exc:  # the frame may be cut short: this connection cannot go on
            self._end(exc)
        finally:
            for s in extra:
                s.close()
        if sent is not None and not delivered:
            sent(False)

    def _end(self, exc: BaseException) -> None:
        """End this connection after a reply's send failed with ``exc`` (an alert when it timed
        out); called in the ``except`` block."""
        if isinstance(exc, BlockingIOError):  # SO_SNDTIMEO
            self.state.audit.record("alert", peer=self.peer, reason="the front did not take a reply in time")
        elif not isinstance(exc, OSError):
            log.exception("a reply failed")
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def _run(self, entry: Request, req: dict[str, Any], slot: threading.Semaphore) -> None:
        try:
            reply = entry.handler(self.state, req)
        except ToolError as exc:
            reply = {"ok": False, "error": exc.to_dict()}
        except Refused as exc:
            self.state.audit.record("alert", peer=self.peer, reason=str(exc))
            self.sock.shutdown(socket.SHUT_RDWR)
            return
        except Exception:
            log.exception("request %s failed", entry.name)
            reply = {"ok": False, "error": ToolError(INTERNAL_ERROR, "internal error").to_dict()}
        finally:
            slot.release()
        self.reply(req["id"], reply)

    def _read_frame(self) -> dict[str, Any] | None:
        """The next request, read through a buffer: one ``recv`` per request as a rule (a frame
        usually arrives whole). A frame whose first byte arrived must be complete within
        :data:`FRAME_SECONDS`. Returns None at a clean end of the connection."""
        started = None
        while True:
            if (body := frames.take_frame(self._buf, frames.HELPER_REQUEST_CAP)) is not None:
                return frames.decode_body(body)
            if self._buf:  # inside a frame
                started = started or time.monotonic()
                left = started + FRAME_SECONDS - time.monotonic()
                if left <= 0 or not frames.ready([self.sock.fileno()], left):
                    raise Refused("half-sent frame timed out")
            chunk = self.sock.recv(frames.READ_CHUNK)
            if not chunk:
                if self._buf:
                    raise frames.FrameError("connection closed inside a frame")
                return None
            self._buf += chunk

    def serve(self) -> None:
        """Read requests until the front closes the connection or misbehaves (an ``alert``).

        A privileged call runs on this thread before the next request is read: the front gives
        each privileged call a connection of its own, so nothing waits behind it, and no thread
        hand-over (a wake-up and a GIL transfer) lies on the privileged route's critical path.
        Other requests go to their capacity class's threads."""
        try:
            while (req := self._read_frame()) is not None:
                entry = check_request(req)
                cls = entry.pool
                pool, slot = self.pools[cls]
                if not slot.acquire(blocking=False):
                    if entry.name == "privileged_call":  # received, so recorded here (the front does not)
                        self.state.audit.record("reject", tool=req["op"], route="privileged", session=req["session"],
                                                peer=req["peer"], decision="reject", reason="the policy process is busy",
                                                outcome=HELPER_UNAVAILABLE)
                    self.reply(req["id"], {"ok": False, "error": ToolError(HELPER_UNAVAILABLE, "the policy process is busy", reason="busy").to_dict()})
                    continue
                if cls == "call":  # on this thread: no hand-over on the privileged route's critical path
                    self._run(entry, req, slot)
                else:
                    pool.submit(self._run, entry, req, slot)
        except Refused as exc:
            self.state.audit.record("alert", peer=self.peer, reason=str(exc)[:200])
        except (frames.FrameError, RecursionError) as exc:
            self.state.audit.record("alert", peer=self.peer, reason=f"malformed frame: {str(exc)[:200]}")
        except OSError:
            pass
        finally:
            self.sock.close()


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the peer from ``SO_PEERCRED`` (the kernel's word, not the peer's)."""
    pid, uid, gid = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return pid, uid, gid


def serve(state: State, sock: socket.socket, service_uid: int, stop: Callable[[], bool],
          tick: Callable[[], None]) -> None:
    """Accept front connections from ``service_uid`` only (``SO_PEERCRED``) until ``stop()``;
    call ``tick()`` about twice a second (reloads, reaping)."""
    pools = {k: (concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix=k), threading.Semaphore(4 * n))
             for k, n in CLASSES.items()}
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
    checked = 0.0
    while not stop():
        tick()
        reap(state)
        untaken(state)  # (closes the kept control sockets released since)
        state.opened.sweep()
        state.confirms.sweep()
        if time.monotonic() - checked >= REVOKE_SECONDS:
            checked = time.monotonic()
            try:
                end_revoked(state)
            except Exception:  # (no thread to spare, say): never the accept loop's end; again in a second
                log.exception("checking the workers' tokens failed")
        try:
            if not select.select([sock], [], [], 0.5)[0]:
                continue
            conn, _ = sock.accept()
        except (InterruptedError, OSError):
            continue
        pid, uid, _ = peer_credentials(conn)
        if uid != service_uid or not slots.acquire(blocking=False):
            why = "too many connections to the policy process" if uid == service_uid else "connection from a uid other than the service user"
            state.audit.record("alert", peer=f"pid={pid} uid={uid}", reason=why)
            conn.close()
            continue

        served = Connection(state, conn, f"pid={pid} uid={uid}", pools)

        def run(c: Connection = served) -> None:
            try:
                c.serve()
            finally:
                slots.release()

        try:
            threading.Thread(target=run, daemon=True).start()
        except RuntimeError:  # no thread to start (the unit's TasksMax): refuse this one, serve on
            slots.release()
            conn.close()
            state.audit.record("alert", peer=f"pid={pid} uid={uid}", reason="no thread for a new connection to the policy process")
    for pool, _ in pools.values():
        pool.shutdown(wait=False, cancel_futures=True)
